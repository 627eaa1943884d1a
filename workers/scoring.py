"""Re-scoring stored responses under a version's kept weights, on a worker (the UI process
never loads a model): the audit of a sample's attribution, and the token-level diff of one
response under two versions.

Scores are the trainer's teacher-forced log-probs (`packed_response_logprobs`) of the stored
response after its stored (rendered) prompt, at the job's sampling temperature (greedy scores
at T = 1, as the engine records it), with the weights whose checksum the version recorded.
A sample whose tokens several versions sampled (a weight update landed in flight) is replayed
instead, run by run under each run's version with the K/V earlier versions left in the cache
(`workers.replay`, Hugging Face `transformers`); its audit has one verdict per run.
"""

from collections.abc import Callable
from functools import lru_cache, partial
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
from workers.replay import Segment, load_reference, replay_logprobs, segments, tokenizer_of
from workers.settings import Settings
from workers.tokenizer_match import tokenizer_problem

WEIGHTS_NOT_KEPT = "weights not kept"
AUDIT_TOLERANCE = 1e-4  # DESIGN invariant 3: fp32 recomputation reproduces the stored log-probs
MAX_AUDIT_SAMPLES = 200
REPLAY_MODELS_KEPT = 2  # an in-flight sample's versions: v and v + 1
# what stops a version's weights from being scored (an engine's memory aside)
_UNCHECKABLE = (WeightsNotKept, VersionNotFound, ChecksumMismatch)


def scoring_temperature(job: JobInfo) -> float:
    """The temperature the job sampled at (0, greedy, is recorded at T = 1)."""
    return float(job.config.get("temperature") or 1.0)


def stored_logprobs(detail: SampleDetail) -> list[float]:
    """What the engine recorded for the response: the temperature-only log-probs (equal to
    the behaviour log-probs without top-p), else the behaviour log-probs."""
    return detail.temperature_logprobs or detail.behaviour_logprobs


def score_response(
    repo: Repository,
    settings: Settings,
    detail: SampleDetail,
    version: int,
    temperature: float,
    job_id: int | None = None,
) -> list[float]:
    """The response's log-probs under ``version`` of job ``job_id`` (default: the sample's)
    (`VersionNotFound`, `WeightsNotKept`, `EngineMemoryError`, or `ChecksumMismatch` when its
    weights are not the recorded ones)."""
    import torch

    from core_engine.prompts import encode_prompt
    from core_engine.rl.objective.logprobs import packed_response_logprobs

    info = saved_version(repo, detail.job_id if job_id is None else job_id, version)
    engine, _ = engine_cache(settings).verified(
        info.checkpoint_path, info.version, info.weights_checksum
    )
    prompt = encode_prompt(engine.tokenizer, detail.prompt_text)
    with torch.no_grad():
        [scores] = packed_response_logprobs(
            engine.model, [prompt], [detail.response_token_ids], temperature
        )
    return [float(v) for v in scores.float().cpu()]


def audit_sample(
    repo: Repository,
    settings: Settings,
    sample_id: int,
    reference_model: Callable[[int, int], Any] | None = None,
) -> dict[str, Any]:
    """One sample's audit: the largest |stored - recomputed| log-prob under the version(s)
    that sampled its tokens, with ``status`` pass / fail (against `AUDIT_TOLERANCE`),
    ``weights not kept``, ``no tokens`` or ``error`` (with ``problem``); ``segments``, one per
    run of tokens of one version, each with its own status; ``checks`` says what was checked.
    ``reference_model(job_id, version)`` gives a version's checked `transformers` model for a
    sample several versions sampled (default: loaded for this sample alone)."""
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
    parts = segments(detail.version_runs, detail.resumed_at or ())
    temperature = scoring_temperature(job)
    if len({part.version for part in parts}) == 1:  # one version computed all of its K/V
        parts = segments(detail.version_runs)
        checked = _teacher_forced(repo, settings, detail, parts, temperature)
    else:
        model_of = reference_model or partial(_reference_model, repo, settings)
        checked = _replayed(repo, detail, parts, temperature, partial(model_of, detail.job_id))
    return {**result, **_summary(checked), "checks": _checks(parts)}


def _teacher_forced(
    repo: Repository,
    settings: Settings,
    detail: SampleDetail,
    parts: list[Segment],
    temperature: float,
) -> list[dict[str, Any]]:
    """The one segment of a sample one version sampled, re-scored by the engine's model."""
    try:
        scores = score_response(repo, settings, detail, parts[0].version, temperature)
    except (*_UNCHECKABLE, EngineMemoryError) as exc:
        return _unchecked(parts, exc)
    return [_scored(parts[0], stored_logprobs(detail), scores, detail.sampled_tokens)]


def _replayed(
    repo: Repository,
    detail: SampleDetail,
    parts: list[Segment],
    temperature: float,
    model_of: Callable[[int], Any],
) -> list[dict[str, Any]]:
    """The segments of a sample several versions sampled, replayed in order
    (`workers.replay`) up to the first whose weights cannot be had."""
    from core_engine.prompts import encode_prompt

    stored, checked = stored_logprobs(detail), []
    try:
        first = saved_version(repo, detail.job_id, parts[0].version).checkpoint_path
        prompt = encode_prompt(tokenizer_of(first), detail.prompt_text)
        response = detail.response_token_ids
        for scores in replay_logprobs(prompt, response, parts, model_of, temperature):
            part = parts[len(checked)]
            checked.append(_scored(part, stored, scores, detail.sampled_tokens))
    except _UNCHECKABLE as exc:
        checked += _unchecked(parts[len(checked) :], exc)
    return checked


def _reference_model(repo: Repository, settings: Settings, job_id: int, version: int) -> Any:
    """The `transformers` model of the version's kept checkpoint, in the engine's dtype, once
    its weights are checked against the version's recorded checksum."""
    from core_engine.engine import resolve_device, resolve_dtype
    from core_engine.weights import model_checksum

    info = saved_version(repo, job_id, version)
    device = resolve_device(settings.device)
    model = load_reference(info.checkpoint_path, device, resolve_dtype("auto", device))
    if info.weights_checksum is not None and model_checksum(model) != info.weights_checksum:
        raise ChecksumMismatch(
            f"the checkpoint of version {version} ({info.checkpoint_path}) does not match "
            "its recorded checksum"
        )
    return model


def _segment(part: Segment, status: str, diff: float | None = None) -> dict[str, Any]:
    return {
        "version": part.version,
        "first_token": part.first,
        "last_token": part.last,
        "max_abs_diff": diff,
        "status": status,
    }


def _scored(
    part: Segment, stored: list[float], scores: list[float], sampled: list[bool]
) -> dict[str, Any]:
    """A segment's verdict from its recomputed ``scores`` (over its sampled tokens)."""
    span = range(part.first, part.last + 1)
    diffs = [abs(stored[j] - s) for j, s in zip(span, scores, strict=True) if sampled[j]]
    if not diffs:
        return _segment(part, "pass", 0.0)  # the template's tokens only: nothing sampled
    diff = max(diffs)
    return _segment(part, "pass" if diff <= AUDIT_TOLERANCE else "fail", diff)


def _unchecked(parts: list[Segment], exc: Exception) -> list[dict[str, Any]]:
    """The first of ``parts`` could not be scored (``exc``), nor, without its K/V, the rest."""
    status = WEIGHTS_NOT_KEPT if isinstance(exc, WeightsNotKept) else "error"
    needs = f"needs the K/V of version {parts[0].version}, which could not be recomputed"
    return [
        {**_segment(parts[0], status), "problem": str(exc)},
        *({**_segment(part, "not checked"), "problem": needs} for part in parts[1:]),
    ]


def _summary(checked: list[dict[str, Any]]) -> dict[str, Any]:
    """The sample's verdict: pass only if every segment passes."""
    statuses = {segment["status"] for segment in checked}
    diffs = [s["max_abs_diff"] for s in checked if s["max_abs_diff"] is not None]
    if "fail" in statuses:
        status = "fail"
    elif statuses == {"pass"}:
        status = "pass"
    else:
        status = WEIGHTS_NOT_KEPT if WEIGHTS_NOT_KEPT in statuses else "error"
    summary = {"status": status, "max_abs_diff": max(diffs, default=None), "segments": checked}
    problems = [s for s in checked if s.get("problem") and s["status"] != "not checked"]
    if problems:
        summary["problem"] = "; ".join(s["problem"] for s in problems)
    return summary


def _span(part: Segment) -> str:
    return f"tokens {part.first}-{part.last}"


def _checks(parts: list[Segment]) -> str:
    """What the audit of these segments checks, in words."""
    if len(parts) == 1:
        return (
            f"{_span(parts[0])} re-scored under version {parts[0].version} by teacher forcing "
            "(one version sampled every token)"
        )
    each = ", ".join(
        f"{_span(part)} re-scored under version {part.version}"
        if i == 0
        else f"{_span(part)} under version {part.version}"
        + (" (resumed after a preemption: all earlier K/V recomputed)" if part.recomputed else "")
        for i, part in enumerate(parts)
    )
    return (
        f"{each}, each with the K/V of earlier positions computed by the versions that "
        f"computed them in the engine (prompt: v{parts[0].version})"
    )


def audit_samples(
    repo: Repository,
    settings: Settings,
    sample_ids: list[int],
    cancelled: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """The audit of each sample (at most `MAX_AUDIT_SAMPLES`), or ``{"problem": ...}``, also
    when ``cancelled()`` says so before a sample. In-flight samples of one batch replay the same
    two versions: the last `REPLAY_MODELS_KEPT` loaded models serve the next samples too."""
    if not isinstance(sample_ids, list) or not all(isinstance(i, int) for i in sample_ids):
        return {"problem": "sample ids: a list of whole numbers is required"}
    if not 1 <= len(sample_ids) <= MAX_AUDIT_SAMPLES:
        return {"problem": f"audit 1 to {MAX_AUDIT_SAMPLES} samples at a time"}
    reference_model = lru_cache(maxsize=REPLAY_MODELS_KEPT)(
        partial(_reference_model, repo, settings)
    )
    audits = []
    for sample_id in sample_ids:
        if cancelled():
            return {"problem": f"cancelled after {len(audits)} of {len(sample_ids)} samples"}
        audits.append(audit_sample(repo, settings, sample_id, reference_model))
    return {"samples": audits}


def token_diff(
    repo: Repository,
    settings: Settings,
    sample_id: int,
    version_a: int,
    version_b: int,
    job_a: int | None = None,
    job_b: int | None = None,
) -> dict[str, Any]:
    """A stored response scored under version A of job A and version B of job B (each job
    by default the sample's; two jobs must share a tokenizer with the sample:
    `workers.tokenizer_match`): the token ids and each side's log-probs, or
    ``{"problem": ...}`` (e.g. a version whose weights were not kept)."""
    try:
        if not all(isinstance(v, int) for v in (sample_id, version_a, version_b)):
            raise ChatProblem("sample and versions must be whole numbers")
        if not all(j is None or isinstance(j, int) for j in (job_a, job_b)):
            raise ChatProblem("jobs must be whole numbers")
        detail = repo.get_sample(sample_id)
        sides = [(job_a or detail.job_id, version_a), (job_b or detail.job_id, version_b)]
        if not detail.response_token_ids:
            raise ChatProblem(f"sample {sample_id} has no response tokens to score")
        checkpoints = [saved_version(repo, *side).checkpoint_path for side in sides]
        if sides[0][0] != sides[1][0] and (
            problem := _tokenizer_problem(repo, detail, sides, checkpoints)
        ):
            raise ChatProblem(f"jobs {sides[0][0]} and {sides[1][0]}: {problem}")
        temperature = scoring_temperature(repo.get_job(detail.job_id))
        scores = [
            score_response(repo, settings, detail, version, temperature, job)
            for job, version in sides
        ]
    except (ChatProblem, NotFound, WeightsNotKept, ChecksumMismatch, EngineMemoryError) as exc:
        return {"problem": str(exc)}
    return {
        "sample_id": sample_id,
        "job_id": detail.job_id,
        "checkpoint": checkpoints[1],
        "token_ids": list(detail.response_token_ids),
        "logprobs_a": scores[0],
        "logprobs_b": scores[1],
    }


def _tokenizer_problem(
    repo: Repository, detail: SampleDetail, sides: list[tuple[int, int]], checkpoints: list[str]
) -> str | None:
    """Why a sample cannot be scored under versions of two jobs (None: it can): their
    tokenizers differ, or the sample (of a third job: an evaluation of one of them) was
    generated on another tokenizer or on one no checkpoint tells."""
    problem = tokenizer_problem(*checkpoints)
    if problem is not None or detail.job_id in {job for job, _ in sides}:
        return problem
    own = repo.get_version(detail.job_id, detail.policy_version)
    if own is None or not own.checkpoint_path:
        return f"sample {detail.id}'s version records no checkpoint to tell its tokenizer"
    return tokenizer_problem(own.checkpoint_path, checkpoints[0])
