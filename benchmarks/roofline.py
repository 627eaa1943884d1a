"""Machine roofline: memory read bandwidth and fp32 SGEMM throughput at the current thread count.

Decode is bounded by `tok/s <= min(BW * B / W, FLOPS / (2 * N_params))` (engine notes §9.1);
both numbers are measured here with torch, at whatever `torch.get_num_threads()` is set to.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Roofline:
    bandwidth_gbs: float  # read bandwidth, GB/s (1e9 bytes)
    gflops: float  # fp32 matmul, GFLOP/s
    threads: int

    def tokens_per_s(self, batch: int, weight_bytes: float, num_params: float) -> float:
        """Decode ceiling for `batch` sequences: weight reads or matmul flops, whichever binds."""
        memory_bound = self.bandwidth_gbs * 1e9 * batch / weight_bytes
        compute_bound = self.gflops * 1e9 / (2 * num_params)
        return min(memory_bound, compute_bound)


def _best_seconds(fn, repeats: int) -> float:
    """The fastest of `repeats` timed calls after one warm-up: a ceiling is the best the
    machine did, and other load only ever slows a call down."""
    fn()  # warm-up: page faults, allocator, kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def read_bandwidth_gbs(num_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """GB/s of `x.sum()` over a fp32 tensor of `num_bytes` (far larger than any cache)."""
    x = torch.ones(num_bytes // 4, dtype=torch.float32)
    seconds = _best_seconds(x.sum, repeats)
    return x.numel() * 4 / seconds / 1e9


def sgemm_gflops(n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of an n x n x n fp32 matmul."""
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    out = torch.empty(n, n)
    seconds = _best_seconds(lambda: torch.mm(a, b, out=out), repeats)
    return 2 * n**3 / seconds / 1e9


def measure(quick: bool = False) -> Roofline:
    """Both numbers at the current torch thread count (smaller probes when `quick`)."""
    num_bytes, n = ((256 << 20), 1024) if quick else ((1 << 30), 2048)
    return Roofline(
        bandwidth_gbs=read_bandwidth_gbs(num_bytes),
        gflops=sgemm_gflops(n),
        threads=torch.get_num_threads(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(asdict(measure(args.quick)))


if __name__ == "__main__":
    main()
