"""The Launch form's Vary section: the form's job becomes a study's base config (the one
Launch would submit), the Vary lines its grid, with seeds and the jobs at once; every problem
is shown inline and nothing is stored."""

from tests.ui.test_launch import form
from ui.handlers.launch import launch_job
from ui.handlers.vary import launch_study
from ui.render import inert


def test_vary_runs_a_study_of_the_launch_forms_job(services, world):
    fields = form(model=str(world["model"]), reward="regex:7.*")
    launch_job(services, **fields)
    [(_, submitted)] = world["queue"].submitted
    vary = "lr: 0.001, 0.003\ntemperature = 0.7, 1\n\n"

    message = launch_study(services, "lrs", vary, "2", "2", **fields)

    grid = {"lr": [0.001, 0.003], "temperature": [0.7, 1]}
    table = {"name": "lrs", "grid": grid, "seeds": 2, "concurrency": 2}
    assert world["queue"].studies == [(submitted, table)]
    study = world["repo"].get_study("lrs")
    [first, second] = world["repo"].study_jobs(study.id)
    assert message.startswith(
        f"Study **lrs** is running: 8 jobs planned (2 fields varied, 2 seeds per point), "
        f"2 at once; queued: #{first.id}, #{second.id}."
    )
    assert (first.study_point, first.config["seed"]) == ({"lr": 0.001, "temperature": 0.7}, 0)
    assert second.config == {**submitted, "lr": 0.001, "temperature": 0.7, "seed": 1}


def test_vary_shows_every_problem_and_stores_nothing(services, world):
    fields = form(model=str(world["model"]), steps="many")
    vary = "lr 0.001\nlr: 0.1\nlr: 0.2"

    message = launch_study(services, "bad", vary, "0", "1.5", **fields)

    assert message.startswith("**Nothing was enqueued.** Fix these first:")
    for problem in (
        "Vary: 'lr 0.001' is not 'field: value, value'",
        "Vary: lr is given twice",
        "Seeds per point: '0' is not a whole number of at least 1",
        "Jobs at once: '1.5' is not a whole number of at least 1",
        "steps",
    ):
        assert inert(problem) in message
    assert world["queue"].studies == []
    message = launch_study(
        services, "../up", "lr: 0.1", "1", "1", **form(model=str(world["model"]))
    )
    assert message.startswith("**Nothing was enqueued:** " + inert("study name: '../up' is not"))
    assert world["queue"].studies == []
