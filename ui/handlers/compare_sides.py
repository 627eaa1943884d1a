"""Which samples Compare sets side by side: two versions of one job, or versions of two jobs
that share a tokenizer, from their own samples or else from their held-out comparison."""

from typing import Any

from db import MAX_PAGE_SIZE, InvalidValue, JobInfo, JobStatus, PromptComparison
from ui.handlers.common import parse_id
from ui.services import Services
from workers import api

PROMPTS_SHOWN = 20
NO_PAIRS = (
    "<p>No prompt was answered by both versions (a training job's batches rarely repeat a "
    "prompt). <b>Run the held-out comparison</b> below: both versions answer the same "
    "held-out prompts, and Compare shows them here when it is done.</p>"
)
Side = tuple[int, int]  # (job, version)


def side_names(side_a: Side, side_b: Side) -> dict[str, str]:
    """The sides' names: "version 3", or "job #4 version 200" when they are of two jobs."""
    if side_a[0] == side_b[0]:
        return {"A": f"version {side_a[1]}", "B": f"version {side_b[1]}"}
    return {
        key: f"job #{job} version {version}"
        for key, (job, version) in zip("AB", (side_a, side_b), strict=True)
    }


def chosen_sides(
    services: Services,
    job_id: float | str | None,
    version_a: float | str | None,
    version_b: float | str | None,
    job_b: float | str | None,
) -> tuple[Side, Side]:
    """((job, version A), (job B or the job, version B)), or `InvalidValue` saying why not:
    a version not chosen (a job with fewer than two versions says so), a version its job does
    not have, two jobs that do not share a tokenizer (`shared_tokenizer`)."""
    job, other = parse_id(job_id, "job"), parse_id(job_b, "job B")
    if job is None:
        raise InvalidValue("choose a job and two versions")
    side_a = (job, parse_id(version_a, "version A"))
    side_b = (job if other is None else other, parse_id(version_b, "version B"))
    for side in side_a, side_b:
        _check_version(services, side, alone=side_b[0] == job)
    if side_b[0] != job:
        shared_tokenizer(services, side_a, side_b)
    return side_a, side_b


def _check_version(services: Services, side: tuple[int, int | None], alone: bool) -> None:
    """`InvalidValue` unless the side names a version its job has; ``alone``: both sides are
    of this job, so one with fewer than two versions has nothing to compare yet."""
    job, version = side
    versions = [m.version for m in services.repository.version_metrics(job)]
    if version is None and alone and len(versions) < 2:
        has = f"only version {versions[0]}" if versions else "no version yet"
        raise InvalidValue(
            f"job #{job} has {has}: Compare sets two versions side by side. Wait for its "
            "next version, or choose Job B to compare it with a version of another job"
        )
    if version is None:
        raise InvalidValue("choose a job and two versions")
    if version not in versions:
        listed = (
            ", ".join(map(str, versions))
            if len(versions) <= 6
            else (f"{versions[0]} to {versions[-1]}")
        )
        raise InvalidValue(
            f"job #{job} has no version {version} (its versions: {listed or 'none'})"
        )


def shared_tokenizer(services: Services, side_a: Side, side_b: Side) -> None:
    """`InvalidValue` with the reason unless both versions' checkpoints share a tokenizer
    (the same tokenizer files, or the same vocabulary: `workers.api.tokenizer_problem`); a
    version whose weights are not kept has no tokenizer files to tell."""
    checkpoints = []
    for job, version in side_a, side_b:
        info = services.repository.get_version(job, version)
        if info is None or not api.weights_kept(info):
            raise InvalidValue(
                f"job #{job} version {version}: weights not kept, so its tokenizer cannot be "
                "checked (versions of two jobs are compared only on one tokenizer). Choose a "
                "version whose weights are kept (Samples marks them)"
            )
        checkpoints.append(info.checkpoint_path)
    problem = api.tokenizer_problem(*checkpoints)
    if problem is not None:
        raise InvalidValue(
            f"jobs #{side_a[0]} and #{side_b[0]} do not share a tokenizer: {problem}"
        )


def heldout_job(services: Services, job_id: int, a: int, b: int) -> int | None:
    """The newest succeeded compare job of ``job_id`` over versions ``a`` and ``b``."""
    for job in services.repository.list_jobs(limit=MAX_PAGE_SIZE, kind="compare"):
        config = job.config
        if (
            job.status.value == "succeeded"
            and config.get("job_id") == job_id
            and sorted(config.get("versions", [])) == sorted([a, b])
        ):
            return job.id
    return None


def heldout_pair(services: Services, side_a: Side, side_b: Side) -> tuple[int, int] | None:
    """The newest succeeded evaluate jobs of two jobs' versions on the same held-out prompts:
    one of ``side_a``, and one of ``side_b`` with the same prompt set and sampling."""
    evaluations = [
        job
        for job in services.repository.list_jobs(limit=MAX_PAGE_SIZE, kind="evaluate")
        if job.status is JobStatus.SUCCEEDED
    ]

    def of(side: Side) -> list[JobInfo]:
        return [
            job
            for job in evaluations
            if (job.config.get("job_id"), job.config.get("version")) == side
        ]

    for first in of(side_a):
        for second in of(side_b):
            if _eval_settings(first.config) == _eval_settings(second.config):
                return first.id, second.id
    return None


def _eval_settings(config: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key not in ("job_id", "version")}


def compared_pairs(
    services: Services, side_a: Side, side_b: Side
) -> tuple[list[PromptComparison], str]:
    """The prompts both sides answered in their jobs, else in their newest held-out
    comparison (a compare job of one job, a pair of evaluate jobs of two), with a note saying
    which, else none and a note how to get them."""
    pairs = services.repository.compare_samples(side_a, side_b, limit=PROMPTS_SHOWN)
    if pairs:
        return pairs, ""
    (job, a), (job_b, b) = side_a, side_b
    if job == job_b:
        heldout = heldout_job(services, job, a, b)
        if heldout is None:
            return [], NO_PAIRS
        pairs = services.repository.compare_versions(heldout, a, b, limit=PROMPTS_SHOWN)
        return pairs, f"<p>Held-out prompts answered by both versions (compare job #{heldout}).</p>"
    found = heldout_pair(services, side_a, side_b)
    if found is None:
        return [], NO_PAIRS
    pairs = services.repository.compare_samples((found[0], a), (found[1], b), limit=PROMPTS_SHOWN)
    return pairs, (
        f"<p>Held-out prompts answered by both versions (evaluate jobs #{found[0]} and "
        f"#{found[1]}).</p>"
    )
