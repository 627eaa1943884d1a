"""The policy a trainer works on, built in one place: its weights, adapter, colocated engine,
rollouts, KL reference and the update settings that follow from the engine's dtype.

What the trainer trains: every weight in fp32 (full), or a LoRA adapter in fp32 over a frozen
base in the engine's dtype (bf16 on CUDA), which the colocated engine serves as it is: one copy
of the base in the worker, shared by the trainer and the engine. Loading the policy at start or
resume (with LoRA, the base's checksum is computed once per run and must equal the one the
checkpoint recorded). The optimizer takes the parameters that require gradients: with LoRA the
adapter's alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core_engine.adapters import add_adapter, base_checksum, base_view, read_adapter
from core_engine.engine import load_engine, resolve_dtype
from core_engine.model import CausalLM, load_model
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data import longest_prompt
from core_engine.rl.data.tasks import default_reward
from core_engine.rl.objective.loss import Importance
from core_engine.rl.objective.settings import Objective
from core_engine.rl.objective.update import UpdateSettings
from core_engine.rl.ranks import distribute_policy, is_sharded
from core_engine.rl.ranks.state import (
    is_sharded_checkpoint,
    load_optimizer_shards,
    load_sharded_model,
)
from core_engine.rl.rewards.mix import RewardMix
from core_engine.rl.rollout.control import never
from core_engine.rl.rollout.generator import RolloutGenerator
from core_engine.rl.rollout.runner import RolloutRunner
from core_engine.rl.trainer.checkpoint import load_optimizer_state, read_trainer_state
from core_engine.rl.trainer.optimizer import build_optimizer
from core_engine.rl.trainer.schedule import lr_schedule
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.task import SamplingParams


class BaseChangedError(ValueError):
    """A LoRA run's base checkpoint is not the one its checkpoints were trained on."""


@dataclass
class TrainedPolicy:
    """What a trainer trains: `model` (sharded by FSDP2 on several ranks), `whole_model` (the
    policy with all its weights in this process: `model` itself, or the engine's copy beside
    an FSDP2 shard), the optimizer, the KL reference and a LoRA base's checksum."""

    model: CausalLM
    whole_model: CausalLM
    optimizer: torch.optim.Optimizer
    reference: CausalLM | None
    base_checksum: str | None


def trained_policy(
    config: GRPOConfig, resume: Path | None, device: torch.device, on_ranks: bool
) -> TrainedPolicy:
    """The policy and its optimizer, from `config.model` or the checkpoint `resume` (its
    optimizer state and learning-rate schedule's step too); `on_ranks`: laid out over the
    job's ranks (`ranks.shard`), with full weights sharded each rank loading its shard alone
    (`ranks.state`)."""
    if on_ranks and config.shards_weights:
        model, checksum = load_sharded_model(resume or config.model, device), None
        reference = None
        if config.kl_coef:
            reference = load_sharded_model(config.model, device).requires_grad_(False)
        engine_dtype = resolve_dtype(config.engine_dtype, device)
        whole = load_model(resume or config.model, engine_dtype, device).eval()  # the engine's
    else:
        model, checksum = load_policy(config, resume, device)
        reference = kl_reference(config, model, device)
        whole = distribute_policy(model, shard=False) if on_ranks else model
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter
    optimizer = build_optimizer(
        trainable, config.lr, config.weight_decay, config.optimizer_state_dtype
    )
    if resume and (is_sharded(model) or is_sharded_checkpoint(resume)):  # each its shard
        groups = read_trainer_state(resume)["optimizer"]["param_groups"]
        load_optimizer_shards(optimizer, resume, groups)
    elif resume:
        load_optimizer_state(optimizer, resume)
    lr_schedule(config, optimizer, read_trainer_state(resume)["step"] if resume else 0)
    return TrainedPolicy(model, whole, optimizer, reference, checksum)


def load_policy(
    config: GRPOConfig, resume: Path | None, device: torch.device
) -> tuple[CausalLM, str | None]:
    """The policy, from `config.model` or the checkpoint `resume`, in eval mode (the trainer
    switches to training mode for its own forwards only: the engine serves the same modules);
    with LoRA also the base's checksum (`core_engine.adapters.base_checksum`), else None."""
    if config.lora is None:
        return load_model(resume or config.model, torch.float32, device), None
    model = load_model(config.model, resolve_dtype(config.engine_dtype, device), device)
    checksum = base_checksum(model)
    if resume is not None:
        recorded = read_trainer_state(resume).get("base_checksum")
        if recorded != checksum:
            raise BaseChangedError(
                f"the base {config.model} has checksum {checksum[:12]}, but {resume} was trained "
                f"on {str(recorded)[:12]}: resume with the base the run started from"
            )
    add_adapter(model, config.lora)
    if resume is not None:
        read_adapter(model, resume)
    return model.eval(), checksum  # PEFT's new modules start in training mode


def kl_reference(config: GRPOConfig, model: CausalLM, device: torch.device) -> CausalLM | None:
    """The KL anchor, the starting policy (also when resuming): with LoRA a module tree of its
    own over the policy's frozen base tensors (`base_view`: B starts at zero, so the base is
    the starting policy; the served modules are never switched); else a second fp32 copy of
    `config.model` (on sharded ranks, sharded as the policy: `trained_policy`)."""
    if not config.kl_coef:
        return None
    if config.lora is not None:
        return base_view(model)
    return load_model(config.model, torch.float32, device).eval()


# The engine shares the device with the trainer's weights, gradients and optimizer state
# (allocated at the first step, after the engine is sized): TRL's colocation default.
COLOCATED_GPU_MEMORY_UTILIZATION = 0.3


def colocated_engine(
    config: GRPOConfig, model: CausalLM, tokenizer: Any, max_seq_len: int, version: int
) -> InferenceScheduler:
    """The engine that generates the job's rollouts: sized for the job (`max_seq_len` is its
    longest prompt + `max_tokens`), serving `model` itself when the dtypes match."""
    return load_engine(
        model,
        EngineConfig(
            max_batch_size=config.engine_batch_size,
            max_seq_len=max_seq_len,
            kv_strategy=config.kv_strategy,
            kv_cache_bytes=config.kv_cache_bytes,
            gpu_memory_utilization=config.gpu_memory_utilization
            or COLOCATED_GPU_MEMORY_UTILIZATION,
        ),
        tokenizer=tokenizer,
        checkpoint=config.model,
        device=model.lm_head.weight.device,
        dtype=config.engine_dtype,
        policy_version=version,
    )


def longest_sequence(
    config: GRPOConfig,
    tokenizer: Any,
    records: list[dict[str, str]],
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """The longest sample a job can make (sizes its engine and micro-batches): its longest
    prompt + `max_tokens`, or an episode's `max_episode_tokens`. Every prompt is rendered in
    the bounded child of `core_engine.rl.template_sandbox` (`RenderCancelled` once
    ``cancelled()``), so the job renders in process only what rendered there within bounds."""
    longest = config.max_episode_tokens
    if config.environment is None:
        longest = longest_prompt(tokenizer, records, cancelled) + config.max_tokens
    if longest > config.max_tokens_per_micro_batch:
        raise ValueError(
            f"max_tokens_per_micro_batch={config.max_tokens_per_micro_batch} cannot hold "
            f"the longest sample: prompt + max_tokens = {longest} tokens"
        )
    return longest


def rollout_runner(
    config: GRPOConfig,
    engine: InferenceScheduler,
    tokenizer: Any,
    reusable: Callable[[int], bool] | None = None,
    cancelled: Callable[[], bool] = never,
) -> RolloutRunner:
    """The job's rollouts: its sampling settings, group size and rewards, generated by
    `engine` (in flight: updates may land during a batch). A batch's rollout is reused only by
    the further updates of that batch, while `reusable` (the staleness rule) admits its
    version; a batch ends at its next decode step once `cancelled` (`rollout.control`)."""
    params = SamplingParams(
        temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens
    )
    in_flight = config.pipeline == "in_flight"
    if config.environment is not None:  # multi-turn episodes, scored by their environment
        from core_engine.rl.episodes.env_sandbox import EnvironmentSession
        from core_engine.rl.episodes.runner import EpisodeGenerator, EpisodeLimits

        session = EnvironmentSession(config.environment)
        limits = EpisodeLimits(config.max_turns, config.max_episode_tokens)
        generator = EpisodeGenerator(
            engine, params, config.group_size, tokenizer, session, limits, in_flight, cancelled
        )
    else:
        generator = RolloutGenerator(
            engine, params, config.group_size, tokenizer, in_flight, cancelled
        )
    device = engine.model.lm_head.weight.device  # where a reward model scores
    rewards = RewardMix(config.reward or default_reward(config.task), config.max_tokens, device)
    reuse = config.updates_per_batch > 1
    return RolloutRunner(generator, rewards, reusable if reuse else None)


def update_settings(config: GRPOConfig, engine: InferenceScheduler) -> UpdateSettings:
    """The importance correction covers every token (`correct_on_policy`) unless the engine
    computes in fp32 like the trainer; on CUDA a low-precision engine's dtype is also the
    trainer's autocast, except with LoRA, whose base already is in the engine's dtype and whose
    adapter computes in fp32."""
    engine_dtype = engine.model.lm_head.weight.dtype
    low_precision = engine_dtype != torch.float32
    on_policy = config.correct_on_policy
    on_cuda = engine.model.lm_head.weight.device.type == "cuda"
    return UpdateSettings(
        temperature=config.temperature,
        clip_eps=config.clip_eps,
        kl_coef=config.kl_coef,
        max_tokens=config.max_tokens_per_micro_batch,
        chunk_rows=config.logit_chunk_rows,
        checkpointing=config.gradient_checkpointing,
        importance=Importance(
            config.importance_mode,
            config.importance_cap,
            low_precision if on_policy is None else on_policy,
        ),
        autocast=engine_dtype if on_cuda and low_precision and config.lora is None else None,
        objective=objective_of(config),
    )


def objective_of(config: GRPOConfig) -> Objective:
    """The job's objective (`core_engine.rl.objective`); dr_grpo's constant is the most
    response tokens a sample holds."""
    return Objective(
        loss_type=config.loss_type,
        policy_loss=config.policy_loss,
        importance_sampling_level=config.importance_sampling_level,
        clip_eps_high=config.clip_eps_high,
        clip_ratio_c=config.clip_ratio_c,
        delta=config.delta,
        sapo_temperature_pos=config.sapo_temperature_pos,
        sapo_temperature_neg=config.sapo_temperature_neg,
        entropy_coef=config.entropy_coef,
        top_entropy_quantile=config.top_entropy_quantile,
        completion_length=config.tokens_per_sample,
    )
