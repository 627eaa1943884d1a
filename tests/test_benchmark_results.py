"""Benchmark result files (issue 43): each says the commit, the machine and the load it was
measured under, and the docs render its tables under that line, from the file alone."""

import json
import os
import subprocess
from pathlib import Path

from benchmarks.render_docs import render, render_all
from benchmarks.results import BenchmarkRun, Table

ROOT = Path(__file__).resolve().parents[1]


def test_a_result_file_records_where_and_when_and_renders_its_tables(tmp_path):
    run = BenchmarkRun("bench_example")
    table = Table("Step time", ["trainer", "ms"], [["ours", "215.1"], ["TRL", "463.5"]])
    run.write(tmp_path / "bench_example.json", {"ours_ms": 215.1}, [table])
    record = json.loads((tmp_path / "bench_example.json").read_text())
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert record["commit"].removesuffix("-dirty") == head
    cpu = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line]
    assert record["machine"]["cpu"] == cpu[0].split(":", 1)[1].strip()
    assert record["machine"]["cores"] == os.cpu_count()
    load = record["load_average"]
    assert load["start"] <= load["max"] and load["end"] <= load["max"]
    assert record["results"] == {"ours_ms": 215.1}
    text = render(tmp_path / "bench_example.json")
    assert f"at commit `{record['commit']}`" in text
    assert record["machine"]["cpu"] in text and record["started"][:10] in text
    assert "| trainer | ms |\n|---|---|\n| ours | 215.1 |\n| TRL | 463.5 |" in text
    assert render_all(tmp_path) == text


def test_the_committed_result_files_render():
    directory = ROOT / "docs" / "benchmarks"
    files = sorted(directory.glob("*.json"))
    assert files, "no committed result file"
    text = render_all(directory)
    for path in files:
        record = json.loads(path.read_text())
        assert record["commit"] in text
        script = record["command"].split()[0]
        assert (ROOT / script).is_file(), f"{path.name}: its command runs no file: {script}"
