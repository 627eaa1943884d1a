"""A request's stream of uniform random numbers, the one source of its sampled tokens.

The stream is exactly what one `torch.rand((), dtype=torch.float64, generator=g)` per sampled
token gives from the request's seeded generator `g`. On a CPU the numbers are drawn `CHUNK` at a
time: the CPU kernel fills a tensor serially, one generator call per element in order
(`uniform_kernel` in ATen's `cpu/DistributionTemplates.h`), so `torch.rand(n)` is the next `n`
one-at-a-time draws and one call replaces `CHUNK` calls of a few microseconds each. Other
devices' generators (Philox offsets per launch) give no such identity: there the stream stays
one draw per token, on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

CHUNK = 64


class Uniforms:
    """One request's uniforms in [0, 1), in float64, from its own seeded generator."""

    def __init__(self, seed: int, device: torch.device | str = "cpu") -> None:
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._chunk: list[float] = []
        self._taken = 0

    def take(self) -> float:
        """The next uniform of a CPU stream."""
        if self._taken == len(self._chunk):
            self._chunk = torch.rand(CHUNK, generator=self.generator, dtype=torch.float64).tolist()
            self._taken = 0
        self._taken += 1
        return self._chunk[self._taken - 1]


def take_each(streams: Sequence[Uniforms], device: torch.device) -> torch.Tensor:
    """The next uniform of each stream, as a float64 tensor [len(streams)] on `device`."""
    if device.type == "cpu":
        return torch.tensor([s.take() for s in streams], dtype=torch.float64)
    return torch.stack(
        [torch.rand((), dtype=torch.float64, device=device, generator=s.generator) for s in streams]
    )
