"""One job across several devices: N torch.distributed ranks (issue 31).

- `group`: the process group, from torchrun-style environment variables, with a timeout on
  every collective (``nccl`` on CUDA, ``gloo`` on CPU), its store on ``MASTER_ADDR`` only, and
  its teardown;
- `shard`: the trainer's policy over the ranks (FSDP2 for full weights; LoRA's base and
  adapter replicated);
- `share`: a step's samples split across the ranks, whole GRPO groups each;
- `step`: one optimizer step over the ranks, equal to the one-process step on the same batch.
"""

from core_engine.rl.ranks.group import (
    DEFAULT_TIMEOUT,
    RankInfo,
    RankSetupError,
    init_ranks,
    leave_ranks,
    rank0_decides,
    rank_from_environment,
    rank_group,
    rank_timeout,
)
from core_engine.rl.ranks.shard import distribute_policy, is_sharded
from core_engine.rl.ranks.share import rank_share
from core_engine.rl.ranks.step import clip_gradients, distributed_backward

__all__ = [
    "DEFAULT_TIMEOUT",
    "RankInfo",
    "RankSetupError",
    "clip_gradients",
    "distribute_policy",
    "distributed_backward",
    "init_ranks",
    "is_sharded",
    "leave_ranks",
    "rank0_decides",
    "rank_from_environment",
    "rank_group",
    "rank_share",
    "rank_timeout",
]
