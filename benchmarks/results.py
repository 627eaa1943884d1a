"""How every benchmark writes its results: one JSON file holding the results, the tables a reader
is shown (`Table`), and where and when they were measured: the commit (``-dirty`` when the tree
had changes), the machine (CPU model, cores, torch), the dates, and the load average sampled
during the run, so a number in the docs always says what it was measured on
(`benchmarks/render_docs.py` renders ``docs/benchmarks/*.json`` into the documentation).

    run = BenchmarkRun("bench_grpo")  # at the start: the clock and the load sampling start
    ...
    run.write(path, results, [Table("Step time", ["trainer", "ms"], rows)])
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOAD_SAMPLE_S = 5.0


@dataclass(frozen=True)
class Table:
    """A table as the docs show it: a title, the column names and rows of cells (text)."""

    title: str
    columns: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in self.rows]
        return "\n".join(lines)


def commit() -> str:
    """The checked-out commit, ``-dirty`` appended when tracked files differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The machine a run measures: CPU model, cores, the threads torch may use, versions."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "python": platform.python_version(),
        "system": platform.platform(),
    }
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


class BenchmarkRun:
    """One benchmark run: its start, and the 1-minute load average sampled every few seconds
    on a daemon thread until it is written."""

    def __init__(self, benchmark: str) -> None:
        self.benchmark = benchmark
        self.script = Path(sys.argv[0]).name  # the file run: one may write several benchmarks
        self.argv = sys.argv[1:]
        self.started = datetime.now(UTC)
        self.loads = [os.getloadavg()[0]]
        self._done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._done.wait(LOAD_SAMPLE_S):
            self.loads.append(os.getloadavg()[0])

    def record(self, results: Any, tables: list[Table]) -> dict[str, Any]:
        """The file's content: what, when, where, then the tables and the raw results."""
        self._done.set()
        loads = [*self.loads, os.getloadavg()[0]]
        return {
            "benchmark": self.benchmark,
            "command": " ".join(["benchmarks/" + self.script, *self.argv]),
            "commit": commit(),
            "started": self.started.isoformat(timespec="seconds"),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(time.time() - self.started.timestamp(), 1),
            "machine": machine(),
            "load_average": {
                "start": loads[0],
                "max": max(loads),
                "mean": round(sum(loads) / len(loads), 2),
                "end": loads[-1],
            },
            "tables": [asdict(table) for table in tables],
            "results": results,
        }

    def write(self, path: Path, results: Any, tables: list[Table]) -> None:
        path.write_text(json.dumps(self.record(results, tables), indent=1) + "\n")
