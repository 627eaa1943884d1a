"""Builders of valid records for the storage tests."""

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from db import BatchRecord, JobInfo, PolicyVersionRecord, Repository, SampleRecord, make_engine


def make_sample(
    prompt_index: int = 0, group_index: int = 0, *, version: int = 0, tokens: int = 4, **fields: Any
) -> SampleRecord:
    """A finished (``stop``) sample of ``tokens`` tokens; ``fields`` override anything."""
    values: dict[str, Any] = {
        "prompt_index": prompt_index,
        "group_index": group_index,
        "policy_version": version,
        "prompt_text": f"What is {prompt_index} + {prompt_index}?",
        "response_text": f"answer {group_index}",
        "response_token_ids": [100 + i for i in range(tokens)],
        "behaviour_logprobs": [-0.5 - i / 8 for i in range(tokens)],
        "temperature_logprobs": [-0.25 - i / 8 for i in range(tokens)],
        "finish_reason": "stop",
        "reward": 1.0,
        "advantage": 0.5,
    }
    values.update(fields)
    return SampleRecord(**values)


def make_batch(
    job_id: int,
    samples: list[SampleRecord],
    *,
    version: int = 0,
    step: int = 0,
    status: str = "accepted",
    reasons: tuple[str, ...] = (),
) -> BatchRecord:
    return BatchRecord(
        job_id=job_id,
        policy_version=version,
        step=step,
        status=status,
        samples=samples,
        rejection_reasons=reasons,
    )


def running_job(repo: Repository, *, versions: int = 1, **config: Any) -> JobInfo:
    """A running train job with policy versions 0 .. ``versions`` - 1 recorded."""
    job = repo.create_job("train", config or {"model": "toy"})
    repo.mark_running(job.id)
    for version in range(versions):
        parent = version - 1 if version else None
        repo.record_policy_version(PolicyVersionRecord(job.id, version, parent_version=parent))
    return repo.get_job(job.id)


def sample_columns(url: URL) -> set[str]:
    """The columns the samples table of the database at `url` has (a migration's check)."""
    engine = make_engine(url)
    names = {c["name"] for c in sa.inspect(engine).get_columns("samples")}
    engine.dispose()
    return names
