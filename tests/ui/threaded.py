"""A job queue without a broker: each submitted job runs in a thread through the worker's own
`workers.jobs.run_job` (the real trainer, writing to the database as the worker does)."""

import dataclasses
import threading
from pathlib import Path
from typing import Any

from db import JobInfo, Repository
from ui.services import Services
from workers.jobs import run_job
from workers.settings import Settings
from workers.specs import validate


class ThreadQueue:
    def __init__(self, repo: Repository, data_dir: Path) -> None:
        self.repo = repo
        self.settings = dataclasses.replace(Settings.from_env(), data_dir=data_dir)
        self.threads: dict[int, threading.Thread] = {}
        self._answer: threading.Event | None = None  # see hold_workers_answer
        self._answer_limit_s = 0.0

    def submit(self, kind: str, config: dict[str, Any]) -> JobInfo:
        total_steps = validate(kind, config)
        job = self.repo.create_job(kind, config, total_steps=total_steps)
        thread = threading.Thread(
            target=run_job, args=(self.repo, job.id, self.settings), name=f"job-{job.id}"
        )
        self.threads[job.id] = thread
        thread.start()
        return job

    def audit(self, sample_ids: list[int]) -> dict[str, Any]:
        """What the interactive worker answers (its function, run in this process)."""
        from workers.scoring import audit_samples

        return audit_samples(self.repo, self.settings, sample_ids)

    def token_diff(
        self,
        sample_id: int,
        version_a: int,
        version_b: int,
        job_a: int | None = None,
        job_b: int | None = None,
    ) -> dict[str, Any]:
        from workers.scoring import token_diff

        return token_diff(self.repo, self.settings, sample_id, version_a, version_b, job_a, job_b)

    def cancel(self, job_id: int) -> JobInfo:
        return self.repo.request_cancel(job_id)

    def hold_workers_answer(self, limit_s: float) -> threading.Event:
        """From now on `overview` (the workers' answer, a broadcast on a real deployment) waits
        until the returned event is set, or ``limit_s`` seconds (a hang guard)."""
        self._answer, self._answer_limit_s = threading.Event(), limit_s
        return self._answer

    def overview(self) -> dict[str, Any]:
        if self._answer is not None:
            self._answer.wait(self._answer_limit_s)
        running = [
            {"worker": "thread@test", "task_id": thread.name, "name": "run_job", "args": [job]}
            for job, thread in self.threads.items()
            if thread.is_alive()
        ]
        return {
            "broker": "none (threads in the test process)",
            "workers": ["thread@test"],
            "workers_online": 1,
            "active": running,
            "reserved": [],
            "jobs": {},
            "commands": {"workers online": "celery -A workers.app inspect ping"},
        }

    def join(self, timeout: float) -> None:
        if self._answer is not None:
            self._answer.set()  # nothing stays held
        for thread in self.threads.values():
            thread.join(timeout)

    def services(self, model_roots: tuple[Path, ...]) -> Services:
        return Services(
            repository=self.repo,
            submit_job=self.submit,
            cancel_job=self.cancel,
            queue_overview=self.overview,
            resume_job=self.repo.reopen,
            chat=lambda *args: {"problem": "no chat here"},
            audit=self.audit,
            token_diff=self.token_diff,
            run_study=self.repo.create_study,  # not called here
            model_roots=model_roots,
            data_dir=self.settings.data_dir,
        )
