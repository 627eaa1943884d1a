"""Every command-line entry point parses its arguments before it imports torch: ``--help`` and
a wrong argument answer without loading it (issue 43: the CLIs' help waited for heavy imports)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(argv: list[str]) -> set[str]:
    """The modules ``python -X importtime ARGV`` imported (its stderr names each)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return {line.rpartition("|")[2].strip() for line in lines}


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "ui", "--help"],  # rlwb
        ["-m", "ui", "train", "--help"],
        ["-m", "ui", "worker", "--help"],
        ["-m", "workers", "--help"],
        ["-m", "core_engine.rl", "--help"],
        ["-m", "core_engine.rl", "train", "--help"],
        ["-m", "core_engine.network", "--help"],
        ["-m", "core_engine.demo", "--help"],
    ],
    ids=" ".join,
)
def test_help_answers_without_torch(argv):
    modules = imported_modules(argv)
    assert "argparse" in modules  # the import record is read
    assert "torch" not in modules
