"""Control-plane costs of a policy-version update (issue: policy versions, benchmark 6).

- acknowledgement with no cached pages: the barrier, prefix invalidation and version switch
  (`WeightUpdateAck.control_seconds`, i.e. excluding weight validation, copy and checksum);
- invalidating 2,048 cached pages;
- checksum throughput (SHA-256 over the served tensors), per GB.

Run: OMP_NUM_THREADS=1 python benchmarks/bench_control_plane.py [--json PATH]
(the docs' file: docs/benchmarks/bench_control_plane.json)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.results import BenchmarkRun, Table
from core_engine.cache import KVPool, TaskCacheManager
from core_engine.model import build_model
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.toy import tiny_config
from core_engine.weights import canonical_weights, weights_checksum


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ack_latency(repeats: int) -> list[float]:
    engine = InferenceScheduler(build_model(tiny_config("qwen2")), EngineConfig(page_size=16))
    weights = {k: v.detach().clone() for k, v in canonical_weights(engine.model).items()}
    for _ in range(20):  # warm-up
        engine.update_weights(weights, engine.version + 1)
    return [
        engine.update_weights(weights, engine.version + 1).control_seconds for _ in range(repeats)
    ]


def fill_prefix_cache(manager: TaskCacheManager, pages: int, page_size: int) -> None:
    """Publish `pages` distinct cached pages (chains of 16 pages per request)."""
    per_task = 16
    for task in range(pages // per_task):
        tokens = [task, *range(per_task * page_size - 1)]
        manager.allocate(task, tokens, 0)
        manager.free(task, tokens, version=0)


def invalidation_cost(pages: int, repeats: int) -> list[float]:
    page_size = 16
    pool = KVPool(
        num_layers=2,
        num_kv_heads=2,
        head_dim=16,
        max_requests=4,
        max_seq_len=1024,
        strategy="paged",
        page_size=page_size,
        num_pages=pages,
    )
    manager = TaskCacheManager(pool)
    times = []
    for _ in range(repeats):
        fill_prefix_cache(manager, pages, page_size)
        assert len(pool.strategy.prefix) == pages
        start = time.perf_counter()
        dropped = pool.strategy.invalidate()
        times.append(time.perf_counter() - start)
        assert dropped == pages
    return times


def checksum_rate(megabytes: int) -> float:
    count = megabytes * 2**20 // 4 // 16
    weights = {f"w{i}": torch.randn(count) for i in range(16)}
    weights_checksum(weights)
    start = time.perf_counter()
    weights_checksum(weights)
    return megabytes / 1024 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=1000)
    parser.add_argument("--json", type=Path, help="write the results here (benchmarks.results)")
    args = parser.parse_args()
    run = BenchmarkRun("bench_control_plane")
    torch.set_num_threads(1)
    ack = ack_latency(args.repeats)
    inval = invalidation_cost(2048, max(5, args.repeats // 100))
    rate = checksum_rate(512)
    table = Table(
        "Policy-version control plane",
        ["measurement", "median", "p99", "target"],
        [
            [
                "acknowledgement with no cached pages (barrier + invalidation + version switch)",
                f"{statistics.median(ack) * 1e6:.2f} us",
                f"{percentile(ack, 0.99) * 1e6:.2f} us",
                "<= 5 us",
            ],
            [
                "invalidating 2,048 cached pages",
                f"{statistics.median(inval) * 1e3:.3f} ms",
                f"{percentile(inval, 0.99) * 1e3:.3f} ms",
                "<= 2.5 ms",
            ],
            ["checksum (SHA-256 of the served tensors)", f"{1 / rate:.2f} s per GB", "", ""],
        ],
    )
    print(f"torch threads {torch.get_num_threads()}")
    print(table.markdown())
    if args.json:
        results = {"ack_s": ack, "invalidate_2048_s": inval, "checksum_gb_per_s": rate}
        run.write(args.json, results, [table])


if __name__ == "__main__":
    main()
