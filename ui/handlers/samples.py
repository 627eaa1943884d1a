"""Samples tab: filtered keyset pages, one sample in full, and rejected batches."""

import time
from dataclasses import asdict
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from db import (
    BatchInfo,
    BatchNotFound,
    BatchStatus,
    EpisodeFilter,
    EpisodeFinish,
    FinishReason,
    InvalidValue,
    JobInfo,
    NotFound,
    SampleDetail,
    SampleFilter,
)
from ui.devices import job_devices
from ui.diagnostics import DEFAULT_CLIP_EPS, diagnostics_html
from ui.episodes import episode_html
from ui.handlers.common import parse_id, parse_number
from ui.handlers.jobs import batches_table, latest_batches
from ui.handlers.reward_form import reward_weights
from ui.render import inert, sample_html
from ui.sample_rows import kept_versions, samples_frame
from ui.services import Services
from ui.token_versions import LOGPROB, VERSION, version_response, versions_html
from ui.tokens import token_texts

PAGE_SIZE = 50
ANY = "any"
FINISH_CHOICES = [ANY, *(reason.value for reason in FinishReason)]
STATUS_CHOICES = [ANY, *(status.value for status in BatchStatus)]
EPISODE_FINISH_CHOICES = [ANY, *(finish.value for finish in EpisodeFinish)]
Page = tuple[pd.DataFrame, dict[str, Any], str]


def sample_filter(
    job_id: float | str | None,
    min_version: float | str | None,
    max_version: float | str | None,
    finish_reason: str,
    error_code: str,
    min_reward: float | str | None,
    max_reward: float | str | None,
    batch_status: str,
    text: str,
    min_logprob_gap: float | str | None = None,
    component: str | None = None,
    min_component: float | str | None = None,
) -> SampleFilter:
    """The repository filter for the form (empty fields: any); `InvalidValue` for an
    unreadable or empty one."""
    job = parse_id(job_id, "job")
    if job is None:
        raise InvalidValue("choose a job")
    versions = parse_id(min_version, "min version"), parse_id(max_version, "max version")
    rewards = parse_number(min_reward, "min reward"), parse_number(max_reward, "max reward")
    if None not in versions and versions[0] > versions[1]:
        raise InvalidValue("the version range is empty (min > max)")
    if None not in rewards and rewards[0] > rewards[1]:
        raise InvalidValue("the reward range is empty (min > max)")
    gap = parse_number(min_logprob_gap, "min |log ratio|")
    if gap is not None and gap < 0:
        raise InvalidValue(f"min |log ratio|: {min_logprob_gap!r} is negative")
    least = parse_number(min_component, "min component")
    component = (component or "").strip() or None
    if (component is None) != (least is None):
        raise InvalidValue("choose a reward component and its minimum together")
    return SampleFilter(
        job_id=job,
        min_version=versions[0],
        max_version=versions[1],
        finish_reason=None if finish_reason in ("", ANY) else finish_reason,
        error_code=error_code.strip() or None,
        min_reward=rewards[0],
        max_reward=rewards[1],
        batch_status=None if batch_status in ("", ANY) else batch_status,
        text=text.strip() or None,
        min_logprob_gap=gap,
        component=component,
        min_component=least,
    )


def episode_filter(
    episode_finish: str | None, min_turns: float | str | None, with_tool_errors: bool
) -> EpisodeFilter:
    """The repository's episode filter for the form (empty fields: any sample, single turns
    included); `InvalidValue` for an unreadable minimum."""
    return EpisodeFilter(
        episode_finish=None if episode_finish in (None, "", ANY) else episode_finish,
        min_turns=parse_id(min_turns, "min turns"),
        with_tool_errors=bool(with_tool_errors),
    )


def _render(services: Services, state: dict[str, Any]) -> Page:
    """The page ``state`` points at, with an info line; remembers the next page's cursor."""
    start = time.perf_counter()
    page = services.repository.list_samples(
        SampleFilter(**state["filter"]),
        cursor=state["cursors"][state["index"]],
        limit=PAGE_SIZE,
        newest_first=state["newest_first"],
        episode=EpisodeFilter(**state["episode"]),
    )
    cursors = state["cursors"][: state["index"] + 1]
    if page.next_cursor is not None:
        cursors.append(page.next_cursor)
    state = {**state, "cursors": cursors}
    frame = samples_frame(page.items, kept_versions(services, page.items))
    where_text = "more on the next page" if page.next_cursor else "last page"
    if page.searched is not None:
        where_text = (
            f"searched {page.searched:,} samples for this page: refine your search (versions, "
            "reward, finish reason) or open the next page to search on"
        )
    if state["batch"] is not None:
        batch = state["batch"]
        where_text = (
            f"batch {batch['id']} ({batch['status']}): {batch['reasons'] or 'no reasons'} · "
            f"{where_text}"
        )
    info = (
        f"Page {state['index'] + 1} · {len(frame)} samples · {where_text} · "
        f"{time.perf_counter() - start:.3f} s"
    )
    return frame, state, inert(info)


def _failed(message: str, state: dict[str, Any] | None = None) -> Page:
    return samples_frame([]), state or {}, f"**{inert(message)}**"


def search_samples(
    services: Services,
    job_id: float | str | None,
    min_version: float | str | None,
    max_version: float | str | None,
    finish_reason: str,
    error_code: str,
    min_reward: float | str | None,
    max_reward: float | str | None,
    batch_status: str,
    text: str,
    newest_first: bool,
    min_logprob_gap: float | str | None = None,
    component: str | None = None,
    min_component: float | str | None = None,
    episode_finish: str | None = ANY,
    min_turns: float | str | None = None,
    with_tool_errors: bool = False,
) -> Page:
    """The first page of the job's samples matching the filters (a keyset page of 50), those
    on multi-turn episodes (`episode_filter`) included."""
    try:
        where = sample_filter(
            job_id,
            min_version,
            max_version,
            finish_reason,
            error_code,
            min_reward,
            max_reward,
            batch_status,
            text,
            min_logprob_gap,
            component,
            min_component,
        )
        episode = episode_filter(episode_finish, min_turns, with_tool_errors)
        state = {
            "filter": asdict(where),
            "episode": asdict(episode),
            "newest_first": bool(newest_first),
            "cursors": [None],
            "index": 0,
            "batch": None,
        }
        return _render(services, state)
    except (InvalidValue, NotFound) as exc:
        return _failed(str(exc))


def turn_page(services: Services, state: dict[str, Any] | None, step: int) -> Page:
    """The next (``step`` 1) or previous (``step`` -1) page of the last search."""
    if not state:
        return _failed("Search first.")
    index = min(max(state["index"] + step, 0), len(state["cursors"]) - 1)
    try:
        return _render(services, {**state, "index": index})
    except NotFound as exc:
        return _failed(str(exc), state)


def _job_batch(services: Services, job_id: int, batch_id: int) -> BatchInfo | None:
    """Batch ``batch_id`` if it belongs to job ``job_id``."""
    try:
        batch = services.repository.get_batch(batch_id)
    except BatchNotFound:
        return None
    return batch if batch.job_id == job_id else None


def batch_samples(services: Services, job_id: float | str | None, batch_id: float | None) -> Page:
    """The samples of one batch of the job (a rejected batch, typically), page by page, with
    its reasons."""
    try:
        job, chosen = parse_id(job_id, "job"), parse_id(batch_id, "batch")
        if job is None or chosen is None:
            return _failed("Choose a job and a batch.")
        batch = _job_batch(services, job, chosen)
        if batch is None:
            return _failed(f"job {job} has no batch {chosen}")
        state = {
            "filter": asdict(SampleFilter(job, batch_id=batch.id)),
            "episode": asdict(EpisodeFilter()),
            "newest_first": False,
            "cursors": [None],
            "index": 0,
            "batch": {
                "id": batch.id,
                "status": batch.status.value,
                "reasons": "; ".join(batch.rejection_reasons),
            },
        }
        return _render(services, state)
    except (InvalidValue, NotFound) as exc:
        return _failed(str(exc))


def rejected_batches(services: Services, job_id: float | str | None) -> pd.DataFrame:
    """The job's latest rejected batches with their reasons."""
    try:
        job = parse_id(job_id, "job")
        batches = [] if job is None else latest_batches(services, job, BatchStatus.REJECTED)
    except (InvalidValue, NotFound):
        batches = []
    return batches_table(batches)


def sample_detail(
    services: Services, sample_id: float | str | None, colour_by: str = LOGPROB
) -> str:
    """One sample in full, as HTML: prompt messages, reference, coloured response tokens
    (hover: token id and log-probs), reward, advantage, finish/error, version, rank, cache, the
    versions of its tokens (the response coloured by version instead of log-prob when
    ``colour_by`` is `VERSION`), and per-token training diagnostics of a trained sample. An
    episode's response is its conversation (`episode_html`)."""
    try:
        chosen = parse_id(sample_id, "sample")
        if chosen is None:
            return "<p>Choose a sample.</p>"
        detail = services.repository.get_sample(chosen)
        job = services.repository.get_job(detail.job_id)
    except (InvalidValue, NotFound) as exc:
        return f"<p><b>{escape(str(exc))}</b></p>"
    texts = token_texts(detail.response_token_ids, _checkpoints(services, job, detail))
    clip_eps = job.config.get("clip_eps", DEFAULT_CLIP_EPS)
    weights = reward_weights(job.config.get("reward"))
    response = None
    if detail.segments is not None:
        response = episode_html(detail, texts, colour_by)
    elif colour_by == VERSION:
        response = version_response(detail, texts)
    return (
        sample_html(detail, texts, weights, response, job_devices(job.config))
        + versions_html(detail, colour_by)
        + diagnostics_html(detail, texts, clip_eps)
    )


def component_choices(services: Services, job_id: float | str | None) -> list[str]:
    """The reward components a job's samples have: the names of its reward list."""
    try:
        chosen = parse_id(job_id, "job")
        job = None if chosen is None else services.repository.get_job(chosen)
    except (InvalidValue, NotFound):
        return []
    return [] if job is None else list(reward_weights(job.config.get("reward")))


def open_sample(
    services: Services, sample_id: float | str | None, colour_by: str = LOGPROB
) -> tuple[str, str]:
    """The sample in full (`sample_detail`) and an empty audit verdict: a verdict belongs to
    the sample it was run on, so it goes when another sample is opened."""
    return sample_detail(services, sample_id, colour_by), ""


def _checkpoints(services: Services, job: JobInfo, detail: SampleDetail) -> list[Path]:
    """Where the sample's tokenizer may be: its version's checkpoint, the job's other
    checkpoints, then the job's model directory."""
    versions = sorted(
        services.repository.list_versions(job.id), key=lambda v: v.version != detail.policy_version
    )
    paths = [v.checkpoint_path for v in versions] + [job.config.get("model")]
    return [Path(path) for path in paths if isinstance(path, str)]
