"""The Runs view at its stated size on PostgreSQL: 60 runs x 1,000 versions.

Bulk-loads ``--runs`` finished train jobs (a grid of learning rates x seeds) of ``--versions``
versions each into a fresh PostgreSQL schema (dropped afterwards): every version with the
trainer's named metrics and ~20 extra ones (a held-out score every 10 versions) and its sample
totals per finish reason. Then times the view's query + aggregation path
(`ui.handlers.runs.build_view`: the metric read across all jobs at every version, each run's
final held-out score from its newest versions, the tokens, grouping into points, the bootstrap
bands, the tables) and, apart, the SVG drawn from it: warm, median of ``--repeats``. Target:
the view within 1 s.

    .venv/bin/python benchmarks/bench_runs_view.py [--json docs/benchmarks/bench_runs_view.json]
    .venv/bin/python benchmarks/bench_runs_view.py --runs 2 --versions 1000

Wall times stretch with the machine's other work (the result file records the load average);
the CPU time of this process, beside each, does not count the database server's work.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.results import BenchmarkRun, Table
from db import METRIC_TYPES, Repository, upgrade
from db.models import Job, PolicyVersion, VersionSampleStats
from ui.handlers.runs import build_view
from ui.run_plot import curves_svg
from ui.services import Services

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
EXTRA_METRICS = 20
HELDOUT_EVERY = 10
TARGET_S = 1.0


def _unused(*args: object) -> dict:
    raise RuntimeError("the benchmark queues nothing")


def _load(engine: sa.Engine, runs: int, versions: int, seeds: int) -> list[int]:
    """``runs`` finished train jobs of ``versions`` versions each, inserted in bulk."""
    rng = random.Random(0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    jobs = [
        {
            "kind": "train",
            "status": "succeeded",
            "config": {
                "model": "demo",
                "task": "addition",
                "steps": versions - 1,
                "lr": 10.0 ** -(3 + run // seeds),
                "seed": run % seeds,
            },
            "step": versions - 1,
            "total_steps": versions - 1,
            "current_version": versions - 1,
            "started_at": start,
            "finished_at": start + timedelta(seconds=2 * versions),
        }
        for run in range(runs)
    ]
    with engine.begin() as connection:
        ids = list(connection.execute(sa.insert(Job).returning(Job.id), jobs).scalars())
        for job_id in ids:
            rows, stats = [], []
            for version in range(versions):
                extra = {f"metric_{k}": rng.random() for k in range(EXTRA_METRICS)}
                if version % HELDOUT_EVERY == 0 or version == versions - 1:
                    extra["heldout_accuracy"] = rng.random()
                named = {name: rng.random() for name, kind in METRIC_TYPES.items() if kind is float}
                rows.append(
                    {
                        "job_id": job_id,
                        "version": version,
                        "parent_version": version - 1 if version else None,
                        "extra_metrics": extra,
                        "created_at": start + timedelta(seconds=2 * version),
                        **named,
                    }
                )
                for finish in ("stop", "length"):
                    stats.append(
                        {
                            "job_id": job_id,
                            "policy_version": version,
                            "finish_reason": finish,
                            "samples": 32,
                            "rewarded": 32,
                            "reward_sum": 16.0,
                            "response_tokens": rng.randint(500, 2000),
                        }
                    )
            connection.execute(sa.insert(PolicyVersion), rows)
            connection.execute(sa.insert(VersionSampleStats), stats)
        connection.exec_driver_sql("ANALYZE")
    return ids


def _timed(call, repeats: int) -> tuple[float, float, object]:
    """Median wall and CPU (this process's) seconds of ``repeats`` warm calls (one warm-up
    first), and the last result."""
    result = call()
    walls, cpus = [], []
    for _ in range(repeats):
        began, cpu = time.perf_counter(), time.process_time()
        result = call()
        walls.append(time.perf_counter() - began)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_POSTGRES_URL, help="PostgreSQL database")
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3, help="runs per point")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here (benchmarks.results)")
    args = parser.parse_args()
    run = BenchmarkRun("bench_runs_view")
    results: list[dict] = []

    admin = sa.create_engine(args.url)
    schema = f"rlwb_bench_{secrets.token_hex(6)}"
    with admin.begin() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    url = sa.make_url(args.url).update_query_dict({"options": f"-csearch_path={schema}"})
    repo = None
    try:
        upgrade(url)
        repo = Repository.from_url(url)
        began = time.perf_counter()
        ids = _load(repo.engine, args.runs, args.versions, args.seeds)
        loaded = time.perf_counter() - began
        print(f"loaded {args.runs} runs x {args.versions} versions in {loaded:.1f} s")
        services = Services(repo, *([_unused] * 8))
        for metric, axis, smoothing in (
            ("reward_mean", "version", 0.6),
            ("metric_3", "tokens", 0.0),
            ("heldout_accuracy", "wall time", 0.0),
        ):
            seconds, cpu, view = _timed(
                lambda m=metric, a=axis, s=smoothing: build_view(services, ids, m, a, s),
                args.repeats,
            )
            draw_s, _, _ = _timed(
                lambda v=view: curves_svg(v.curves, v.x_title, v.y_title, v.note), args.repeats
            )
            verdict = "within" if seconds + draw_s <= TARGET_S else "OVER"
            results.append(
                {
                    "metric": metric,
                    "x_axis": axis,
                    "smoothing": smoothing,
                    "view_ms": round(1000 * seconds, 1),
                    "view_cpu_ms": round(1000 * cpu, 1),
                    "svg_ms": round(1000 * draw_s, 1),
                    "points": len(view.curves),
                    "runs": len(view.runs),
                }
            )
            print(
                f"{metric:>16} vs {axis:<9}: query + aggregation {1000 * seconds:5.0f} ms "
                f"(this process's CPU {1000 * cpu:4.0f} ms), "
                f"SVG {1000 * draw_s:4.0f} ms ({len(view.curves)} points, {len(view.runs)} runs) "
                f"-> {verdict} the {TARGET_S:g} s target"
            )
        names_s, _, _ = _timed(lambda: repo.run_metric_names(ids), args.repeats)
        print(f"metric names of the selection: {1000 * names_s:.0f} ms")
        # a shared machine's other work stretches the times: say how busy it was
        print(f"load average (1 min) on {os.cpu_count()} CPUs: {os.getloadavg()[0]:.1f}")
        if args.json:
            rows = [
                [
                    f"{r['metric']} vs {r['x_axis']} (smoothing {r['smoothing']:g})",
                    f"{r['view_ms']:.0f}",
                    f"{r['view_cpu_ms']:.0f}",
                    f"{r['svg_ms']:.0f}",
                ]
                for r in results
            ]
            title = (
                f"Runs view, {args.runs} runs x {args.versions} versions on PostgreSQL "
                f"({args.seeds} seeds per point; target: within {TARGET_S:g} s)"
            )
            columns = ["view", "query + aggregation ms", "its CPU ms", "SVG ms"]
            run.write(
                args.json,
                {"views": results, "metric_names_ms": 1000 * names_s},
                [Table(title, columns, rows)],
            )
    finally:
        if repo is not None:
            repo.close()
        with admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


if __name__ == "__main__":
    main()
