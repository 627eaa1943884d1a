"""An Optuna study with the successive-halving pruner, eager tasks: each job reports its held-out
score at every version, and the jobs that stop, and where, are the ones Optuna's own
``SuccessiveHalvingPruner`` stops when the scores the database recorded are replayed into a
fresh in-memory study; a stopped job ends ``pruned`` (not failed nor cancelled), its trial
pruned, its versions and checkpoints recorded up to the stop, and it resumes to the end.

The held-out scores are scripted per job (`HeldoutEval.scores` replaced; the jobs run one after
another, the study's concurrency being 1) so that one job runs to its end, one is stopped at the
first rung (version 1) and one at the second (version 4: the pruner's reduction factor 4)."""

import optuna
import pytest

from db import JobStatus, StudyStatus
from tests.workers.helpers import train_config
from workers import studies, study_trials
from workers.app import app
from workers.evaluation import HeldoutEval
from workers.specs import HELDOUT_METRIC
from workers.submission import resume_job

STEPS = 5
CONFIG = {**train_config("demo", task="addition", steps=STEPS, batch_size=2, group_size=2)}
CONFIG |= {"max_tokens": 6, "heldout_every": 1, "heldout_prompts": 2}
TABLE = {
    "name": "halving",
    "kind": "optuna",
    "ranges": {"lr": {"low": 0.001, "high": 0.01, "log": True}},
    "samples": 3,
    "pruner": "successive_halving",
    "pruner_warmup": 1,
}
# Each job's held-out score at versions 0..STEPS, in the order the jobs run.
SCRIPTS = (
    (0.2, 0.5, 0.5, 0.5, 0.6, 0.7),
    (0.2, 0.3, 0.9, 0.9, 0.9, 0.9),
    (0.2, 0.6, 0.6, 0.6, 0.4, 0.8),
)


@pytest.fixture
def scripted(env, monkeypatch):
    """Tasks run inside their send; each job's held-out evaluation answers its script."""
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    monkeypatch.setattr(app.control, "revoke", lambda task_id, **_: None)
    evaluations: list[tuple[HeldoutEval, list[float]]] = []

    def scores(self, engine):
        script = next((s for e, s in evaluations if e is self), None)
        if script is None:  # a job's first evaluation: the next script
            script = list(SCRIPTS[len(evaluations) % len(SCRIPTS)])
            evaluations.append((self, script))
        return {HELDOUT_METRIC: script.pop(0)}

    monkeypatch.setattr(HeldoutEval, "scores", scores)


def optunas_verdicts(recorded: list[list[float]]) -> list[int | None]:
    """The version at which Optuna's successive-halving pruner (min_resource 1, its defaults
    otherwise) stops each run of ``recorded`` scores, run one after another; None: never."""
    truth = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1)
    )
    verdicts = []
    for scores in recorded:
        trial = truth.ask()
        stop = None
        for version, score in enumerate(scores):
            trial.report(score, version)
            if trial.should_prune():
                stop = version
                break
        verdicts.append(stop)
        if stop is None:
            truth.tell(trial, scores[-1])
        else:
            truth.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return verdicts


def test_the_jobs_optunas_successive_halving_stops_end_pruned_and_resume(scripted, repo):
    study = studies.run_study(dict(CONFIG), TABLE)

    study = repo.get_study(study.id)
    assert study.status is StudyStatus.COMPLETED
    jobs = repo.study_jobs(study.id)
    assert [job.study_trial for job in jobs] == [0, 1, 2]
    versions = {job.id: repo.list_versions(job.id) for job in jobs}
    recorded = [[v.metrics.extra[HELDOUT_METRIC] for v in versions[job.id]] for job in jobs]
    verdicts = optunas_verdicts(recorded)
    assert verdicts == [None, 1, 4]  # the scripts stop two jobs, at different rungs

    trials = study_trials.optuna_study(repo, study).trials
    for job, stop in zip(jobs, verdicts, strict=True):
        numbers = [v.version for v in versions[job.id]]
        trial = trials[job.study_trial]
        assert trial.intermediate_values == dict(enumerate(recorded[job.study_trial]))
        if stop is None:
            assert job.status is JobStatus.SUCCEEDED and numbers == list(range(STEPS + 1))
            assert trial.state is optuna.trial.TrialState.COMPLETE
            assert trial.value == recorded[job.study_trial][-1]
            continue
        assert job.status is JobStatus.PRUNED
        assert job.error.startswith(
            f"pruned by the study's successive_halving pruner at version {stop}"
        )
        assert trial.state is optuna.trial.TrialState.PRUNED
        assert numbers == list(range(stop + 1))  # stopped at that version's step boundary
        assert all(v.checkpoint_path and v.weights_checksum for v in versions[job.id])
        assert job.step == stop and job.finished_at is not None

    pruned = [job for job, stop in zip(jobs, verdicts, strict=True) if stop is not None]
    for job in pruned:
        resume_job(job.id)  # trains on from its newest version, its trial left pruned
        resumed = repo.get_job(job.id)
        assert resumed.status is JobStatus.SUCCEEDED
        assert [v.version for v in repo.list_versions(job.id)] == list(range(STEPS + 1))
    trials = study_trials.optuna_study(repo, study).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] + 2 * [
        optuna.trial.TrialState.PRUNED
    ]
