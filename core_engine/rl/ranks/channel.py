"""The weight channel of a rank: its engine gets each new version, and every rank must
acknowledge the same version with the same checksum.

With LoRA the engine serves the trainer's own modules (the adapter is replicated), as a
`LocalChannel`. With FSDP2 the trainer holds 1/N of each weight, so the engine has a full copy
of its own: after the optimizer step each decoder layer, then the root, is gathered (one
FSDP2 unit at a time, never a second full copy) straight into the engine's tensors, then the
engine serves them as the new version. Then the ranks compare their acknowledgements: a rank
whose engine serves other weights fails the step on every rank, naming it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from core_engine.rl.ranks.group import RankInfo
from core_engine.rl.ranks.shard import is_sharded
from core_engine.weight_sync import LocalChannel, WeightSyncError


class RankChannel(LocalChannel):
    """`LocalChannel` for one rank of a job: FSDP2's shards gathered into the engine's copy, and
    the ranks' acknowledgements compared."""

    def __init__(
        self, engine: Any, trainer_model: torch.nn.Module, info: RankInfo, mode: str = "drain"
    ) -> None:
        self.trainer_model = trainer_model
        self.sharded = is_sharded(trainer_model)
        super().__init__(engine, engine.model if self.sharded else trainer_model, mode)
        self.info = info

    @contextlib.contextmanager
    def writing(self, version: int) -> Iterator[None]:
        """The step, then (FSDP2) the gather into the engine, all while no engine step runs
        (a pipelined rank's producer waits at its next step); then the ranks' agreement."""
        with super().writing(version):
            yield
            if self.sharded:
                gather_weights(self.trainer_model, self.engine.model)
        self.check_ranks_agree(version)

    def check_ranks_agree(self, version: int) -> None:
        """Every rank's engine acknowledged `version` with rank 0's checksum."""
        everyone: list[tuple[int, str] | None] = [None] * self.info.world_size
        dist.all_gather_object(everyone, (version, self.digests[version]))
        expected = everyone[0]
        for rank, ack in enumerate(everyone):
            if ack != expected:
                raise WeightSyncError(
                    f"weight sync failed: rank {rank} acknowledged {_named(ack)}, rank 0 "
                    f"{_named(expected)}"
                )


def gather_weights(sharded: torch.nn.Module, engine_model: torch.nn.Module) -> None:
    """Copy every weight of the FSDP2 `sharded` model into the same-named tensor of the
    engine's `engine_model` (in its dtype), one FSDP2 unit (a decoder layer, then the root) at
    a time: one all-gather each, every rank in the same order."""
    targets = dict(engine_model.named_parameters())
    copied: set[str] = set()
    with torch.no_grad():
        for prefix, unit in sharded.named_modules():
            if not isinstance(unit, FSDPModule):
                continue
            unit.unshard()
            try:
                for name, param in unit.named_parameters(prefix=prefix):
                    if not isinstance(param, DTensor):  # a nested unit's stays sharded
                        name = name.removeprefix(".")
                        targets[name].copy_(param)
                        copied.add(name)
            finally:
                unit.reshard()
    if missing := sorted(set(targets) - copied):
        raise WeightSyncError(f"weight sync failed: {missing[:3]} not gathered")


def _named(ack: tuple[int, str] | None) -> str:
    if ack is None:
        return "nothing"
    return f"version {ack[0]} with checksum {ack[1][:12]}"
