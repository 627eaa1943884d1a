"""Render benchmark result files (`benchmarks.results`, ``docs/benchmarks/*.json``) as Markdown:
each file's tables under a line saying which benchmark, command, commit, machine, load and date
measured them. The docs' MkDocs hook (``docs/hooks/generate.py``) calls `render_all` at every
build; run this file to print the same text.

    python benchmarks/render_docs.py [docs/benchmarks]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def provenance(result: dict[str, Any]) -> str:
    """Where and when a result file was measured, in one sentence."""
    machine, load = result["machine"], result["load_average"]
    torch = f", torch {machine['torch']}" if "torch" in machine else ""
    threads = machine.get("torch_threads")
    threads_text = f", {threads} torch thread{'s' if threads != 1 else ''}" if threads else ""
    return (
        f"Measured {result['started'][:10]} ({result['seconds']:.0f} s) at commit "
        f"`{result['commit']}` by `{result['command']}` on {machine['cpu']} "
        f"({machine['cores']} cores{threads_text}{torch}); 1-minute load average "
        f"{load['start']:.1f} at the start, {load['max']:.1f} at most, "
        f"{load['end']:.1f} at the end."
    )


def table_markdown(table: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(table["columns"]) + " |", "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def render(path: Path) -> str:
    """One result file's section: a heading, its provenance, its tables."""
    result = json.loads(path.read_text())
    parts = [f"### `{result['benchmark']}` ({path.name})", provenance(result)]
    for table in result["tables"]:
        parts += [f"**{table['title']}**", table_markdown(table)]
    return "\n\n".join(parts)


def render_all(directory: Path = DEFAULT_DIR) -> str:
    """Every result file of ``directory``, in file-name order."""
    files = sorted(directory.glob("*.json"))
    if not files:
        return "No result files are committed yet."
    return "\n\n".join(render(path) for path in files)


if __name__ == "__main__":
    print(render_all(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
