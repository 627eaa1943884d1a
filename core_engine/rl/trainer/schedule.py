"""The learning rate over a job's optimizer steps (TRL's `lr_scheduler_type` / `warmup_ratio`),
by transformers' schedules. `constant` without warm-up is no schedule at all: the optimizer's
rate stays `lr` (today's). `constant` with warm-up is transformers' `constant_with_warmup`
(transformers' `constant` would ignore the warm-up). Warm-up steps: ceil(warmup_ratio x
steps), as transformers' `TrainingArguments.get_warmup_steps`.

The schedule advances with every optimizer step (a hook on the optimizer's step: the training
loop never names it). Its position is the trainer's optimizer step, which the checkpoint keeps:
a resumed run builds the schedule at that step (`last_epoch`), so its rates continue exactly."""

from __future__ import annotations

import math

import torch
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from core_engine.rl.config import GRPOConfig


def lr_schedule(
    config: GRPOConfig, optimizer: torch.optim.Optimizer, step: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The schedule of `config` over `optimizer`, positioned at optimizer step `step` (the
    rate its next step uses) and stepped by it, or None when the rate is constant."""
    warmup = math.ceil(config.warmup_ratio * config.steps)
    if config.lr_scheduler_type == "constant" and not warmup:
        return None
    for group in optimizer.param_groups:  # the base rate, whatever a resumed state holds
        group["initial_lr"] = config.lr
    last = step - 1
    if config.lr_scheduler_type == "constant":
        schedule = get_constant_schedule_with_warmup(optimizer, warmup, last_epoch=last)
    else:
        build = {
            "linear": get_linear_schedule_with_warmup,
            "cosine": get_cosine_schedule_with_warmup,
        }
        schedule = build[config.lr_scheduler_type](optimizer, warmup, config.steps, last_epoch=last)
    optimizer.register_step_post_hook(lambda *_: schedule.step())
    return schedule
