"""Realistic database rows and a fake job queue for the UI tests."""

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from db import (
    BatchRecord,
    JobInfo,
    PolicyMetrics,
    PolicyVersionRecord,
    Repository,
    SampleRecord,
    StudyInfo,
)
from db.repository.studies import StudyJobRecord
from ui.services import Services
from workers.specs import validate
from workers.study_spec import parse_study

ALPHABET = "0123456789?=+ <>&\"'abcdefghijklmnopqrstuvwxyz"
PROMPTS = ("5?", "17?", "42?")
GROUP = 4
VERSIONS = 4
TRICKY = "<b>&\"x'"  # a response that must come out escaped


def save_tokenizer(path: Path) -> Path:
    """A character tokenizer (``tokenizer.json``) like the toy checkpoints have."""
    from core_engine.toy import char_tokenizer

    char_tokenizer(ALPHABET).save_pretrained(path)
    return path


def encode(model_dir: Path, text: str) -> list[int]:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text).ids


def _sample(model_dir: Path, version: int, prompt: int, group: int, **fields: Any) -> SampleRecord:
    """Version v answers "7" (reward 1) for the first v+1 samples of a group, else "12"."""
    response = "7" if group <= version else "12"
    ids = encode(model_dir, response)
    values: dict[str, Any] = {
        "prompt_index": prompt,
        "group_index": group,
        "policy_version": version,
        "prompt_text": PROMPTS[prompt],
        "prompt_messages": [{"role": "user", "content": PROMPTS[prompt]}],
        "reference_output": "7",
        "response_text": response,
        "response_token_ids": ids,
        "behaviour_logprobs": [-0.05 - 2.0 * i for i in range(len(ids))],
        "temperature_logprobs": [-0.04 - 2.0 * i for i in range(len(ids))],
        "finish_reason": "stop",
        "reward": float(response == "7"),
        "advantage": 0.5 if response == "7" else -0.5,
        "cached_prompt_tokens": 2 if group else 0,
        "seed": 1000 * version + 10 * prompt + group,
    }
    values.update(fields)
    return SampleRecord(**values)


def fill_training_job(repo: Repository, model_dir: Path) -> JobInfo:
    """A finished train job: versions 0..3 with metrics (the weights of 0 and 3 kept), one
    accepted batch per version (3 prompts x 4 samples) and, at version 1, a rejected batch
    with an errored sample."""
    config = {"model": str(model_dir), "task": "always7", "steps": VERSIONS - 1}
    job = repo.create_job("train", config, total_steps=VERSIONS - 1)
    repo.mark_running(job.id)
    for version in range(VERSIONS):
        metrics = PolicyMetrics(
            reward_mean=0.25 * version,
            reward_std=0.4,
            loss=0.1,
            kl=0.01 * version,
            train_infer_mismatch=1e-5,
            num_accepted=1,
            num_rejected=int(version == 1),
            tokens_per_second=100.0 + version,
        )
        parent = version - 1 if version else None
        kept = str(model_dir) if version in (0, VERSIONS - 1) else None  # as retention keeps
        record = PolicyVersionRecord(job.id, version, parent, kept, metrics=metrics)
        repo.record_policy_version(record)
        samples = [
            _sample(model_dir, version, p, g) for p in range(len(PROMPTS)) for g in range(GROUP)
        ]
        repo.record_batch(BatchRecord(job.id, version, version, "accepted", samples))
        if version == 1:
            bad = [
                _sample(model_dir, 1, 0, 0, response_text=TRICKY, reward=0.0, advantage=None),
                _sample(
                    model_dir,
                    1,
                    0,
                    1,
                    response_text="",
                    response_token_ids=[],
                    behaviour_logprobs=[],
                    temperature_logprobs=[],
                    finish_reason="error",
                    error_code="kv_exhausted",
                    error_message="no free KV pages",
                    reward=None,
                    advantage=None,
                ),
            ]
            reasons = ["sample 1: error/kv_exhausted: no free KV pages"]
            repo.record_batch(BatchRecord(job.id, 1, 1, "rejected", bad, reasons))
        repo.update_progress(job.id, version)
    return repo.mark_succeeded(job.id)


class FakeQueue:
    """Validates submissions as `workers.api` does and stores them as queued jobs; nothing
    runs them."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.submitted: list[tuple[str, dict[str, Any]]] = []
        self.studies: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def submit(self, kind: str, config: dict[str, Any]) -> JobInfo:
        total_steps = validate(kind, config)
        self.submitted.append((kind, config))
        return self.repo.create_job(kind, config, total_steps=total_steps)

    def cancel(self, job_id: int) -> JobInfo:
        return self.repo.request_cancel(job_id)

    def run_study(self, config: dict[str, Any], table: dict[str, Any]) -> StudyInfo:
        """A study checked as `workers.studies.run_study` parses it, its first jobs stored."""
        spec = parse_study(table, config)
        self.studies.append((config, table))
        study = self.repo.create_study(
            spec.name,
            spec.kind,
            config,
            spec.search_space,
            seeds=spec.seeds,
            max_jobs=spec.planned_jobs,
            concurrency=spec.concurrency,
        )
        points = spec.points()

        def make(study: StudyInfo, made: int, room: int) -> list[StudyJobRecord]:
            indexes = range(made, min(made + room, study.max_jobs))
            planned = [(i, points[i // spec.seeds]) for i in indexes]
            return [StudyJobRecord(spec.job_config(config, i, p), p) for i, p in planned]

        return self.repo.schedule_study(study.id, make)[0]

    def chat(self, *args: Any) -> dict[str, Any]:
        """What the interactive worker answers (its function, run here)."""
        from workers.chat import chat_reply
        from workers.settings import Settings

        return chat_reply(self.repo, Settings.from_env(), *args)

    def audit(self, sample_ids: list[int]) -> dict[str, Any]:
        """What the interactive worker answers (its function, run here)."""
        from workers.scoring import audit_samples
        from workers.settings import Settings

        return audit_samples(self.repo, Settings.from_env(), sample_ids)

    def token_diff(
        self,
        sample_id: int,
        version_a: int,
        version_b: int,
        job_a: int | None = None,
        job_b: int | None = None,
    ) -> dict[str, Any]:
        from workers.scoring import token_diff
        from workers.settings import Settings

        return token_diff(
            self.repo, Settings.from_env(), sample_id, version_a, version_b, job_a, job_b
        )

    def resume(self, job_id: int) -> JobInfo:
        return self.repo.reopen(job_id)

    def overview(self) -> dict[str, Any]:
        active = {"worker": "gpu0@test", "task_id": "t-1", "name": "workers.train", "args": [1]}
        return {
            "broker": "embedded (filesystem)",
            "workers": ["gpu0@test"],
            "workers_online": 1,
            "active": [active],
            "reserved": [],
            "jobs": {"queued": 0, "running": 1, "cancelling": 0},
            "commands": {"workers online": "celery -A workers.app inspect ping"},
        }

    def services(self, model_roots: tuple[Path, ...], data_dir: Path) -> Services:
        return Services(
            repository=self.repo,
            submit_job=self.submit,
            cancel_job=self.cancel,
            queue_overview=self.overview,
            resume_job=self.resume,
            chat=self.chat,
            audit=self.audit,
            token_diff=self.token_diff,
            run_study=self.run_study,
            model_roots=model_roots,
            data_dir=data_dir,
        )
