"""What the operator registered on a worker (rewards, environments): names mapped to a
``module:attribute`` target by an entry-point group and an environment variable, read here and
never imported here (a sandbox child imports them, within `limit_address_space`)."""

from __future__ import annotations

import os
import re
import resource
from importlib.metadata import entry_points

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def registered(group: str, variable: str) -> dict[str, str]:
    """name -> ``module:attribute`` from the entry points of `group` and ``name=target,...``
    in the environment variable `variable` (which wins)."""
    found = {ep.name: ep.value for ep in entry_points(group=group)}
    for item in os.environ.get(variable, "").split(","):
        name, sep, target = (part.strip() for part in item.partition("="))
        if sep and NAME.fullmatch(name) and ":" in target:
            found[name] = target
    return found


def limit_address_space(memory_bytes: int) -> None:
    """In a sandbox child, before it imports what the operator registered: at most
    ``memory_bytes`` of address space (``RLIMIT_AS``, never above the hard limit inherited),
    so an allocation past it fails in the child, never in the worker."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
