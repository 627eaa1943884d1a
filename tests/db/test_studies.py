"""Studies in storage: looked up by id or name, their jobs made in plan order under the study
row's lock (never more than ``concurrency`` queued or running, never more than ``max_jobs``),
completed when the last one finishes, and deleted without their jobs."""

import threading

import pytest

from db import InvalidValue, JobStatus, Repository, StudyNotFound, StudyStatus
from db.repository.studies import StudyJobRecord, get_study, list_studies, study_job_ids


def _study(repo: Repository, name: str = "lr", **caps: int):
    caps = {"seeds": 2, "max_jobs": 4, "concurrency": 2, **caps}
    return repo.create_study(name, "grid", {"steps": 2}, {"lr": [0.1, 0.2]}, **caps)


def _planned(study, made: int, room: int) -> list[StudyJobRecord]:
    """The plan of a 2-point x 2-seed grid: entry i is point i // 2, seed i % 2."""
    lrs = study.search_space["lr"]
    return [
        StudyJobRecord({"lr": lrs[i // study.seeds], "seed": i % study.seeds}, {"lr": lrs[i // 2]})
        for i in range(made, min(made + room, study.max_jobs))
    ]


def _finish(repo: Repository, job_id: int) -> None:
    repo.mark_running(job_id)
    repo.mark_succeeded(job_id)


def test_a_study_is_found_by_id_and_by_name_and_a_taken_name_is_refused(repo):
    study = _study(repo)
    with repo._read() as session:
        assert get_study(session, study.id).name == "lr"
        assert get_study(session, "lr").id == study.id
        assert [s.id for s in list_studies(session)] == [study.id]
        with pytest.raises(StudyNotFound, match="no study has the name 'other'"):
            get_study(session, "other")
    with pytest.raises(InvalidValue, match="a study named 'lr' exists already"):
        _study(repo)
    with pytest.raises(InvalidValue, match="concurrency: 0"):
        _study(repo, "other", concurrency=0)


def test_jobs_are_made_in_plan_order_within_the_concurrency_until_the_study_completes(repo):
    study = _study(repo)
    study, first = repo.schedule_study(study.id, _planned)
    assert [(j.config, j.study_point) for j in first] == [
        ({"lr": 0.1, "seed": 0}, {"lr": 0.1}),
        ({"lr": 0.1, "seed": 1}, {"lr": 0.1}),
    ]
    assert all(j.study_id == study.id and j.status is JobStatus.QUEUED for j in first)
    assert repo.schedule_study(study.id, _planned)[1] == []  # both slots taken
    _finish(repo, first[0].id)
    study, second = repo.schedule_study(study.id, _planned)
    assert [j.config for j in second] == [{"lr": 0.2, "seed": 0}]
    for job in [first[1], *second]:
        _finish(repo, job.id)
    study, third = repo.schedule_study(study.id, _planned)
    assert [j.config for j in third] == [{"lr": 0.2, "seed": 1}]
    assert study.status is StudyStatus.RUNNING
    _finish(repo, third[0].id)
    study, none = repo.schedule_study(study.id, _planned)
    assert none == [] and study.status is StudyStatus.COMPLETED
    assert study.job_counts == {"succeeded": 4}
    with repo._read() as session:
        assert study_job_ids(session, study.id) == [j.id for j in [*first, *second, *third]]


def test_a_job_deleted_by_hand_is_not_made_again(repo):
    study = _study(repo)
    first = repo.schedule_study(study.id, _planned)[1]
    repo.delete_job(first[1].id)
    study, more = repo.schedule_study(study.id, _planned)
    assert [j.config for j in more] == [{"lr": 0.2, "seed": 0}]  # plan entry 2, not 1 again
    assert study.jobs_made == 3


def test_a_cancelled_study_makes_no_more_jobs(repo):
    study = _study(repo)
    repo.set_study_status(study.id, "cancelled")
    assert repo.schedule_study(study.id, _planned)[1] == []


def test_deleting_a_study_keeps_its_jobs(repo):
    study = _study(repo)
    jobs = repo.schedule_study(study.id, _planned)[1]
    repo.delete_study(study.id)
    with pytest.raises(StudyNotFound):
        repo.get_study(study.id)
    kept = [repo.get_job(job.id) for job in jobs]
    assert [j.config for j in kept] == [j.config for j in jobs]
    assert {j.study_id for j in kept} == {None}


def test_concurrent_schedulers_never_exceed_the_concurrency(repo):
    """Eight threads schedule at once (as eight finishing jobs would): the row lock lets
    exactly ``concurrency`` jobs be made."""
    study = _study(repo, max_jobs=8, seeds=4, concurrency=3)
    barrier, made, errors = threading.Barrier(8), [], []

    def schedule() -> None:
        try:
            barrier.wait()
            made.extend(repo.schedule_study(study.id, _planned)[1])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=schedule) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(made) == 3 and len({j.id for j in made}) == 3
    assert repo.get_study(study.id).job_counts == {"queued": 3}
