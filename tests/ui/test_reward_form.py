"""Launch with several weighted rewards, and Clone filling them back."""

from tests.ui.test_launch import form as launch_form
from ui.handlers.clone import clone_form
from ui.handlers.launch import FORM_FIELDS, launch_job
from ui.handlers.reward_form import REWARD_FIELDS, reward_form


def form(**overrides):
    return launch_form(heldout_every=0, **overrides)  # held-out takes no reward list yet


def test_one_reward_of_weight_one_stays_the_plain_spec(services, world):
    launch_job(services, **form(reward="numeric_match", reward_weight=1, reward_2=""))
    assert world["queue"].submitted[0][1]["reward"] == "numeric_match"


def test_more_rewards_are_submitted_as_a_weighted_list(services, world):
    fields = {"reward_weight": 1.0, "reward_2": "format", "weight_2": 0.2, "reward_3": ""}
    message = launch_job(services, **form(reward="numeric_match", **fields))
    assert "Job **#" in message
    assert world["queue"].submitted[0][1]["reward"] == [
        {"name": "numeric_match", "weight": 1.0},
        {"name": "format", "weight": 0.2},
    ]


def test_a_weight_other_than_one_makes_a_list_of_one(services, world):
    launch_job(services, **form(reward="exact_match", reward_weight=0.5))
    assert world["queue"].submitted[0][1]["reward"] == [{"name": "exact_match", "weight": 0.5}]


def test_reward_list_problems_are_shown_inline(services, world):
    at_the_budget = {"reward_2": "length", "weight_2": 1, "length_threshold": 3}
    message = launch_job(services, **form(reward="exact_match", **at_the_budget))  # max 3
    assert "Nothing was enqueued" in message and "must be below max" in message
    message = launch_job(services, **form(reward="exact_match", reward_2="format", weight_2="x"))
    assert "reward 2 weight" in message
    message = launch_job(services, **form(reward_2="format"))  # the task default cannot mix
    assert "choose the first reward" in message
    assert world["queue"].submitted == []


def test_clone_fills_the_rewards_back(services, world):
    fields = {"reward_2": "format", "weight_2": 0.2}
    launch_job(services, **form(reward="numeric_match", reward_weight=2, **fields))
    config = world["queue"].submitted[0][1]
    job = world["repo"].create_job("train", {**config, "output_dir": "out"}, total_steps=3)
    values, _ = clone_form(services, job.id)
    assert values["reward"] == "numeric_match" and values["reward_weight"] == 2
    assert values["reward_2"] == "format" and values["weight_2"] == 0.2
    assert values["reward_3"] is None and set(REWARD_FIELDS) <= set(FORM_FIELDS)
    world["queue"].submitted.clear()
    launch_job(services, **{k: v for k, v in values.items() if k in FORM_FIELDS})
    assert world["queue"].submitted[0][1]["reward"] == config["reward"]
    assert reward_form("exact_match")["reward"] == "exact_match"
    assert reward_form(None)["reward"] == "task default"


def test_a_length_reward_takes_the_forms_threshold_or_three_quarters_of_max_tokens(services, world):
    launch_job(services, **form(reward="length", max_tokens=8))  # alone: still a list
    launch_job(
        services, **form(reward="exact_match", reward_2="length", length_threshold=5, max_tokens=8)
    )
    first, second = (config["reward"] for _, config in world["queue"].submitted)
    assert first == [{"name": "length", "weight": 1.0, "threshold": 6}]
    assert second[1] == {"name": "length", "weight": 1.0, "threshold": 5}
    job = world["repo"].create_job("train", {**world["queue"].submitted[1][1]}, total_steps=3)
    values, _ = clone_form(services, job.id)
    assert (values["reward_2"], values["length_threshold"]) == ("length", 5)


# Issue 32, item 1: a list whose weights are all 0 scores every sample 0 (the job would stall).
def test_a_reward_list_whose_weights_are_all_zero_is_refused_inline(services, world):
    for fields in (
        {"reward": "exact_match", "reward_weight": 0},
        {"reward": "exact_match", "reward_weight": "0", "reward_2": "format", "weight_2": "0.0"},
    ):
        message = launch_job(services, **form(**fields))
        assert message.startswith("**Nothing was enqueued.**") and "every weight is 0" in message
    assert world["queue"].submitted == []
    launch_job(services, **form(reward="exact_match", reward_weight=0, reward_2="format"))
    assert world["queue"].submitted[0][1]["reward"] == [
        {"name": "exact_match", "weight": 0.0},
        {"name": "format", "weight": 1.0},
    ]


def test_clone_keeps_a_length_threshold_of_0_and_blank_means_three_quarters(services, world):
    zero = {"reward_2": "length", "length_threshold": "0", "max_tokens": 8}
    launch_job(services, **form(reward="exact_match", **zero))  # a penalty from the first token
    config = world["queue"].submitted[0][1]
    assert config["reward"][1] == {"name": "length", "weight": 1.0, "threshold": 0}
    job = world["repo"].create_job("train", config, total_steps=3)
    values, _ = clone_form(services, job.id)
    assert values["length_threshold"] == 0
    world["queue"].submitted.clear()
    launch_job(services, **{k: v for k, v in values.items() if k in FORM_FIELDS})
    assert world["queue"].submitted[0][1]["reward"] == config["reward"]
    blank = {"reward_2": "length", "length_threshold": "", "max_tokens": 8}
    launch_job(services, **form(reward="exact_match", **blank))
    assert world["queue"].submitted[1][1]["reward"][1]["threshold"] == 6  # 3/4 of 8
    assert reward_form("exact_match")["length_threshold"] is None  # shown blank
