"""A step's samples split across ranks: whole GRPO groups, in order, as even as can be.

Advantages are computed on the whole batch before the split (`objective.advantages`,
per group), so a sample trains the same on any rank; a group never straddles two ranks. Rank r
takes a contiguous run of groups, the first ranks one more when they do not divide evenly, so
the ranks' shares concatenated in rank order are the batch again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Sample = TypeVar("Sample")


def rank_share(
    samples: Sequence[Sample], group_size: int, rank: int, world_size: int
) -> list[Sample]:
    """Rank `rank`'s share of `samples` (whole groups of `group_size`, in order); empty when
    there are fewer groups than ranks."""
    if group_size < 1 or len(samples) % group_size:
        raise ValueError(f"{len(samples)} samples are not whole groups of {group_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"no rank {rank} in a world of {world_size}")
    per_rank, extra = divmod(len(samples) // group_size, world_size)
    first = rank * per_rank + min(rank, extra)
    count = per_rank + (rank < extra)
    return list(samples[first * group_size : (first + count) * group_size])
