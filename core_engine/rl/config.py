"""Training-job configuration (a JSON or TOML file, or keyword arguments)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from core_engine.lora_settings import LoraSettings
from core_engine.rl.limits import TRAINER_FIELDS, field_problems
from core_engine.rl.objective.choices import objective_problems, trl_names_as_ours
from core_engine.rl.presets import apply_preset, preset_problems
from core_engine.rl.rewards.mix import RewardSpec, parse_rewards
from core_engine.task import DTYPE_NAMES, KV_STRATEGIES, SamplingParams
from core_engine.user_files import MAX_TEXT_BYTES, read_text

ENGINE_DTYPES = ("auto", *DTYPE_NAMES)
OPTIMIZER_STATE_DTYPES = ("float32", "bfloat16")  # AdamW moments (core_engine.rl.trainer.optimizer)
DEVICE_TYPES = ("cpu", "cuda")
# How generation and training overlap (`core_engine.rl.rollout.sources`): not at all; the next
# batch generated under the version being trained (lag 1); or also across the weight update,
# which lands between two decode steps of running sequences (per-token versions, lag <= 1).
PIPELINE_MODES = ("sync", "one_step", "in_flight")
# How a token's pi_prox / pi_behaviour weight meets its cap (`core_engine.rl.objective.loss`).
IMPORTANCE_MODES = ("truncate", "mask")
# How full weights lie over a job's ranks (`core_engine.rl.ranks.shard`).
SHARDINGS = ("fsdp2", "replicate")
DEFAULT_LR = 3e-4
DEFAULT_LORA_LR = 3e-3  # 10x DEFAULT_LR: LoRA's rate is ~10x full fine-tuning's (Schulman 2025)
# ... for billion-scale models. Below SMALL_MODEL_PARAMETERS LoRA gets SMALL_MODEL_LORA_LR:
# measured on the shipped 527k-parameter demo policy, 3e-3 collapses it (held-out 21.5% -> 4%,
# stalled at v309 of 600) where 1e-3 learns (21.5% -> 45.5%).
SMALL_MODEL_PARAMETERS = 100_000_000
SMALL_MODEL_LORA_LR = 1e-3
DEFAULT_KEEP_LAST = 3


def mode_defaults(lora: bool, parameters: int | None = None) -> dict[str, float | int]:
    """The defaults that depend on LoRA: the learning rate (10x with LoRA, or
    `SMALL_MODEL_LORA_LR` for a model of fewer than `SMALL_MODEL_PARAMETERS` parameters) and
    `keep_last` (0 with LoRA: a version's adapter is small, so every version's is kept)."""
    if lora:
        small = parameters is not None and parameters < SMALL_MODEL_PARAMETERS
        return {"lr": SMALL_MODEL_LORA_LR if small else DEFAULT_LORA_LR, "keep_last": 0}
    return {"lr": DEFAULT_LR, "keep_last": DEFAULT_KEEP_LAST}


def approx_parameters(checkpoint: str | Path) -> int | None:
    """A checkpoint's parameter count from its config.json (embeddings, attention and MLP of
    a Llama-family decoder), or None when it has none: enough to pick a default."""
    try:
        values = json.loads(read_text(Path(checkpoint) / "config.json", MAX_TEXT_BYTES))
        hidden, layers = int(values["hidden_size"]), int(values["num_hidden_layers"])
        vocab, inner = int(values["vocab_size"]), int(values["intermediate_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    embeddings = vocab * hidden * (1 if values.get("tie_word_embeddings", False) else 2)
    return embeddings + layers * (4 * hidden * hidden + 3 * hidden * inner)


def torch_device_type(device: str) -> str:
    """'cpu', 'cuda' or 'cuda:N' -> its type; anything else is refused (syntax only: whether
    the device exists is checked where the job runs)."""
    kind, _, index = str(device).partition(":")
    if kind not in DEVICE_TYPES or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return kind


@dataclass(frozen=True)
class GRPOConfig:
    # a Hugging Face checkpoint directory (job files also take a shipped policy's name, "demo",
    # "calculator-demo" or "r1-demo"; worker-run jobs a Hub id too)
    model: str
    output_dir: str  # checkpoints, one directory per version (job files: optional)
    task: str | None = None  # a built-in task name ...
    data: str | None = None  # ... or a data file of records (JSONL, JSON, CSV, Parquet, a dataset)
    # a reward spec or a list of {name, weight} tables (`core_engine.rl.rewards.mix`);
    # default: the task's reward, else exact_match
    reward: RewardSpec | None = None
    steps: int = 50  # optimizer steps (versions) the job trains
    batch_size: int = 16  # prompts per rollout batch
    group_size: int = 8  # samples per prompt (the GRPO group)
    # default: `mode_defaults` (3e-4; with `lora` 3e-3, or 1e-3 below 100M parameters)
    lr: float | None = None
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    max_grad_norm: float = 1.0  # gradients clipped to this global norm
    temperature: float = 1.0  # sampling temperature (0: greedy)
    top_p: float = 1.0  # nucleus sampling
    max_tokens: int = 16  # response tokens per sample (per turn in an episode)
    clip_eps: float = 0.2  # PPO's clip range of the ratio (its lower side: TRL's epsilon)
    kl_coef: float = 0.0  # weight of the KL penalty to the starting policy (0: no reference)
    # The objective (`core_engine.rl.objective`, whose docstring says how they compose): the
    # aggregation (TRL's loss_type names; "dapo": token mean over the step), the surrogate,
    # the ratio's level (token, sequence: GSPO, sequence_token: GSPO-token), the upper clip
    # (None: clip_eps; DAPO's clip-higher; CISPO's absolute cap of the weight, TRL's
    # epsilon_high), verl's dual clip (None: off) and TRL's two-sided bound `delta` (None:
    # off), SAPO's gate temperatures.
    loss_type: str = "dapo"
    policy_loss: str = "ppo_clip"
    importance_sampling_level: str = "token"
    clip_eps_high: float | None = None
    clip_ratio_c: float | None = None
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    # The advantage estimator; for "grpo", TRL's `scale_rewards` and the std it divides by
    # ("population": today's; "unbiased": TRL's and verl's torch.std).
    advantage: str = "grpo"
    scale_rewards: str = "group"
    advantage_std: str = "population"
    # DAPO's length rule and the entropy terms (TRL's names): truncated completions out of the
    # loss; an entropy bonus; only the top quantile of tokens by entropy in the policy term.
    mask_truncated_completions: bool = False
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    # The learning rate over the steps (transformers' schedulers; TRL's names).
    lr_scheduler_type: str = "constant"
    warmup_ratio: float = 0.0
    drop_zero_variance_groups: bool = True  # groups whose rewards all agree are not trained
    # DAPO's dynamic sampling (`core_engine.rl.rollout.dynamic`): draw further batches of
    # prompts until `batch_size` groups have mixed rewards, at most `max_sampling_draws` draws
    # per step (then the step is rejected, saying so); every drawn group is stored.
    dynamic_sampling: bool = False
    max_sampling_draws: int = 10
    reject_scope: str = "batch"  # "batch" or "group"
    # more failed batches in a row than this fail the job; more without reward variance end
    # it stalled
    max_consecutive_rejections: int = 5
    max_policy_lag: int = 0  # versions a trained token may lag the trainer (0: on-policy)
    pipeline: str = "sync"  # one of PIPELINE_MODES; the others need max_policy_lag >= 1
    updates_per_batch: int = 1  # optimizer steps per batch of prompts (rollout reuse)
    checkpoint_every: int = 0  # 0: only the last version
    # versions whose weights are kept (0: all; default 3, all with `lora`); optimizer state:
    # newest only
    keep_last: int | None = None
    keep_every: int = 25  # ... plus every version that is a multiple of this (0: none)
    kv_strategy: str = "paged"  # the KV pool's layout: one of KV_STRATEGIES
    engine_batch_size: int = 128  # requests the engine runs at once (more run in waves)
    seed: int = 0  # seeds the prompts' order and the sampling
    resume: bool = True  # continue from the newest checkpoint in output_dir
    device: str = "cpu"  # trainer and engine
    # ranks the job runs as, one per device of `device`'s type (`core_engine.rl.ranks`)
    devices: int = 1
    # full weights over the ranks: "fsdp2" (each rank 1/N of weights, gradients and AdamW
    # state) or "replicate" (each rank all of them, gradients summed by one all-reduce: DDP's
    # layout, fewer collectives for a policy one device holds); LoRA always replicates
    sharding: str = "fsdp2"
    # how long a rank waits in one collective before the job fails (None: the worker's
    # ``RLWB_RANK_TIMEOUT``, default 600 s; `core_engine.rl.ranks.group`)
    collective_timeout_s: float | None = None
    # how long a pipelined rollout producer, alive, may go without progress (no decode step,
    # no turn) before the job fails (None: the worker's ``RLWB_ROLLOUT_TIMEOUT``, default
    # 600 s; `core_engine.rl.rollout.control`)
    rollout_timeout_s: float | None = None
    engine_dtype: str = "auto"  # float32 | bfloat16 | float16 | auto (bf16 on CUDA, else fp32)
    # The importance correction (`core_engine.rl.objective.loss`): "truncate" (TIS, as TRL) or
    # "mask" (AReaL's decoupled PPO) of pi_prox / pi_behaviour at `importance_cap`, on tokens
    # an older version sampled and, with `correct_on_policy` (None: when the engine computes
    # in a lower precision than the trainer), on every token.
    importance_mode: str = "truncate"
    importance_cap: float = 2.0  # the cap of the importance weight (see importance_mode)
    correct_on_policy: bool | None = None  # see importance_mode
    max_tokens_per_micro_batch: int = 8192  # prompt + response tokens per training forward
    logit_chunk_rows: int = 256  # rows x vocabulary the log-softmax holds at once
    gradient_checkpointing: bool = False  # recompute each layer in the backward
    optimizer_state_dtype: str = "float32"  # AdamW's moments: float32 or bfloat16 (half)
    release_kv_during_training: bool = True  # the engine's KV memory is freed while training
    kv_cache_bytes: int | None = None  # the engine's KV budget (default: the engine's)
    gpu_memory_utilization: float | None = None  # on CUDA: the budget as a share of free memory
    # LoRA over a frozen base shared with the engine (`core_engine.lora_settings.LoraSettings`; a
    # table in job files); None: full-weight training.
    lora: LoraSettings | None = None
    # Multi-turn episodes (`core_engine.rl.episodes`): an operator-registered environment (its
    # reward scores the episodes; `max_tokens` is then per turn), at most `max_turns` assistant
    # turns and `max_episode_tokens` tokens (prompt, turns and observations) per episode.
    environment: str | None = None
    max_turns: int = 4  # assistant turns per episode
    max_episode_tokens: int = 512  # tokens per episode: prompt, turns and observations
    # a published variant's settings (`core_engine.rl.presets`), beneath the job's own: applied
    # by `from_dict` (job files, the worker), kept to name the job's algorithm
    preset: str | None = None

    def __post_init__(self) -> None:
        problems = self._resolve_lora()
        parameters = approx_parameters(self.model) if self.lora is not None else None
        for name, value in mode_defaults(self.lora is not None, parameters).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if (self.task is None) == (self.data is None):
            problems.append("give exactly one of 'task' or 'data'")
        numbers = field_problems(vars(self), TRAINER_FIELDS)
        problems.extend(numbers)
        if not numbers:  # the rules across fields compare numbers
            sampling = SamplingParams(temperature=self.temperature, top_p=self.top_p)
            problems.extend(filter(None, [sampling.validation_error()]))
        if self.kv_strategy not in KV_STRATEGIES:
            problems.append(f"kv_strategy must be one of {', '.join(KV_STRATEGIES)}")
        problems.extend(self._pipeline_problems(numbers))
        problems.extend(self._devices_problems(numbers))
        if self.dynamic_sampling is True:  # several batches drawn for a step, on demand
            needs = {
                "pipeline = 'sync'": self.pipeline == "sync",
                "devices = 1": self.devices == 1,
                "updates_per_batch = 1": self.updates_per_batch == 1,
            }
            problems.extend(f"dynamic_sampling needs {n}" for n, met in needs.items() if not met)
        if self.reject_scope not in ("batch", "group"):
            problems.append("reject_scope must be 'batch' or 'group'")
        if self.optimizer_state_dtype not in OPTIMIZER_STATE_DTYPES:
            problems.append(f"optimizer_state_dtype must be one of {list(OPTIMIZER_STATE_DTYPES)}")
        if self.sharding not in SHARDINGS:
            problems.append(f"sharding must be one of {', '.join(SHARDINGS)}")
        if self.importance_mode not in IMPORTANCE_MODES:
            problems.append(f"importance_mode must be one of {', '.join(IMPORTANCE_MODES)}")
        if self.correct_on_policy not in (None, True, False):
            problems.append("correct_on_policy must be true, false or absent (automatic)")
        problems.extend(objective_problems(self, bool(numbers)))
        if self.engine_dtype not in ENGINE_DTYPES:
            problems.append(f"engine_dtype must be one of {sorted(ENGINE_DTYPES)}")
        if not numbers and self.max_tokens >= self.max_tokens_per_micro_batch:
            problems.append(
                f"max_tokens_per_micro_batch ({self.max_tokens_per_micro_batch}) cannot hold one "
                f"sample: a prompt plus max_tokens ({self.max_tokens}) needs more"
            )
        try:
            torch_device_type(self.device)
        except ValueError as exc:
            problems.append(str(exc))
        if self.environment is not None and self.reward is not None:
            problems.append("an environment scores its own episodes: leave 'reward' out")
        if self.environment is not None and self.max_tokens >= self.max_episode_tokens:
            problems.append("max_tokens (per turn) must be below max_episode_tokens")
        if self.reward is not None:
            try:
                parse_rewards(self.reward, None if numbers else self.max_tokens)
            except ValueError as exc:
                problems.append(str(exc))
        problems.extend(preset_problems(self.preset))
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))

    @property
    def tokens_per_sample(self) -> int:
        """The most response tokens one sample can hold: `max_tokens`, or an episode's
        `max_episode_tokens` (its turns and observations)."""
        return self.max_episode_tokens if self.environment is not None else self.max_tokens

    @property
    def sample_version_span(self) -> int:
        """How many versions after its stamp (its oldest token's) a sample's tokens may come
        from: an update lands mid-sample only `in_flight`, and the staleness bound keeps the
        newest within `max_policy_lag` of the oldest."""
        return self.max_policy_lag if self.pipeline == "in_flight" else 0

    @property
    def shards_weights(self) -> bool:
        """Whether, on several ranks, FSDP2 shards the policy (else every rank holds all of it:
        LoRA always, full weights with `sharding = "replicate"`)."""
        return self.lora is None and self.sharding == "fsdp2"

    def generates_in_process(self, device_type: str) -> bool:
        """A pipelined full-weight job on one CPU generates in a child process over the shared
        weights (`core_engine.rl.rollout.process`), with its own KV pool (on several ranks each
        rank's engine already has a copy of its own beside the trainer's FSDP2 shard)."""
        pipelined = self.pipeline != "sync" and self.devices == 1
        return pipelined and device_type == "cpu" and self.lora is None

    def _pipeline_problems(self, numbers: list[str]) -> list[str]:
        if self.pipeline not in PIPELINE_MODES:
            return [f"pipeline must be one of {', '.join(PIPELINE_MODES)}, got {self.pipeline!r}"]
        if self.pipeline == "sync" or numbers:
            return []
        problems = []
        if self.max_policy_lag < 1:
            problems.append(
                f"pipeline {self.pipeline!r} trains samples generated one version before the "
                "trainer's: max_policy_lag must be at least 1"
            )
        if self.updates_per_batch != 1:
            problems.append(f"pipeline {self.pipeline!r} needs updates_per_batch = 1")
        if isinstance(self.lora, LoraSettings) and self.lora.dropout:
            # the engine generates through the very modules the trainer puts in train mode
            problems.append(f"pipeline {self.pipeline!r} needs LoRA dropout 0")
        return problems

    @property
    def clip_high(self) -> float:
        """The upper clip: `clip_eps_high`, else `clip_eps` (symmetric)."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def _devices_problems(self, numbers: list[str]) -> list[str]:
        """What `devices` > 1 (`core_engine.rl.ranks`) needs: a GRPO group per rank at least,
        one device type (each rank takes its own device), and one update per batch."""
        if self.devices == 1 or numbers:
            return []
        problems = []
        if self.batch_size < self.devices:
            problems.append(
                f"devices = {self.devices} needs batch_size >= {self.devices} (each rank "
                "generates whole GRPO groups)"
            )
        if self.device not in DEVICE_TYPES:
            problems.append(
                f"devices = {self.devices}: device must be 'cpu' or 'cuda' (each "
                f"rank takes its own), got {self.device!r}"
            )
        if self.updates_per_batch != 1:
            problems.append(f"devices = {self.devices} needs updates_per_batch = 1")
        return problems

    def _resolve_lora(self) -> list[str]:
        """`lora` given as a table becomes `LoraSettings`; returns what is wrong with it."""
        if self.lora is None or isinstance(self.lora, LoraSettings):
            return []
        if not isinstance(self.lora, dict):
            return [f"lora must be a table of LoRA settings, got {self.lora!r}"]
        try:
            object.__setattr__(self, "lora", LoraSettings.from_dict(self.lora))
        except (TypeError, ValueError) as exc:
            return [str(exc)]
        return []

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GRPOConfig:
        values = apply_preset(trl_names_as_ours(_renamed(values)))
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown config keys: {unknown}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path, defaults: dict[str, Any] | None = None) -> GRPOConfig:
        """A TOML (``.toml``) or JSON job file's config, ``defaults`` for the keys it omits."""
        path = Path(path)
        text = read_text(path, MAX_TEXT_BYTES)
        values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        return cls.from_dict({**(defaults or {}), **values})


def _renamed(values: dict[str, Any]) -> dict[str, Any]:
    """A job stored before the importance settings: `tis_cap` (0: off, else the cap of an
    on-policy correction) becomes `correct_on_policy` and `importance_cap`."""
    if "tis_cap" not in values:
        return values
    values = dict(values)
    cap = values.pop("tis_cap")
    if cap is not None:
        values.setdefault("correct_on_policy", bool(cap))
        if cap:
            values.setdefault("importance_cap", cap)
    return values
