"""The engine's stats in the Prometheus text exposition format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Monotonic stats (exposed as `<name>_total`), with the label of their breakdown if any.
_COUNTERS = {"preemptions": None, "tokens_generated": None, "finished": "reason", "errors": "code"}


def render(stats: Mapping[str, Any], prefix: str = "rlw_engine") -> str:
    """One metric family per stat: counters for the monotonic ones, gauges for the rest."""
    lines: list[str] = []
    for key, value in sorted(stats.items()):
        if key in _COUNTERS:
            name = f"{prefix}_{key}_total"
            lines.append(f"# TYPE {name} counter")
            label = _COUNTERS[key]
            if label is None:
                lines.append(f"{name} {value}")
            else:
                lines += [f'{name}{{{label}="{k}"}} {v}' for k, v in sorted(value.items())]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            name = f"{prefix}_{key}"
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
    return "\n".join(lines) + "\n"
