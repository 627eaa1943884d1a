"""The OpenAI-compatible HTTP server over the scheduler: `create_app(engine)` (`app.py`), or
`python -m core_engine.network --model PATH` (`__main__.py`)."""

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # The app loads torch: imported when asked for, so that `python -m core_engine.network
    # --help` parses its arguments without it.
    if name == "create_app":
        from core_engine.network.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
