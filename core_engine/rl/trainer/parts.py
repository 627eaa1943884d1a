"""A trainer's parts, built in one place and in one order, so its loop (`grpo.GRPOTrainer`) is
handed finished parts: where the run resumes, the tokenizer and the longest sequence, the
memory check before anything is loaded, the trained policy (`policy.trained_policy`: weights,
adapter, optimizer, KL reference), the colocated engine, the update settings, the rollouts and
the weight channel (`weight_channel`: built here, written by the trainer alone) and the rollout
source (`rollout.sources`, `ranks.rollouts`)."""

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
from core_engine.rl.rollout.control import Heartbeat, never, rollout_timeout
from core_engine.rl.rollout.interfaces import RolloutProducer, RolloutSource
from core_engine.rl.rollout.runner import RolloutRunner
from core_engine.rl.rollout.sources import BatchPlan, PrefetchSource, SyncSource, ThreadProducer
from core_engine.rl.rollout.staleness import StalenessManager
from core_engine.rl.trainer import policy
from core_engine.rl.trainer.checkpoint import (
    latest_checkpoint,
    read_pending_rollout,
    read_trainer_state,
)
from core_engine.scheduler import InferenceScheduler
from core_engine.weight_sync import LocalChannel, ProcessChannel, WeightChannel


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
    channel: WeightChannel  # the one channel new versions are written through; the trainer's
    staleness: StalenessManager  # the one staleness rule: admission, reuse, the consume check
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
    current version (what the staleness rule admits against), `cancelled` whether a stop was
    asked (checked while the longest prompt is rendered, while a batch is awaited and, on one
    process, before each decode step: ranks stop together, between two steps)."""
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
    staleness = StalenessManager(config.max_policy_lag, config.batch_size, version)
    heartbeat = Heartbeat(cancelled if ranks is None else never)
    runner = policy.rollout_runner(config, engine, tokenizer, staleness.fresh, heartbeat)
    plan = BatchPlan(records, config.batch_size, config.seed)
    state["pending"] = read_pending_rollout(resume) if resume else None
    channel = weight_channel(config, engine, trained.model, device, ranks, cancelled)
    source = rollout_source(
        config,
        plan,
        runner,
        channel,
        engine,
        trained.model,
        max_seq_len,
        ranks,
        state,
        cancelled,
        staleness,
        heartbeat,
    )
    return TrainerParts(
        device=device,
        state=state,
        tokenizer=tokenizer,
        max_seq_len=max_seq_len,
        trained=trained,
        engine=engine,
        update_settings=policy.update_settings(config, engine),
        channel=channel,
        staleness=staleness,
        runner=runner,
        plan=plan,
        source=source,
    )


def weight_channel(
    config: GRPOConfig,
    engine: InferenceScheduler,
    model: CausalLM,
    device: torch.device,
    ranks: RankInfo | None,
    cancelled: Callable[[], bool],
) -> WeightChannel:
    """The job's one weight channel (`core_engine.weight_sync`): to a rank's engine and the
    other ranks' (`ranks.channel`), to a rollout child process over the shared weights (a
    full-weight pipelined CPU job), else to the trainer's own engine. `in_flight`: an update
    meets running sequences between two decode steps; otherwise they drain first."""
    mode = "in_flight" if config.pipeline == "in_flight" else "drain"
    if ranks is not None:
        return RankChannel(engine, model, ranks, mode)
    if config.generates_in_process(device.type):
        context = torch.multiprocessing.get_context("spawn")
        return ProcessChannel(engine, model, context, cancelled)
    return LocalChannel(engine, model, mode)


def rollout_source(
    config: GRPOConfig,
    plan: BatchPlan,
    runner: RolloutRunner,
    channel: WeightChannel,
    engine: InferenceScheduler,
    model: CausalLM,
    max_seq_len: int,
    ranks: RankInfo | None,
    state: dict[str, Any],
    cancelled: Callable[[], bool],
    staleness: StalenessManager,
    heartbeat: Heartbeat,
) -> RolloutSource:
    """Where batches come from (`rollout.sources`): on demand, or one ahead on a thread (the
    trainer's engine) or, for a full-weight CPU job on one device, a child process serving
    `channel`'s gate; on several ranks, each rank's share of every batch, gathered
    (`ranks.rollouts`)."""
    if config.pipeline == "sync" and ranks is not None:
        return RankSource(config, plan, runner, state, info=ranks)
    if config.pipeline == "sync":
        return SyncSource(config, plan, runner, state)

    def make_producer(threads: int) -> RolloutProducer:
        if isinstance(channel, ProcessChannel):
            from core_engine.rl.rollout.process import ProcessProducer

            return ProcessProducer(
                config, model, engine, channel, max_seq_len, threads, rollout_timeout(config)
            )
        thread = ThreadProducer(runner, threads, heartbeat, rollout_timeout(config))
        return thread if ranks is None else RankProducer(thread, ranks, config.group_size)

    return PrefetchSource(config, plan, make_producer, channel, state, cancelled, staleness)
