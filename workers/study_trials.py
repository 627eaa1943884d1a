"""A study's Optuna side: its storage, sampler and pruner, and a job's trial (`Pruning`:
held-out scores reported per version, the pruner's verdict; `tell_trial`: how the job ended).

Optuna's storage is the workbench's database server, apart from the workbench's tables (both
have a ``studies`` and an ``alembic_version`` table): on SQLite the file beside it
(``<name>-optuna.db``), on PostgreSQL the schema ``<schema>_optuna`` (`optuna_url`).
Optuna is imported when a study uses it.
"""

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db import JobInfo, JobStatus, Repository, StudyInfo, StudyNotFound
from workers.specs import HELDOUT_METRIC
from workers.study_spec import StudySpec, stored_spec


def optuna_url(repo: Repository) -> str:
    """Where Optuna keeps its studies: beside the workbench's tables (module docstring)."""
    url = repo.engine.url
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        return str(url.set(database=str(path.with_name(f"{path.stem}-optuna.db"))))
    with repo.engine.begin() as connection:
        schema = f"{connection.exec_driver_sql('SELECT current_schema()').scalar()}_optuna"
        connection.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    options = {"options": f"-csearch_path={schema}"}
    return url.update_query_dict(options).render_as_string(hide_password=False)


@functools.cache
def optuna_storage(url: str) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.RDBStorage(url)


def _pruner(spec: StudySpec) -> Any:
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=spec.pruner_startup, n_warmup_steps=spec.pruner_warmup
        )
    if spec.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(spec.pruner_warmup, 1))
    return optuna.pruners.NopPruner()


def optuna_study(repo: Repository, study: StudyInfo) -> Any:
    """The study's Optuna study (its pruner and a TPE sampler seeded by the study's seed)."""
    import optuna

    spec = stored_spec(study)
    return optuna.load_study(
        study_name=study.optuna_study,
        storage=optuna_storage(optuna_url(repo)),
        sampler=optuna.samplers.TPESampler(seed=spec.seed),
        pruner=_pruner(spec),
    )


def distributions(spec: StudySpec) -> dict[str, Any]:
    import optuna.distributions as d

    found = {}
    for name, space in spec.ranges.items():
        if "choices" in space:
            found[name] = d.CategoricalDistribution(space["choices"])
        elif isinstance(space["low"], int) and isinstance(space["high"], int):
            found[name] = d.IntDistribution(space["low"], space["high"], log=bool(space.get("log")))
        else:
            found[name] = d.FloatDistribution(
                float(space["low"]), float(space["high"]), log=bool(space.get("log"))
            )
    return found


@dataclass
class Pruning:
    """A study job's Optuna trial: each held-out score is reported at its version, and the
    study's pruner says whether the job stops there."""

    trial: Any
    pruner: str

    def judge(self, version: int, metrics: Mapping[str, float]) -> str | None:
        """Report ``metrics``' held-out score (if any); the reason to stop, or None."""
        if HELDOUT_METRIC not in metrics:
            return None
        self.trial.report(metrics[HELDOUT_METRIC], version)
        if not self.trial.should_prune():
            return None
        return (
            f"pruned by the study's {self.pruner} pruner at version {version} "
            f"({HELDOUT_METRIC} {metrics[HELDOUT_METRIC]:.4g})"
        )


def job_study(repo: Repository, job: JobInfo) -> StudyInfo | None:
    """The study of a job (None: none, or deleted since: the job runs on alone)."""
    if job.study_id is None:
        return None
    try:
        return repo.get_study(job.study_id)
    except StudyNotFound:
        return None


def job_pruning(repo: Repository, job: JobInfo) -> Pruning | None:
    """The pruning of an Optuna study's job whose trial is still running (a resumed pruned
    job runs on without it), else None."""
    study = job_study(repo, job)
    if study is None or job.study_trial is None or stored_spec(study).pruner is None:
        return None
    import optuna

    storage = optuna_storage(optuna_url(repo))
    study_id = storage.get_study_id_from_name(study.optuna_study)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, job.study_trial)
    if storage.get_trial(trial_id).state is not optuna.trial.TrialState.RUNNING:
        return None
    return Pruning(
        optuna.trial.Trial(optuna_study(repo, study), trial_id), stored_spec(study).pruner
    )


def tell_trial(repo: Repository, job: JobInfo, study: StudyInfo) -> None:
    """Tell the job's trial how it ended: its last held-out score (succeeded, stalled),
    pruned, or failed (failed, cancelled). A finished trial (a resumed job's) is left."""
    import optuna

    tuned = optuna_study(repo, study)
    trial = tuned.trials[job.study_trial]
    if trial.state is not optuna.trial.TrialState.RUNNING:
        return
    if job.status is JobStatus.PRUNED:
        tuned.tell(job.study_trial, state=optuna.trial.TrialState.PRUNED)
        return
    scores = [
        v.metrics.extra[HELDOUT_METRIC]
        for v in repo.list_versions(job.id)
        if HELDOUT_METRIC in v.metrics.extra
    ]
    if job.status in (JobStatus.SUCCEEDED, JobStatus.STALLED) and scores:
        tuned.tell(job.study_trial, scores[-1])
    else:
        tuned.tell(job.study_trial, state=optuna.trial.TrialState.FAIL)
