"""Data-parallel rollouts: each rank's engine generates its share of a batch's prompts, and the
shares are gathered into the batch's rollout, the same on every rank.

- `RankSource` (`pipeline = "sync"`): a `SyncSource` whose batches are produced that way.
- `RankProducer` (`one_step`, `in_flight`): a `PrefetchSource`'s producer over ranks: each
  rank's thread generates its share one batch ahead on the rank's own engine, and the shares are
  gathered when the trainer takes the batch, on the trainer's thread (every rank takes it at
  the same point of the loop, so the gather lines up with the step's other collectives and no
  collective ever runs on a second thread).

A rank takes a contiguous run of the batch's prompts (`share.rank_share`, so a GRPO group stays
on one rank) and samples them with the seeds the whole batch would give them (the one seed rule,
`rollout.seeds.sample_seed`: single turns and every turn of an episode alike), so which rank
generated a sample does not change its seed. Each rank scores its own samples. The shares
travel as the rollout's JSON (`RolloutResult.to_json`, never pickled objects) and are joined in
rank order, each sample recording its rank (`RawRollout.ranks`); a reward failure on any rank
rejects the whole batch on every rank, naming the rank.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import torch.distributed as dist

from core_engine.rl.ranks.group import RankInfo
from core_engine.rl.ranks.share import rank_share
from core_engine.rl.rewards import RewardError
from core_engine.rl.rollout.results import RolloutResult
from core_engine.rl.rollout.runner import Produced, produce_rollout
from core_engine.rl.rollout.seeds import sample_seed
from core_engine.rl.rollout.sources import Batch, SyncSource, ThreadProducer

# RawRollout's fields that hold one value for the whole batch (the others are lists, joined)
BATCH_FIELDS = ("policy_version", "group_size", "temperature")


def prompt_share(batch: Mapping[str, Sequence[str]], rank: int, world: int) -> tuple[Batch, int]:
    """Rank `rank`'s prompts of `batch` and the index of its first one in the batch."""
    rows = list(range(len(next(iter(batch.values())))))
    mine = rank_share(rows, 1, rank, world)
    if not mine:
        raise ValueError(f"rank {rank} of {world} has no prompt in a batch of {len(rows)}")
    share = {key: [values[i] for i in mine] for key, values in batch.items()}
    return share, mine[0]


def seeded_share(
    batch: Mapping[str, Sequence[str]], seed: int, info: RankInfo, group_size: int
) -> tuple[Batch, int]:
    """This rank's prompts of `batch` and the seed that samples them as the whole batch would
    (its first sample's seed, `sample_seed`)."""
    share, first = prompt_share(batch, info.rank, info.world_size)
    return share, sample_seed(seed, first * group_size)


def join_rollouts(shares: Sequence[RolloutResult]) -> RolloutResult:
    """The ranks' rollouts (in rank order) as one: lists joined, each sample marked with its
    rank; the batch's version is its oldest share's."""
    values: dict[str, Any] = {}
    for spec in fields(RolloutResult):
        name = spec.name
        if name in BATCH_FIELDS:
            continue
        parts = [getattr(share, name) for share in shares]
        if name == "reward_components":
            values[name] = {key: [s for part in parts for s in part[key]] for key in parts[0]}
        elif name == "filtered_groups":  # a share's group indices, counted in the batch
            values[name], first = {}, 0
            for share in shares:
                values[name].update({first + g: why for g, why in share.filtered_groups.items()})
                first += share.num_samples // share.group_size
        else:
            values[name] = [item for part in parts for item in part]
    values["ranks"] = [r for r, share in enumerate(shares) for _ in range(share.num_samples)]
    first = shares[0]
    return RolloutResult(
        **values,
        policy_version=min(share.policy_version for share in shares),
        group_size=first.group_size,
        temperature=first.temperature,
    )


def gather_produced(mine: Produced, info: RankInfo) -> Produced:
    """Every rank's (rollout or reward error, is_fresh, timings), joined on every rank: the
    batch's rollout, or the first rank's error rejecting it; timings are the slowest rank's."""
    result, fresh, timings = mine
    if isinstance(result, RewardError):
        payload = {"error": str(result)}
    else:
        payload = {"rollout": result.to_json()}
    everyone: list[str | None] = [None] * info.world_size
    dist.all_gather_object(everyone, json.dumps({**payload, "timings": timings}))
    parts = [json.loads(text) for text in everyone if text is not None]
    slowest = {key: max(part["timings"].get(key, 0.0) for part in parts) for key in timings}
    for rank, part in enumerate(parts):
        if "error" in part:
            return RewardError(f"rank {rank}: {part['error']}"), fresh, slowest
    shares = [RolloutResult.from_json(part["rollout"]) for part in parts]
    return join_rollouts(shares), fresh, slowest


class RankSource(SyncSource):
    """`SyncSource` over ranks: each batch's prompts split across the ranks, each rank's engine
    generating its share (`prompt_share`), the shares gathered (`gather_produced`)."""

    def __init__(self, *args: Any, info: RankInfo, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.info = info

    def produce(self, batch: Batch, seed: int) -> Produced:
        share, share_seed = seeded_share(batch, seed, self.info, self.config.group_size)
        return gather_produced(produce_rollout(self.runner, share, share_seed), self.info)


class RankProducer:
    """A `ThreadProducer` that generates this rank's share of each batch; `take` gathers the
    ranks' shares into the batch (module docstring)."""

    def __init__(self, inner: ThreadProducer, info: RankInfo, group_size: int) -> None:
        self.inner, self.info, self.group_size = inner, info, group_size
        self.channel = inner.channel

    @property
    def busy(self) -> bool:
        return self.inner.busy

    def start(self, batch: Batch, seed: int) -> None:
        self.inner.start(*seeded_share(batch, seed, self.info, self.group_size))

    def take(self, cancelled: Callable[[], bool]) -> tuple[Produced, list[tuple[int, str]]]:
        """The batch's rollout, gathered; a cancel is never taken here (a rank that stopped
        waiting would leave the others in the gather): every rank stops at the next step."""
        mine, acks = self.inner.take(lambda: False)
        return gather_produced(mine, self.info), acks

    def close(self) -> None:
        self.inner.close()
