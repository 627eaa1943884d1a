"""A trainer's parts, built in one place and in one order, so its loop (`grpo.GRPOTrainer`) is
handed finished parts: where the run resumes, the tokenizer and the longest sequence, the
memory check before anything is loaded, the trained policy (`policy.trained_policy`: weights,
adapter, optimizer, KL reference), the colocated engine, the update settings, the rollouts and
the rollout source with its weight channel (`rollout.sources`, `ranks.rollouts`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoTokenizer

from core_engine.engine import resolve_device
from core_engine.model import CausalLM
from core_engine.rl.config import GRPOConfig
from core_engine.rl.footprint.estimate import check_room_for, return_large_frees_to_the_os
from core_engine.rl.objective.update import UpdateSettings
from core_engine.rl.ranks import RankInfo
from core_engine.rl.ranks.channel import RankChannel
from core_engine.rl.ranks.rollouts import RankProducer, RankSource
from core_engine.rl.rollout.runner import RolloutRunner
from core_engine.rl.rollout.sources import (
    BatchPlan,
    PrefetchSource,
    RolloutSource,
    SyncSource,
    ThreadProducer,
)
from core_engine.rl.trainer import policy
from core_engine.rl.trainer.checkpoint import (
    latest_checkpoint,
    read_pending_rollout,
    read_trainer_state,
)
from core_engine.scheduler import InferenceScheduler
from core_engine.weight_sync import LocalChannel


@dataclass
class TrainerParts:
    device: torch.device
    # the checkpoint's trainer state (version, step, rejections, the source's; "pending": the
    # rollout it kept), or a fresh run's
    state: dict[str, Any]
    tokenizer: Any
    max_seq_len: int
    trained: policy.TrainedPolicy
    engine: InferenceScheduler
    update_settings: UpdateSettings
    runner: RolloutRunner
    plan: BatchPlan
    source: RolloutSource


def build_parts(
    config: GRPOConfig,
    records: list[dict[str, str]],
    ranks: RankInfo | None,
    version: Callable[[], int],
    cancelled: Callable[[], bool],
) -> TrainerParts:
    """The parts of a trainer of `config` over `records`; `version` reads the trainer's
    current version (the rollouts' staleness check), `cancelled` whether a stop was asked
    (checked while the longest prompt is rendered and while a batch is awaited)."""
    device = ranks.device if ranks else resolve_device(config.device)
    resume = latest_checkpoint(config.output_dir) if config.resume else None
    state = read_trainer_state(resume) if resume else {"version": 0, "step": 0}
    torch.manual_seed(config.seed + state["version"])
    tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True)
    max_seq_len = policy.longest_sequence(config, tokenizer, records, cancelled)
    check_room_for(config, device, config.devices)  # before anything is loaded
    return_large_frees_to_the_os()
    trained = policy.trained_policy(config, resume, device, ranks is not None)
    engine = policy.colocated_engine(
        config, trained.whole_model, tokenizer, max_seq_len, state["version"]
    )
    runner = policy.rollout_runner(config, engine, tokenizer, version, cancelled)
    plan = BatchPlan(records, config.batch_size, config.seed)
    state["pending"] = read_pending_rollout(resume) if resume else None
    source = rollout_source(
        config, plan, runner, engine, trained.model, max_seq_len, device, ranks, state, cancelled
    )
    return TrainerParts(
        device=device,
        state=state,
        tokenizer=tokenizer,
        max_seq_len=max_seq_len,
        trained=trained,
        engine=engine,
        update_settings=policy.update_settings(config, engine),
        runner=runner,
        plan=plan,
        source=source,
    )


def rollout_source(
    config: GRPOConfig,
    plan: BatchPlan,
    runner: RolloutRunner,
    engine: InferenceScheduler,
    model: CausalLM,
    max_seq_len: int,
    device: torch.device,
    ranks: RankInfo | None,
    state: dict[str, Any],
    cancelled: Callable[[], bool],
) -> RolloutSource:
    """Where batches come from (`rollout.sources`): on demand, or one ahead on a thread (the
    trainer's engine) or, for a full-weight CPU job on one device, a child process; on several
    ranks, each rank's share of every batch, gathered (`ranks.rollouts`)."""
    mode = "in_flight" if config.pipeline == "in_flight" else "drain"
    if ranks is not None:
        channel = RankChannel(engine, model, ranks, mode)
    else:
        channel = LocalChannel(engine, model, mode)
    if config.pipeline == "sync" and ranks is not None:
        return RankSource(config, plan, runner, channel, state, info=ranks)
    if config.pipeline == "sync":
        return SyncSource(config, plan, runner, channel, state)

    def make_producer(threads: int) -> Any:
        if config.generates_in_process(device.type):
            from core_engine.rl.rollout.process import ProcessProducer

            return ProcessProducer(config, model, engine, max_seq_len, threads, cancelled)
        thread = ThreadProducer(runner, channel, threads)
        return thread if ranks is None else RankProducer(thread, ranks, config.group_size)

    return PrefetchSource(config, plan, make_producer, state, cancelled)
