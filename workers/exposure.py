"""When the UI may be served: a non-loopback address or a public share link needs a password,
unless the operator says that address is private (``--allow-unauthenticated``)."""

LOOPBACK_NAMES = ("localhost", "::1")


def exposure_problem(
    host: str,
    auth: tuple[str, str] | None,
    share: bool = False,
    allow_unauthenticated: bool = False,
) -> str | None:
    """Why the UI may not be served as asked, or None."""
    loopback = host in LOOPBACK_NAMES or host.startswith("127.")
    if auth is not None or (not share and (loopback or allow_unauthenticated)):
        return None
    if share:
        return "refusing a public share link without a password: pass --auth USER:PASSWORD"
    return (
        f"refusing to serve the UI on {host} without a password: pass --auth USER:PASSWORD "
        "(or set RLWB_AUTH), or --allow-unauthenticated if that address is private"
    )
