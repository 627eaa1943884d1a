"""The demo recipe that the trainer benchmarks share, and TRL's `GRPOTrainer` set up on it.

Recipe (the RL notes' appendix, `grpo_demo.py`): 3-digit addition from the shipped demo policy,
16 prompts x G=8, lr 3e-4 (constant), temperature 1.0, clip 0.2, no KL, at most 6 completion
tokens, AdamW without weight decay, gradients clipped to norm 1, fp32 on the CPU.

The objective on TRL's side (read from TRL 1.16's `grpo_trainer.py`): `loss_type="dapo"` sums
the clipped per-token losses over the whole generation batch and divides by its completion
tokens, which is our token mean over the step when our side trains every group
(`drop_zero_variance_groups=False`: a group whose rewards agree has advantage 0 on both sides
but its tokens count in both denominators). `scale_rewards="group"` divides by the group's
standard deviation as ours does; TRL's is Bessel-corrected (`nanstd`) plus 1e-4, ours the
population's plus 1e-6, so TRL's advantages are ours times sqrt((G-1)/G) = 0.935 at G=8, a
constant factor that AdamW's update all but cancels (it is scale-invariant up to its epsilon).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from core_engine.rl.rewards import exact_match

PROMPTS, GROUP, LR, TEMPERATURE, CLIP, MAX_TOKENS = 16, 8, 3e-4, 1.0, 0.2, 6
TRL_LOSS_TYPE, TRL_SCALE_REWARDS = "dapo", "group"


def trl_missing() -> str | None:
    """Why TRL's GRPOTrainer cannot run here, or None."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        return f"TRL is not installed ({exc}); install the `bench` extra in a separate venv"
    return None


def trl_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """Exact match against the dataset's `answer` column (TRL passes columns as kwargs)."""
    return exact_match(completions, answer, None)


class StepClock(TrainerCallback):
    """Times each TRL optimizer step (generation, reward and update: all of it), then runs
    `between()` outside the timed span."""

    def __init__(self, between: Callable[[], None]) -> None:
        self.between = between
        self.step_s: list[float] = []
        self._begin = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_s.append(time.perf_counter() - self._begin)
        self.between()


def trl_trainer(policy: Path, records: list[dict], run_dir: Path, seed: int, max_steps: int):
    """TRL's GRPOTrainer on the same checkpoint, data, hyper-parameters and objective as ours."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    config = TRLConfig(
        output_dir=str(run_dir),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        learning_rate=LR,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=TEMPERATURE,
        beta=0.0,
        epsilon=CLIP,
        loss_type=TRL_LOSS_TYPE,
        scale_rewards=TRL_SCALE_REWARDS,
        max_steps=max_steps,
        logging_strategy="no",
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        # TRL's default is True (memory for large models); ours keeps activations at this size,
        # so TRL does too: a recompute would be work ours does not do
        gradient_checkpointing=False,
        seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_list([{"prompt": r["input"], "answer": r["output"]} for r in records])
    return TRLTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32),
        reward_funcs=trl_reward,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(policy),
    )
