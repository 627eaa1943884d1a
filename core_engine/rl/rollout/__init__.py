"""Rollouts from our engine: prompts -> groups of samples stamped with the policy versions
that sampled them.

- `results`: `RawRollout`, `RolloutResult` (what a rollout is)
- `generator`: `RolloutGenerator` (a batch's samples from the engine)
- `staleness`: the admission rule (how far a rollout may lag the trainer)
- `runner`: `RolloutRunner` (a batch's scored rollout, `(result, is_fresh)`), `produce_rollout`
- `sources`, `process`, `dynamic`, `seeds`: what feeds the trainer's loop
- `control`: what a batch in production is asked (stop) and watched by (progress)
"""

from core_engine.rl.rollout.generator import RolloutGenerator
from core_engine.rl.rollout.results import RawRollout, RolloutResult
from core_engine.rl.rollout.runner import RolloutRunner

__all__ = ["RawRollout", "RolloutGenerator", "RolloutResult", "RolloutRunner"]
