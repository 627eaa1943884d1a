"""Reading samples: filtered keyset pages, one sample in full, two versions side by side."""

from collections.abc import Collection
from typing import Any

from sqlalchemy import ColumnElement, Select, func, literal, select, tuple_
from sqlalchemy.orm import Session

from db.enums import BatchStatus, FinishReason, coerce
from db.errors import InvalidValue, SampleNotFound
from db.models import RolloutBatch, Sample
from db.records import SampleDetail, SampleFilter, SamplePage, SampleSummary
from db.repository.base import MAX_PAGE_SIZE, RepositoryBase, check_limit, load_job
from db.repository.episode_filter import ANY_EPISODE, EpisodeFilter, episode_conditions

RARE_MATCHES = 5000
TEXT_SEARCH_ROWS = 10_000  # the samples one page of a text search reads, at most

_SUMMARY_COLUMNS = (
    Sample.id,
    Sample.job_id,
    Sample.batch_id,
    RolloutBatch.status.label("batch_status"),
    Sample.policy_version,
    Sample.prompt_index,
    Sample.group_index,
    Sample.prompt_text,
    Sample.response_text,
    Sample.response_length,
    Sample.finish_reason,
    Sample.error_code,
    Sample.reward,
    Sample.advantage,
    Sample.prompt_messages,
)


def summaries() -> Select[Any]:
    return select(*_SUMMARY_COLUMNS).join(RolloutBatch, RolloutBatch.id == Sample.batch_id)


def summary(row: Any) -> SampleSummary:
    return SampleSummary(**row._mapping)


def _apply_filter(
    statement: Select[Any],
    where: SampleFilter,
    reward: ColumnElement[float] = Sample.reward,
    episode: EpisodeFilter = ANY_EPISODE,
) -> Select[Any]:
    if where.batch_id is None:
        conditions = [Sample.job_id == where.job_id]
    else:
        # The batch fixes the job. Testing the job on the (joined) batch row leaves the
        # samples' batch index as their only access path: a job-led index would read the
        # whole job's samples to find one batch's.
        conditions = [Sample.batch_id == where.batch_id, RolloutBatch.job_id == where.job_id]
    if where.min_version is not None:
        conditions.append(Sample.policy_version >= where.min_version)
    if where.max_version is not None:
        conditions.append(Sample.policy_version <= where.max_version)
    if where.finish_reason is not None:
        finish = coerce(FinishReason, where.finish_reason, "finish_reason")
        conditions.append(Sample.finish_reason == finish)
    if where.error_code is not None:
        conditions.append(Sample.error_code == where.error_code)
    if where.min_reward is not None:
        conditions.append(reward >= where.min_reward)
    if where.max_reward is not None:
        conditions.append(reward <= where.max_reward)
    if where.batch_status is not None:
        status = coerce(BatchStatus, where.batch_status, "batch_status")
        conditions.append(RolloutBatch.status == status)
    if where.min_logprob_gap is not None:
        conditions.append(Sample.logprob_gap_max >= where.min_logprob_gap)
    if (where.component is None) != (where.min_component is None):
        raise InvalidValue("component and min_component are given together")
    if where.component is not None:
        score = Sample.reward_components[where.component].as_float()  # json_extract / ->>
        conditions.append(score >= where.min_component)
    return statement.where(*conditions, *episode_conditions(episode))


def _reward_is_rare(session: Session, where: SampleFilter) -> bool:
    """Whether fewer than `RARE_MATCHES` of the job's samples are in the reward range
    (counted on the reward index, so it reads at most that many index entries).

    Planners without histograms (SQLite) take any range as selective and would read a dense
    range through the reward index, then sort it; a dense range is better served by reading
    in page order and skipping the misses, a rare one by the reward index. This bounded probe
    decides.
    """
    reward_only = SampleFilter(
        where.job_id, min_reward=where.min_reward, max_reward=where.max_reward
    )
    probe = _apply_filter(select(Sample.id), reward_only).limit(RARE_MATCHES)
    matches = select(func.count()).select_from(probe.subquery())
    return session.scalar(matches) < RARE_MATCHES


def _scan(
    where: SampleFilter,
    cursor: str | None,
    newest_first: bool,
    reward_index: bool,
    episode: EpisodeFilter,
) -> Select[Any]:
    """The summaries matching ``where`` but its text, and ``episode``, after ``cursor``, in
    page order."""
    key = tuple_(Sample.policy_version, Sample.id)
    reward = Sample.reward if reward_index else Sample.reward + 0
    statement = _apply_filter(summaries(), where, reward, episode)
    if cursor is not None:
        after = tuple_(*(literal(part) for part in _parse_cursor(cursor)))
        statement = statement.where(key < after if newest_first else key > after)
    return _in_page_order(statement, Sample.policy_version, Sample.id, newest_first)


def _in_page_order(
    statement: Select[Any], version: Any, sample_id: Any, newest_first: bool
) -> Select[Any]:
    if newest_first:
        return statement.order_by(version.desc(), sample_id.desc())
    return statement.order_by(version, sample_id)


def page_statement(
    where: SampleFilter,
    cursor: str | None,
    newest_first: bool,
    *,
    reward_index: bool = True,
    episode: EpisodeFilter = ANY_EPISODE,
) -> Select[Any]:
    """The summaries matching ``where`` and ``episode`` after ``cursor``, in page order
    (without a limit). Without ``reward_index`` the reward filter cannot use an index (see
    `_reward_is_rare`). The ``text`` filter reads only the next `TEXT_SEARCH_ROWS` samples
    that match the rest."""
    statement = _scan(where, cursor, newest_first, reward_index, episode)
    if not where.text:
        return statement
    window = statement.limit(TEXT_SEARCH_ROWS).subquery()  # no plan can read more
    text = window.c.prompt_text.icontains(where.text, autoescape=True) | (
        window.c.response_text.icontains(where.text, autoescape=True)
    )
    matches = select(window).where(text)
    return _in_page_order(matches, window.c.policy_version, window.c.id, newest_first)


def _last_searched(
    where: SampleFilter,
    cursor: str | None,
    newest_first: bool,
    reward_index: bool,
    episode: EpisodeFilter,
) -> Select[Any]:
    """The keys of the last sample `page_statement` reads for a text search and of the one
    after it: two rows where samples are left unread, fewer where it reads to the end."""
    statement = _scan(where, cursor, newest_first, reward_index, episode)
    columns = statement.with_only_columns(Sample.policy_version, Sample.id)
    return columns.offset(TEXT_SEARCH_ROWS - 1).limit(2)


def _parse_cursor(cursor: str) -> tuple[int, int]:
    version, _, sample_id = cursor.partition(":")
    try:
        return int(version), int(sample_id)
    except ValueError:
        raise InvalidValue(f"cursor: {cursor!r} is not a cursor from a previous page") from None


def _load_sample(session: Session, sample_id: int) -> Sample:
    sample = session.get(Sample, sample_id)
    if sample is None:
        raise SampleNotFound(sample_id)
    return sample


class SamplesMixin(RepositoryBase):
    def list_samples(
        self,
        where: SampleFilter,
        *,
        cursor: str | None = None,
        limit: int = 50,
        newest_first: bool = False,
        episode: EpisodeFilter = ANY_EPISODE,
    ) -> SamplePage:
        """One page of the job's samples matching ``where`` (and ``episode``, on multi-turn
        episodes), ordered by (policy version, sample id), ascending or, with
        ``newest_first``, descending. Pass the page's ``next_cursor`` to get the next page;
        pages never repeat or skip a stored sample.

        A ``text`` search reads at most `TEXT_SEARCH_ROWS` samples per page: where they do
        not fill the page, it says so (``searched``) and the next page searches on."""
        check_limit(limit)
        probe = where.batch_id is None and (
            where.min_reward is not None or where.max_reward is not None
        )
        resume_at = None  # where a text search that stopped at its bound goes on
        with self._read() as session:
            load_job(session, where.job_id)
            reward_index = probe and _reward_is_rare(session, where)
            statement = page_statement(
                where, cursor, newest_first, reward_index=reward_index, episode=episode
            )
            rows = session.execute(statement.limit(limit + 1)).all()
            if where.text and len(rows) <= limit:
                last = _last_searched(where, cursor, newest_first, reward_index, episode)
                last_read = session.execute(last).all()
                if len(last_read) == 2:  # samples are left unread
                    resume_at = last_read[0]
        items = [summary(row) for row in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            next_cursor = f"{items[-1].policy_version}:{items[-1].id}"
        elif resume_at is not None:
            next_cursor = f"{resume_at.policy_version}:{resume_at.id}"
        searched = None if resume_at is None else TEXT_SEARCH_ROWS
        return SamplePage(items=items, next_cursor=next_cursor, searched=searched)

    def get_sample(self, sample_id: int) -> SampleDetail:
        """Everything stored about one sample, per-token arrays included."""
        with self._read() as session:
            sample = _load_sample(session, sample_id)
            return SampleDetail(
                id=sample.id,
                job_id=sample.job_id,
                batch_id=sample.batch_id,
                batch_status=sample.batch.status,
                policy_version=sample.policy_version,
                prompt_index=sample.prompt_index,
                group_index=sample.group_index,
                prompt_text=sample.prompt_text,
                prompt_messages=sample.prompt_messages,
                reference_output=sample.reference_output,
                response_text=sample.response_text,
                response_token_ids=sample.response_token_ids,
                behaviour_logprobs=sample.behaviour_logprobs,
                temperature_logprobs=sample.temperature_logprobs,
                finish_reason=sample.finish_reason,
                error_code=sample.error_code,
                error_message=sample.error_message,
                reward=sample.reward,
                advantage=sample.advantage,
                cached_prompt_tokens=sample.cached_prompt_tokens,
                seed=sample.seed,
                trainer_logprobs=sample.trainer_logprobs,
                reward_components=sample.reward_components,
                token_versions=sample.token_versions,
                resumed_at=sample.resumed_at,
                segments=sample.segments,
                episode_finish=sample.episode_finish,
                turns=sample.turns,
                tool_errors=sample.tool_errors,
                rank=sample.rank,
                loss_ratios=sample.loss_ratios,
                loss_weights=sample.loss_weights,
                loss_flags=sample.loss_flags,
            )

    def random_sample_ids(self, job_id: int, count: int, versions: Collection[int]) -> list[int]:
        """Up to ``count`` ids of the job's samples with a response, drawn at random from
        those of ``versions`` (at most `MAX_PAGE_SIZE` of them, e.g. the versions whose
        weights were kept), oldest version first."""
        check_limit(count)
        if len(versions) > MAX_PAGE_SIZE:
            raise InvalidValue(f"versions: {len(versions)} is more than {MAX_PAGE_SIZE}")
        statement = (
            select(Sample.id, Sample.policy_version)
            .where(
                Sample.job_id == job_id,
                Sample.policy_version.in_(sorted(versions)),
                Sample.response_length > 0,
            )
            .order_by(func.random())
            .limit(count)
        )
        with self._read() as session:
            load_job(session, job_id)
            rows = session.execute(statement).all()
        return [row.id for row in sorted(rows, key=lambda row: (row.policy_version, row.id))]
