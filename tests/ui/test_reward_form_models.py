"""Launch's `overlong` and `reward_model` rewards: the cache length and the checkpoint from
the form, Clone filling them back."""

from tests.ui.test_launch import form as launch_form
from ui.handlers.clone import clone_form
from ui.handlers.launch import FORM_FIELDS, launch_job
from ui.render import from_inert


def form(**overrides):
    return launch_form(heldout_every=0, **overrides)


def test_overlong_takes_the_forms_cache_or_its_default(services, world):
    launch_job(services, **form(reward="exact_match", reward_2="overlong", max_tokens=20))
    assert world["queue"].submitted[-1][1]["reward"][1] == {"name": "overlong", "weight": 1.0}
    launch_job(services, **form(reward="overlong", overlong_cache="3", max_tokens=10))
    assert world["queue"].submitted[-1][1]["reward"] == [
        {"name": "overlong", "weight": 1.0, "cache_length": 3}
    ]
    world["queue"].submitted.clear()


def test_a_reward_model_takes_the_forms_checkpoint_and_clone_fills_it_back(services, world):
    rewards = {"reward_2": "reward_model", "weight_2": 0.5, "reward_model_path": " /models/rm "}
    launch_job(services, **form(reward="exact_match", reward_3="overlong", **rewards))
    config = world["queue"].submitted[-1][1]
    assert config["reward"][1] == {"name": "reward_model", "weight": 0.5, "model": "/models/rm"}
    job = world["repo"].create_job("train", config, total_steps=3)
    values, _ = clone_form(services, job.id)
    assert values["reward_model_path"] == "/models/rm"
    assert values["overlong_cache"] is None  # blank: its default
    world["queue"].submitted.clear()
    launch_job(services, **{k: v for k, v in values.items() if k in FORM_FIELDS})
    assert world["queue"].submitted[-1][1]["reward"] == config["reward"]
    world["queue"].submitted.clear()


def test_a_reward_model_without_a_checkpoint_is_refused_inline(services, world):
    message = from_inert(launch_job(services, **form(reward="reward_model")))
    assert "Nothing was enqueued" in message
    assert "reward model: give its checkpoint directory or Hugging Face Hub id" in message
    assert world["queue"].submitted == []
