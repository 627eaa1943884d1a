"""Launch: the pipeline dropdown, the policy lag a pipelined job needs, and Clone."""

import pytest

from core_engine.rl.config import PIPELINE_MODES
from tests.ui.test_launch import form
from ui.app import build_app
from ui.handlers.clone import clone_form
from ui.handlers.launch import FORM_FIELDS, launch_job, train_config
from ui.handlers.train_form import lag_for_pipeline
from ui.render import inert


def _submitted(world) -> dict:
    return world["queue"].submitted[-1][1]


def test_the_form_offers_every_pipeline_mode_sync_first(services):
    demo = build_app(services)
    [dropdown] = [b for b in demo.blocks.values() if b.elem_id == "launch-pipeline"]
    assert [value for _, value in dropdown.choices] == list(PIPELINE_MODES)
    assert dropdown.value == "sync" and dropdown.label == "Pipeline" and dropdown.info
    assert "pipeline" in FORM_FIELDS


def test_a_sync_job_keeps_its_lag(services, world):
    launch_job(services, **form())
    assert _submitted(world)["pipeline"] == "sync" and _submitted(world)["max_policy_lag"] == 0


@pytest.mark.parametrize("mode", ["one_step", "in_flight"])
def test_a_pipelined_job_asked_with_lag_0_runs_with_lag_1_and_says_so(services, world, mode):
    message = launch_job(services, **form(pipeline=mode, max_policy_lag=0))
    assert "is queued" in message and "Max policy lag raised to 1" in message
    assert (_submitted(world)["pipeline"], _submitted(world)["max_policy_lag"]) == (mode, 1)
    message = launch_job(services, **form(pipeline=mode, max_policy_lag=2))
    assert "raised" not in message and _submitted(world)["max_policy_lag"] == 2


def test_the_lag_is_raised_only_from_0_in_a_pipelined_mode():
    assert lag_for_pipeline("one_step", "0") == 1 and lag_for_pipeline("in_flight", 0.0) == 1
    assert lag_for_pipeline("sync", 0) == 0 and lag_for_pipeline("bogus", 0) == 0
    assert lag_for_pipeline("one_step", "x") == "x" and lag_for_pipeline("one_step", None) is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"pipeline": "bogus"}, "pipeline must be one of sync, one_step, in_flight, got 'bogus'"),
        ({"pipeline": "one_step", "updates_per_batch": 2}, "needs updates_per_batch = 1"),
    ],
)
def test_an_unusable_pipeline_is_refused_with_the_field_named(services, world, change, problem):
    message = launch_job(services, **form(**change))
    assert message.startswith("**Nothing was enqueued.**") and inert(problem) in message
    assert world["queue"].submitted == []


def test_clone_fills_back_the_pipeline(services, world):
    launch_job(services, **form(pipeline="in_flight", max_policy_lag=0))
    config = _submitted(world)
    job = services.repository.create_job("train", config)
    values, _ = clone_form(services, job.id)
    assert (values["pipeline"], values["max_policy_lag"]) == ("in_flight", 1)
    assert train_config(services, **values)["pipeline"] == "in_flight"
    older = services.repository.create_job("train", {**form(), "reward": None})  # no pipeline
    assert clone_form(services, older.id)[0]["pipeline"] == "sync"
