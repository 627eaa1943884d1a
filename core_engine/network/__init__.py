"""OpenAI-compatible HTTP server over the scheduler: `create_app(engine)`, or
`python -m core_engine.network --model PATH`."""

from core_engine.network.app import create_app

__all__ = ["create_app"]
