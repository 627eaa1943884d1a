"""Re-scoring stored responses under a version's kept weights, on a worker (the UI process
never loads a model): the audit of a sample's attribution, and the token-level diff of one
response under two versions.

Scores are the trainer's teacher-forced log-probs (`packed_response_logprobs`) of the stored
response after its stored (rendered) prompt, at the job's sampling temperature (greedy scores
at T = 1, as the engine records it), with the weights whose checksum the version recorded.
"""

from collections.abc import Callable
from typing import Any

from db import JobInfo, NotFound, Repository, SampleDetail, VersionNotFound
from workers.chat import ChatProblem
from workers.engines import (
    ChecksumMismatch,
    EngineMemoryError,
    WeightsNotKept,
    engine_cache,
    saved_version,
)
from workers.settings import Settings

WEIGHTS_NOT_KEPT = "weights not kept"
AUDIT_TOLERANCE = 1e-4  # DESIGN invariant 3: fp32 recomputation reproduces the stored log-probs
MAX_AUDIT_SAMPLES = 200


def scoring_temperature(job: JobInfo) -> float:
    """The temperature the job sampled at (0, greedy, is recorded at T = 1)."""
    return float(job.config.get("temperature") or 1.0)


def stored_logprobs(detail: SampleDetail) -> list[float]:
    """What the engine recorded for the response: the temperature-only log-probs (equal to
    the behaviour log-probs without top-p), else the behaviour log-probs."""
    return detail.temperature_logprobs or detail.behaviour_logprobs


def score_response(
    repo: Repository, settings: Settings, detail: SampleDetail, version: int, temperature: float
) -> list[float]:
    """The response's log-probs under ``version`` of the sample's job (`VersionNotFound`,
    `WeightsNotKept`, `EngineMemoryError`, or `ChecksumMismatch` when its weights are not the
    recorded ones)."""
    import torch

    from core_engine.prompts import encode_prompt
    from core_engine.rl.logprobs import packed_response_logprobs

    info = saved_version(repo, detail.job_id, version)
    engine, _ = engine_cache(settings).verified(
        info.checkpoint_path, info.version, info.weights_checksum
    )
    prompt = encode_prompt(engine.tokenizer, detail.prompt_text)
    with torch.no_grad():
        [scores] = packed_response_logprobs(
            engine.model, [prompt], [detail.response_token_ids], temperature
        )
    return [float(v) for v in scores.float().cpu()]


def audit_sample(repo: Repository, settings: Settings, sample_id: int) -> dict[str, Any]:
    """One sample's audit: the largest |stored - recomputed| log-prob under its stamped
    version, with ``status`` pass / fail (against `AUDIT_TOLERANCE`), ``weights not kept``,
    ``no tokens`` or ``error`` (with ``problem``)."""
    result: dict[str, Any] = {"sample_id": sample_id, "tolerance": AUDIT_TOLERANCE}
    try:
        detail = repo.get_sample(sample_id)
        job = repo.get_job(detail.job_id)
    except NotFound as exc:
        return {**result, "status": "error", "problem": str(exc)}
    result.update(job_id=detail.job_id, version=detail.policy_version)
    result["tokens"] = len(detail.response_token_ids)
    if not detail.response_token_ids:
        return {**result, "status": "no tokens", "max_abs_diff": None}
    try:
        scores = score_response(
            repo, settings, detail, detail.policy_version, scoring_temperature(job)
        )
    except (WeightsNotKept, VersionNotFound, ChecksumMismatch, EngineMemoryError) as exc:
        status = WEIGHTS_NOT_KEPT if isinstance(exc, WeightsNotKept) else "error"
        return {**result, "status": status, "max_abs_diff": None, "problem": str(exc)}
    diff = max(abs(a - b) for a, b in zip(stored_logprobs(detail), scores, strict=True))
    return {**result, "max_abs_diff": diff, "status": "pass" if diff <= AUDIT_TOLERANCE else "fail"}


def audit_samples(
    repo: Repository,
    settings: Settings,
    sample_ids: list[int],
    cancelled: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """The audit of each sample (at most `MAX_AUDIT_SAMPLES`), or ``{"problem": ...}``, also
    when ``cancelled()`` says so before a sample."""
    if not isinstance(sample_ids, list) or not all(isinstance(i, int) for i in sample_ids):
        return {"problem": "sample ids: a list of whole numbers is required"}
    if not 1 <= len(sample_ids) <= MAX_AUDIT_SAMPLES:
        return {"problem": f"audit 1 to {MAX_AUDIT_SAMPLES} samples at a time"}
    audits = []
    for sample_id in sample_ids:
        if cancelled():
            return {"problem": f"cancelled after {len(audits)} of {len(sample_ids)} samples"}
        audits.append(audit_sample(repo, settings, sample_id))
    return {"samples": audits}


def token_diff(
    repo: Repository, settings: Settings, sample_id: int, version_a: int, version_b: int
) -> dict[str, Any]:
    """A stored response scored under two versions of its job: the token ids and each
    version's log-probs, or ``{"problem": ...}`` (e.g. a version whose weights were not kept)."""
    try:
        if not all(isinstance(v, int) for v in (sample_id, version_a, version_b)):
            raise ChatProblem("sample and versions must be whole numbers")
        detail = repo.get_sample(sample_id)
        if not detail.response_token_ids:
            raise ChatProblem(f"sample {sample_id} has no response tokens to score")
        temperature = scoring_temperature(repo.get_job(detail.job_id))
        scores = [
            score_response(repo, settings, detail, version, temperature)
            for version in (version_a, version_b)
        ]
    except (ChatProblem, NotFound, WeightsNotKept, ChecksumMismatch, EngineMemoryError) as exc:
        return {"problem": str(exc)}
    return {
        "sample_id": sample_id,
        "job_id": detail.job_id,
        "checkpoint": saved_version(repo, detail.job_id, version_b).checkpoint_path,
        "token_ids": list(detail.response_token_ids),
        "logprobs_a": scores[0],
        "logprobs_b": scores[1],
    }
