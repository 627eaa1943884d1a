"""Samples side by side: the prompts two (job, version) sides both answered."""

from collections import defaultdict
from typing import Any, Literal

from sqlalchemy import case, distinct, func, select

from db.errors import InvalidValue
from db.models import Sample
from db.records import PromptComparison, SampleSummary
from db.repository.base import RepositoryBase, check_limit, load_job
from db.repository.samples import summaries, summary


class ComparisonsMixin(RepositoryBase):
    def compare_versions(
        self,
        job_id: int,
        version_a: int,
        version_b: int,
        *,
        match_on: Literal["prompt_text", "prompt_index"] = "prompt_text",
        limit: int = 20,
        offset: int = 0,
    ) -> list[PromptComparison]:
        """The prompts that both versions of the job answered (`compare_samples`)."""
        return self.compare_samples(
            (job_id, version_a), (job_id, version_b), match_on=match_on, limit=limit, offset=offset
        )

    def compare_samples(
        self,
        side_a: tuple[int, int],
        side_b: tuple[int, int],
        *,
        match_on: Literal["prompt_text", "prompt_index"] = "prompt_text",
        limit: int = 20,
        offset: int = 0,
    ) -> list[PromptComparison]:
        """The prompts answered by both sides, each a (job, version): two versions of one
        job, or versions of two jobs (say two runs' evaluations on the same held-out prompts),
        with each side's samples, ordered by prompt index; page through them with ``limit``
        and ``offset``."""
        if match_on not in ("prompt_text", "prompt_index"):
            raise InvalidValue(f"match_on: {match_on!r} is not prompt_text or prompt_index")
        if side_a == side_b:
            raise InvalidValue("compare two different versions (or versions of two jobs)")
        check_limit(limit)
        if offset < 0:
            raise InvalidValue(f"offset: {offset} is negative")
        key = getattr(Sample, match_on)
        is_a = (Sample.job_id == side_a[0]) & (Sample.policy_version == side_a[1])
        is_b = (Sample.job_id == side_b[0]) & (Sample.policy_version == side_b[1])
        side = case((is_a, 0), else_=1)
        in_both = (
            select(key.label("key"), func.min(Sample.prompt_index).label("first_index"))
            .where(is_a | is_b)
            .group_by(key)
            .having(func.count(distinct(side)) == 2)
            .order_by("first_index", "key")
            .limit(limit)
            .offset(offset)
            .subquery()
        )
        statement = (
            summaries()
            .join(in_both, in_both.c.key == key)
            .where(is_a | is_b)
            .order_by(in_both.c.first_index, in_both.c.key, Sample.group_index, Sample.id)
        )
        with self._read() as session:
            for job_id in {side_a[0], side_b[0]}:
                load_job(session, job_id)
            rows = session.execute(statement).all()
        grouped: dict[Any, tuple[list[SampleSummary], list[SampleSummary]]] = defaultdict(
            lambda: ([], [])
        )
        for row in rows:
            sample = summary(row)
            of_a = (sample.job_id, sample.policy_version) == side_a
            grouped[getattr(sample, match_on)][0 if of_a else 1].append(sample)
        return [
            PromptComparison(
                prompt_index=samples_a[0].prompt_index,
                prompt_text=samples_a[0].prompt_text,
                samples_a=samples_a,
                samples_b=samples_b,
            )
            for samples_a, samples_b in grouped.values()
        ]
