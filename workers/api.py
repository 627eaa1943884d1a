"""What the UI and the CLI call: the job vocabulary and checks of user input (no user code is
imported), when the UI may be served, the worker side of ``rlwb`` (`workers.commands`),
submitting, cancelling and resuming jobs (`workers.submission`), studies (`workers.studies`),
and the queue. Imports no torch; Celery is configured on first use, not at import.

from workers.api import submit_job, cancel_job, queue_overview
job = submit_job("train", {"model": DEMO_MODEL, "task": "addition", "steps": 200})
study = run_study({"model": DEMO_MODEL, "task": "addition"}, {"name": "lr", "seeds": 3,
                  "grid": {"lr": [1e-3, 3e-3]}})
"""

from dataclasses import MISSING, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from core_engine.lora_settings import (
    ALL_LINEAR,
    LINEAR_MODULES,
    SAVABLE_MODULES,
    LoraSettings,
)
from core_engine.rl import presets as algorithms  # the algorithm presets
from core_engine.rl.config import PIPELINE_MODES, GRPOConfig, mode_defaults
from core_engine.rl.data import DataError
from core_engine.rl.data.files import Columns, record_count
from core_engine.rl.data.tasks import BUILTIN_TASKS
from core_engine.rl.episodes.environments import registered_environments
from core_engine.rl.objective.clip import clip_active
from core_engine.rl.rewards import LIST_ONLY_REWARDS, STANDALONE_REWARDS
from core_engine.rl.rewards.mix import RewardSpec, parse_rewards
from core_engine.task import KV_STRATEGIES
from core_engine.user_files import (
    MAX_DATA_BYTES,
    MAX_TEXT_BYTES,
    UnsafeFileError,
    is_under,
    regular_file,
    size_text,
)
from db import JobStatus
from workers.chat import checkpoint_context, max_tokens_bounds
from workers.chat import settings_problems as chat_settings_problems
from workers.cli_errors import guarded
from workers.commands import COMMANDS as WORKER_COMMANDS
from workers.commands import add_commands as add_worker_commands
from workers.commands import run as run_worker_command
from workers.job_files import (
    check_data_file,
    check_data_records,
    check_model,
    model_parameters,
    model_roots,
)
from workers.kept_weights import adapter_bytes, weights_kept
from workers.settings import GPU_QUEUE, TASK_FOR_KIND, UPLOADS_DIR, Settings, worker_device
from workers.shipped import CALCULATOR_MODEL, DEMO_MODEL, MODEL_PRESETS, R1_MODEL
from workers.specs import (
    HELDOUT_EVERY,
    HELDOUT_MEAN_AT_K_METRIC,
    HELDOUT_METRIC,
    HELDOUT_PROMPTS,
    JOB_FIELDS,
    SpecError,
    check_environment,
)
from workers.studies import cancel_study, clone_study, resume_study, run_study
from workers.submission import cancel_job, celery_app, resume_job, submit_job, validate_job
from workers.tokenizer_match import tokenizer_problem
from workers.trackers import TRACKERS

__all__ = [
    "ALL_LINEAR",
    "CALCULATOR_MODEL",
    "COMMANDS",
    "DEMO_MODEL",
    "HELDOUT_MEAN_AT_K_METRIC",
    "HELDOUT_METRIC",
    "JOB_FIELDS",
    "KV_STRATEGIES",
    "LAUNCH_DEFAULTS",
    "LINEAR_MODULES",
    "MAX_DATA_BYTES",
    "MAX_TEXT_BYTES",
    "MODEL_PRESETS",
    "PIPELINE_MODES",
    "R1_MODEL",
    "REWARDS",
    "SAVABLE_MODULES",
    "TASKS",
    "TASK_FOR_KIND",
    "TRACKERS",
    "TRAINER_DEFAULTS",
    "UPLOADS_DIR",
    "WORKER_COMMANDS",
    "SpecError",
    "UnsafeFileError",
    "adapter_bytes",
    "add_worker_commands",
    "algorithms",
    "audit",
    "cancel_job",
    "cancel_study",
    "chat",
    "chat_settings_problems",
    "check_data_file",
    "check_data_records",
    "check_environment",
    "check_model",
    "check_reward",
    "checkpoint_context",
    "clip_active",
    "clone_study",
    "count_records",
    "deployment",
    "exposure_problem",
    "guarded",
    "is_under",
    "max_tokens_bounds",
    "mode_defaults",
    "model_parameters",
    "model_roots",
    "queue_counts",
    "queue_overview",
    "registered_environments",
    "regular_file",
    "resume_job",
    "resume_study",
    "run_study",
    "run_worker_command",
    "size_text",
    "submit_job",
    "token_diff",
    "tokenizer_problem",
    "validate_job",
    "weights_kept",
    "worker_device",
]

TASKS: dict[str, str] = {name: task.description for name, task in BUILTIN_TASKS.items()}
REWARDS: tuple[str, ...] = (*STANDALONE_REWARDS, *LIST_ONLY_REWARDS)  # the last as list entries
TRAINER_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(GRPOConfig) if f.default is not MISSING
}
LORA_DEFAULTS = LoraSettings()
# What a new job starts from: the demo policy on addition, with held-out accuracy checked,
# full-weight (LoRA off; when on, the `LORA_DEFAULTS` on every linear layer).
LAUNCH_DEFAULTS: dict[str, Any] = {
    **TRAINER_DEFAULTS,
    "model": DEMO_MODEL,
    **MODEL_PRESETS[DEMO_MODEL],
    "batch_size": 16,
    "group_size": 8,
    "lr": mode_defaults(lora=False)["lr"],
    "heldout_every": HELDOUT_EVERY,
    "heldout_prompts": HELDOUT_PROMPTS,
    "report_to": [],
    "lora": False,
    "lora_rank": LORA_DEFAULTS.rank,
    "lora_alpha": LORA_DEFAULTS.alpha,
    "lora_dropout": LORA_DEFAULTS.dropout,
    "lora_target_modules": list(LINEAR_MODULES),
    "lora_modules_to_save": [],
}
LOOPBACK_NAMES = ("localhost", "::1")
RECORD_COUNTS_KEPT = 256  # JSONL files whose record count (`count_records`) is remembered
CHAT_TIMEOUT_S = 120.0
QUEUE_REPLY_TIMEOUT_S = 0.6  # how long the Queue view waits for the workers' replies
AUDIT_TIMEOUT_S = 600.0
CELERY = "celery -A workers.app"
COMMANDS = {
    "workers online": f"{CELERY} inspect ping",
    "active": f"{CELERY} inspect active",
    "reserved": f"{CELERY} inspect reserved",
    "status": f"{CELERY} status",
    "purge queued messages": f"{CELERY} purge -Q {GPU_QUEUE}",
    "revoke a queued task": f"{CELERY} control revoke TASK_ID",
}


def check_reward(spec: RewardSpec) -> None:
    """The reward spec's (or reward list's) syntax (`SpecError`); a registered name is
    checked on the worker."""
    try:
        parse_rewards(spec)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def count_records(path: str | Path, columns: tuple[str | None, str | None] = (None, None)) -> int:
    """How many prompt records a data file holds (JSONL, JSON, CSV or Parquet; ``columns``:
    the prompt and answer columns, None: automatic; `SpecError` if it is unusable). An answer
    column is required only when named: whether the job's rewards need the answers is checked
    at submission (`check_data_records`), when they are known. Files are parsed by a child
    process (`core_engine.rl.data.files.record_count`). Parsed once per
    version of the file: the count, or the refusal, is kept for its identity (device, inode,
    size, change times), so asking again costs one ``stat``."""
    try:
        info = regular_file(path, MAX_DATA_BYTES)
    except UnsafeFileError as exc:
        raise SpecError(str(exc)) from None
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    found = _count_records(str(path), identity, columns)
    if isinstance(found, str):
        raise SpecError(found)
    return found


@lru_cache(maxsize=RECORD_COUNTS_KEPT)
def _count_records(
    path: str, identity: tuple[int, ...], columns: tuple[str | None, str | None]
) -> int | str:
    """The record count of ``path`` as it is at ``identity``, or why it is unusable."""
    try:
        return record_count(path, Columns(*columns, needs_answer=False))
    except (DataError, UnsafeFileError, OSError) as exc:
        return str(exc)


def exposure_problem(
    host: str,
    auth: tuple[str, str] | None,
    share: bool = False,
    allow_unauthenticated: bool = False,
) -> str | None:
    """Why the UI may not be served as asked, or None: a non-loopback address or a public
    share link needs a password, unless the operator says that address is private
    (``allow_unauthenticated``)."""
    loopback = host in LOOPBACK_NAMES or host.startswith("127.")
    if auth is not None or (not share and (loopback or allow_unauthenticated)):
        return None
    if share:
        return "refusing a public share link without a password: pass --auth USER:PASSWORD"
    return (
        f"refusing to serve the UI on {host} without a password: pass --auth USER:PASSWORD "
        "(or set RLWB_AUTH), or --allow-unauthenticated if that address is private"
    )


def chat(
    job_id: int,
    version: int,
    messages: list[dict[str, str]],
    temperature: float,
    max_tokens: int,
    seed: int | None = None,
    timeout: float = CHAT_TIMEOUT_S,
) -> dict[str, Any]:
    """One Playground turn, answered by a worker of the ``interactive`` queue (see
    `workers.chat`); ``{"problem": ...}`` when none answers within ``timeout`` seconds."""
    args = [job_id, version, messages, temperature, max_tokens, seed]
    return _interactive("workers.chat", args, timeout)


def audit(sample_ids: list[int], timeout: float = AUDIT_TIMEOUT_S) -> dict[str, Any]:
    """Re-score stored samples under their stamped versions' kept weights on an
    ``interactive`` worker (see `workers.scoring.audit_samples`)."""
    return _interactive("workers.audit", [list(sample_ids)], timeout)


def token_diff(
    sample_id: int, version_a: int, version_b: int, *jobs: int, timeout: float = CHAT_TIMEOUT_S
) -> dict[str, Any]:
    """A response scored on an ``interactive`` worker (`workers.scoring.token_diff`)."""
    return _interactive("workers.token_diff", [sample_id, version_a, version_b, *jobs], timeout)


def _interactive(name: str, args: list[Any], timeout: float) -> dict[str, Any]:
    """Run task ``name`` on the ``interactive`` queue and wait for its JSON answer;
    ``{"problem": ...}`` when no worker answers within ``timeout`` seconds. The task is then
    revoked: a worker that runs it stops at its next step (`workers.control.revoked`)."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    result = celery_app().tasks[name].apply_async(args=args, expires=timeout)
    try:
        return result.get(timeout=timeout)
    except CeleryTimeout:
        started = result.state == "STARTED"
        result.revoke()
        if started:
            return {"problem": f"stopped: the worker took longer than {timeout:g} s"}
        return {
            "problem": f"no interactive worker answered within {timeout:g} s: start one "
            "(`rlwb worker --interactive`)"
        }


def _broker(settings: Settings) -> str:
    return "embedded (filesystem)" if settings.embedded else "redis"


def deployment() -> str:
    """Where this deployment keeps its data and which broker it uses (one line)."""
    settings = Settings.from_env()
    return f"data: {settings.data_dir}; broker: {_broker(settings)}"


def _tasks(reply: dict[str, list[dict[str, Any]]] | None) -> list[dict[str, Any]]:
    return [
        {"worker": worker, "task_id": task["id"], "name": task["name"], "args": task["args"]}
        for worker, tasks_ in (reply or {}).items()
        for task in tasks_
    ]


def queue_overview(timeout: float = QUEUE_REPLY_TIMEOUT_S) -> dict[str, Any]:
    """Workers online, the tasks they run (``active``) and hold (``reserved``), the job
    counts of the database, and the equivalent ``celery`` commands.

    Takes about ``timeout`` seconds: one broadcast (``queue_state``, defined by the workers)
    that every online worker answers with both lists.
    """
    replies = celery_app().control.broadcast("queue_state", reply=True, timeout=timeout) or []
    states = {
        worker: state
        for reply in replies
        for worker, state in reply.items()
        if isinstance(state, dict)
    }
    online = sorted(states)
    return {
        **queue_counts(),
        "workers": online,
        "workers_online": len(online),
        "active": _tasks({w: states[w].get("active", []) for w in online}),
        "reserved": _tasks({w: states[w].get("reserved", []) for w in online}),
    }


def queue_counts() -> dict[str, Any]:
    """What the queue view knows without asking the workers (milliseconds): the broker,
    the database's queued / running / cancelling job counts and the ``celery`` commands."""
    from workers.app import repository

    repo = repository()
    return {
        "broker": _broker(Settings.from_env()),
        "jobs": {
            status.value: repo.count_jobs(status=status)
            for status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING)
        },
        "commands": COMMANDS,
    }
