"""Studies over the queue with eager tasks: a grid x seeds study runs every planned job with
its point and seed, never more than its concurrency at once, and completes; an Optuna study's
pruned job ends ``pruned`` with its versions and checkpoints recorded, and resumes; caps and
bad tables are refused with the reason before anything is stored."""

import itertools
import json
import tomllib
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from db import JobStatus, Repository, StudyStatus, upgrade
from db.migrate import heads
from tests.workers.helpers import train_config
from workers import app as worker_app
from workers import commands, studies, study_trials
from workers.app import app
from workers.specs import HELDOUT_METRIC, SpecError
from workers.study_commands import split_study_file
from workers.study_spec import parse_study
from workers.submission import resume_job

DEMO = {**train_config("demo", task="addition", steps=1, batch_size=2, group_size=2)}
DEMO |= {"max_tokens": 6, "heldout_every": 1, "heldout_prompts": 2}


@pytest.fixture
def eager(env, monkeypatch):
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    monkeypatch.setattr(app.control, "revoke", lambda task_id, **_: None)


def test_a_grid_of_two_fields_with_two_seeds_runs_its_eight_jobs_and_completes(
    eager, repo, monkeypatch
):
    occupied = []  # the study's queued or running jobs each time one of its jobs is sent
    send = worker_app.enqueue

    def counting(celery, repository, job):
        counts = repository.get_study(job.study_id).job_counts
        occupied.append(counts.get("queued", 0) + counts.get("running", 0))
        return send(celery, repository, job)

    monkeypatch.setattr(worker_app, "enqueue", counting)
    grid = {"lr": [0.001, 0.003], "temperature": [0.7, 1.0]}
    table = {"name": "grid", "grid": grid, "seeds": 2, "seed": 5, "concurrency": 2}
    study = studies.run_study(dict(DEMO), table)

    study = repo.get_study(study.id)
    assert study.status is StudyStatus.COMPLETED and study.job_counts == {"succeeded": 8}
    jobs = repo.study_jobs(study.id)
    expected = [
        ({"lr": lr, "temperature": t}, seed)
        for (lr, t), seed in itertools.product(itertools.product(*grid.values()), (5, 6))
    ]
    assert [(j.study_point, j.config["seed"]) for j in jobs] == expected
    assert all(j.config == {**DEMO, **j.study_point, "seed": j.config["seed"]} for j in jobs)
    assert max(occupied) == 2 and len(occupied) == 8
    for job in jobs:
        assert [v.version for v in repo.list_versions(job.id)] == [0, 1]


# An Optuna study of one trial, pruned by the median of an earlier trial at every version past
# the first (the test adds that trial: it scored 2.0, above any accuracy, at every version).
PRUNED_TABLE = {
    "name": "tuned",
    "kind": "optuna",
    "ranges": {"lr": {"low": 0.001, "high": 0.01, "log": True}},
    "samples": 1,
    "pruner": "median",
    "pruner_warmup": 1,
    "pruner_startup": 1,
}


def test_an_optuna_pruned_job_ends_pruned_with_its_record_complete_and_resumes(
    eager, repo, monkeypatch
):
    table, config = PRUNED_TABLE, {**DEMO, "steps": 3}
    made = studies.advance_study

    def seeded(celery, repository, study_id):  # before the first job: an earlier, better trial
        tuned = study_trials.optuna_study(repository, repository.get_study(study_id))
        if not tuned.trials:
            tuned.add_trial(
                optuna.trial.create_trial(
                    params={"lr": 0.005},
                    distributions=study_trials.distributions(parse_study(table, config)),
                    value=2.0,
                    intermediate_values={v: 2.0 for v in range(4)},
                )
            )
        return made(celery, repository, study_id)

    monkeypatch.setattr(studies, "advance_study", seeded)
    study = studies.run_study(config, table)

    job = repo.study_jobs(study.id)[0]
    assert job.status is JobStatus.PRUNED
    assert job.error.startswith("pruned by the study's median pruner at version 1")
    versions = repo.list_versions(job.id)
    assert [v.version for v in versions] == [0, 1]  # stopped at version 1's step boundary
    assert all(HELDOUT_METRIC in v.metrics.extra for v in versions)
    assert versions[1].checkpoint_path and versions[1].weights_checksum
    tuned = study_trials.optuna_study(repo, repo.get_study(study.id))
    trial = tuned.trials[job.study_trial]
    assert trial.state is optuna.trial.TrialState.PRUNED
    assert trial.intermediate_values == {
        v.version: v.metrics.extra[HELDOUT_METRIC] for v in versions
    }
    assert repo.get_study(study.id).status is StudyStatus.COMPLETED

    resume_job(job.id)  # the pruner's word is not final: it trains on
    resumed = repo.get_job(job.id)
    assert resumed.status is JobStatus.SUCCEEDED
    assert [v.version for v in repo.list_versions(job.id)] == [0, 1, 2, 3]


def test_caps_and_bad_tables_are_refused_with_the_reason_and_nothing_is_stored(
    eager, repo, monkeypatch
):
    monkeypatch.setenv("RLWB_STUDY_MAX_JOBS", "6")
    monkeypatch.setenv("RLWB_STUDY_MAX_CONCURRENCY", "2")
    grid = {"lr": [0.001, 0.003], "temperature": [0.7, 1.0]}
    with pytest.raises(SpecError, match=r"plans 8 jobs, above the limit of 6 \(RLWB_STUDY_MAX"):
        studies.run_study(dict(DEMO), {"name": "big", "grid": grid, "seeds": 2})
    with pytest.raises(SpecError, match="asks for 3 jobs at once, above the limit of 2"):
        studies.run_study(dict(DEMO), {"name": "wide", "grid": grid, "concurrency": 3})
    with pytest.raises(SpecError, match="vary the seed with 'seeds'"):
        studies.run_study(dict(DEMO), {"name": "s", "grid": {"seed": [1, 2]}})
    with pytest.raises(SpecError, match="'colour' is not a job field"):
        studies.run_study(dict(DEMO), {"name": "c", "grid": {"colour": [1]}})
    with pytest.raises(SpecError, match=r"study point \{'lr': -1.0, 'seed': 0\}: .*lr"):
        studies.run_study(dict(DEMO), {"name": "neg", "grid": {"lr": [0.001, -1.0]}})
    assert repo.list_studies() == [] and repo.list_jobs() == []


STUDY_FILE = """
model = "demo"
task = "addition"
steps = 1
batch_size = 2
group_size = 2
max_tokens = 6

[study]
name = "cli"
grid = { lr = [0.001, 0.003] }
seeds = 2
concurrency = 2
"""


def test_the_cli_runs_cancels_and_resumes_a_study_from_a_job_file(
    env, repo, monkeypatch, capsys, tmp_path
):
    """No worker takes the jobs here: each send is recorded, the jobs stay queued."""
    sent = []
    monkeypatch.setattr(worker_app, "send", lambda celery, job, task_id: sent.append(job.id))
    path = tmp_path / "study.toml"
    path.write_text(STUDY_FILE)

    assert commands.main(["study", "run", str(path)]) == 0
    first = [job.id for job in repo.study_jobs(repo.get_study("cli").id)]
    assert sent == first and len(first) == 2  # the concurrency: point 1's two seeds
    out = capsys.readouterr().out
    assert out.startswith("study cli (grid, running): 2/4 jobs made, 2 at once  queued 2")
    assert f"{first[1]:>6}  lr=0.001  seed=1  queued" in out

    assert commands.main(["study", "cancel", "cli"]) == 0
    study = repo.get_study("cli")
    assert study.status is StudyStatus.CANCELLED and study.job_counts == {"cancelled": 2}

    assert commands.main(["study", "resume", "cli"]) == 0
    study = repo.get_study("cli")
    assert study.status is StudyStatus.RUNNING and study.job_counts == {"queued": 2}
    assert sent == first + first  # the same two jobs again, nothing new beyond the room
    capsys.readouterr()

    assert commands.main(["study", "status", "nope"]) == 1
    assert capsys.readouterr().out == "refused: no study has the name 'nope'\n"
    path.write_text(STUDY_FILE.split("[study]")[0])
    assert commands.main(["study", "run", str(path)]) == 1
    assert capsys.readouterr().out == "refused: a study's job file needs a [study] table\n"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_optunas_tables_live_beside_the_workbenchs_and_never_among_them(backend, request, tmp_path):
    """Both have a ``studies`` and an ``alembic_version`` table: Optuna's storage is the file
    beside a SQLite database, a schema of its own on PostgreSQL."""
    if backend == "sqlite":
        url = sa.make_url(f"sqlite:///{tmp_path / 'rlwb.db'}")
    else:
        url = request.getfixturevalue("postgres_schemas").create()
    upgrade(url)
    repo = Repository.from_url(url)
    repo.create_study("ours", "grid", {}, {}, seeds=1, max_jobs=1, concurrency=1)
    storage = optuna.storages.RDBStorage(study_trials.optuna_url(repo))
    optuna.create_study(study_name="theirs", storage=storage)
    try:
        with repo.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT name FROM studies").scalars().all() == [
                "ours"
            ]
            revision = connection.exec_driver_sql("SELECT version_num FROM alembic_version")
            assert revision.scalar() == heads()[0]
        assert optuna.get_all_study_names(storage) == ["theirs"]
        if backend == "sqlite":
            assert Path(storage.engine.url.database) == tmp_path / "rlwb-optuna.db"
    finally:
        storage.engine.dispose()
        if backend == "postgresql":
            with repo.engine.begin() as connection:
                schema = connection.exec_driver_sql("SELECT current_schema()").scalar()
                connection.exec_driver_sql(f'DROP SCHEMA "{schema}_optuna" CASCADE')
        repo.close()


def test_the_documented_study_file_is_a_study_of_twelve_jobs():
    text = (Path(__file__).resolve().parents[2] / "docs" / "studies.md").read_text()
    config = tomllib.loads(text.split("```toml\n", 1)[1].split("```", 1)[0])
    spec = parse_study(*reversed(split_study_file(config)))
    assert (spec.name, spec.planned_jobs, spec.concurrency) == ("lr-temp", 12, 2)


def test_a_random_study_draws_its_points_in_their_ranges_and_a_clone_draws_the_same(
    env, repo, monkeypatch
):
    monkeypatch.setattr(worker_app, "send", lambda celery, job, task_id: None)  # no worker
    ranges = {
        "lr": {"low": 0.0001, "high": 0.01, "log": True},
        "group_size": {"low": 2, "high": 4},
        "clip_eps": {"choices": [0.2, 0.28]},
    }
    table = {"name": "drawn", "kind": "random", "ranges": ranges, "samples": 4}
    table |= {"concurrency": 4, "seed": 3}
    study = studies.run_study(dict(DEMO), table)
    points = [job.study_point for job in repo.study_jobs(study.id)]
    assert len(points) == 4 and len({json.dumps(p, sort_keys=True) for p in points}) == 4
    for point in points:
        assert 0.0001 <= point["lr"] <= 0.01
        assert isinstance(point["group_size"], int) and 2 <= point["group_size"] <= 4
        assert point["clip_eps"] in (0.2, 0.28)
    assert {job.config["seed"] for job in repo.study_jobs(study.id)} == {3}

    clone = studies.clone_study("drawn", "drawn-again")
    assert [job.study_point for job in repo.study_jobs(clone.id)] == points
    assert repo.get_study(clone.id).base_config == repo.get_study(study.id).base_config


def test_an_optuna_study_tells_each_trial_its_jobs_last_heldout_score(eager, repo):
    table = {"name": "tpe", "kind": "optuna", "samples": 2}
    table["ranges"] = {"lr": {"low": 0.001, "high": 0.01, "log": True}}
    study = studies.run_study({**DEMO, "steps": 2}, table)

    study = repo.get_study(study.id)
    assert study.status is StudyStatus.COMPLETED and study.job_counts == {"succeeded": 2}
    trials = study_trials.optuna_study(repo, study).trials
    for job in repo.study_jobs(study.id):
        trial = trials[job.study_trial]
        last = repo.list_versions(job.id)[-1]
        assert trial.state is optuna.trial.TrialState.COMPLETE
        assert trial.value == last.metrics.extra[HELDOUT_METRIC] and last.version == 2
        assert trial.params == job.study_point and job.config["lr"] == trial.params["lr"]
