"""`/health` latency of the OpenAI-compatible server under the heaviest requests its limits let
in (issue 24, item 2; moved here from the test suite by issue 32: a test asserts behaviour,
here the speed is measured and printed).

The mix is the test's (`tests/core_engine/test_server_latency.py`): 2 MiB prompts, 64 prompts
at the character limit, 65,000 chat messages, streams with the most and the longest stop
strings, and the log-probs of 64 samples. While it is served, `/health` is polled every 10 ms;
the goal is a 95th percentile under 100 ms. Measured on a quiet 2-core machine: p95 7-13 ms,
max 23-87 ms (before the fix: max 3.8 s). A machine busy with other work (load average ~10)
stretched the max to 400 ms: the loop is not blocked then, the process waits for a CPU.

Run: OMP_NUM_THREADS=1 python benchmarks/bench_server_latency.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from core_engine.engine import load_engine
from core_engine.network import create_app
from core_engine.scheduler import EngineConfig
from core_engine.toy import save_tiny_checkpoint
from tests.core_engine.http_server import running_server
from tests.core_engine.test_server_latency import (
    CONTEXT,
    LIMITS,
    MODEL,
    heavy_requests,
    send,
    stop_strings,
)

P95_GOAL_S = 0.100
POLL_INTERVAL_S = 0.01


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def health_latencies(url: str) -> list[float]:
    """Seconds per `/health` answer while the heavy mix is served (one round)."""
    requests = heavy_requests(stop_strings(url))
    threads = [
        threading.Thread(target=send, args=(url, path, body)) for path, body in requests.values()
    ]
    latencies = []
    with httpx.Client(base_url=url, timeout=600) as client:
        assert client.get("/health").status_code == 200
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(POLL_INTERVAL_S)
    for thread in threads:
        thread.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="times the mix is served")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = save_tiny_checkpoint(Path(folder) / "tiny", max_position_embeddings=CONTEXT)
        engine = load_engine(path, EngineConfig(max_batch_size=256, kv_cache_bytes=64 << 20))
        with running_server(create_app(engine, MODEL, limits=LIMITS)) as url:
            rounds = [health_latencies(url) for _ in range(args.rounds)]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| round | polls | median | p95 | max | p95 goal |")
    print("|---|---|---|---|---|---|")
    for index, latencies in enumerate([*rounds, [x for r in rounds for x in r]]):
        name = str(index + 1) if index < len(rounds) else "all"
        p95 = percentile(latencies, 0.95)
        print(
            f"| {name} | {len(latencies)} | {statistics.median(latencies) * 1e3:.1f} ms | "
            f"{p95 * 1e3:.1f} ms | {max(latencies) * 1e3:.1f} ms | "
            f"{'met' if p95 < P95_GOAL_S else 'missed'} (< {P95_GOAL_S * 1e3:.0f} ms) |"
        )


if __name__ == "__main__":
    main()
