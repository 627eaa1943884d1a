"""Launch: the Environment choice (none: single-turn, else a registered environment) with its
episode limits; an environment job sends no reward, an unregistered name is refused by the
registry's message, and Clone fills the choice back."""

import subprocess
import sys

import pytest

from tests.ui.test_launch import form
from ui.app import build_app
from ui.handlers.clone import clone_form
from ui.handlers.launch import SINGLE_TURN, TASK_SOURCE, environment_choices, launch_job
from ui.handlers.model_form import PRESET_FIELDS, model_choices, preset_values
from ui.render import inert
from ui.tabs.launch import _apply_preset, _show_environment
from workers import api


def _submitted(world) -> dict:
    [(kind, config)] = world["queue"].submitted
    assert kind == "train"
    return config


def test_the_choices_are_single_turn_then_the_registered_environments(services, monkeypatch):
    monkeypatch.delenv("RLWB_ENVIRONMENTS", raising=False)
    assert environment_choices() == [
        ("none: single-turn", SINGLE_TURN),
        ("calculator", "calculator"),
        ("guess_number", "guess_number"),
    ]
    monkeypatch.setenv("RLWB_ENVIRONMENTS", "mine=my_envs:Factory")  # read, never imported
    assert ("mine", "mine") in environment_choices()
    demo = build_app(services)
    [dropdown] = [b for b in demo.blocks.values() if b.elem_id == "launch-environment"]
    assert dropdown.value == SINGLE_TURN and ("mine", "mine") in dropdown.choices


def test_an_environment_job_sends_its_limits_and_no_reward(services, world):
    # the demo policy's context is 32 tokens: episodes must fit it (`check_episode_room`)
    change = {"environment": "calculator", "max_turns": "3", "max_episode_tokens": "30"}
    message = launch_job(services, **form(reward="regex:7.*", reward_2="length", **change))
    assert "is queued: train demo on always7 in environment calculator" in message
    config = _submitted(world)
    assert config["environment"] == "calculator" and "reward" not in config
    assert (config["max_turns"], config["max_episode_tokens"]) == (3, 30)
    assert inert("max_turns 3, max_episode_tokens 30") in message  # the numbers as read


def test_a_single_turn_job_sends_no_environment_nor_its_limits(services, world):
    launch_job(services, **form(environment=SINGLE_TURN, max_turns="x", reward="regex:7.*"))
    config = _submitted(world)
    assert config["reward"] == "regex:7.*"
    assert not {"environment", "max_turns", "max_episode_tokens"} & set(config)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"environment": "chess"},
            "unknown environment 'chess': not registered on this worker (registered: "
            "calculator, guess_number; operators add theirs with RLWB_ENVIRONMENTS",
        ),
        ({"environment": "calculator", "max_turns": "0"}, "max_turns must be >= 1"),
        ({"environment": "calculator", "max_turns": "2.5"}, "max_turns: a whole number"),
        (
            {"environment": "calculator", "max_episode_tokens": "3"},
            "max_tokens (per turn) must be below max_episode_tokens",
        ),
    ],
)
def test_an_unusable_environment_is_refused_by_name(services, world, monkeypatch, change, problem):
    monkeypatch.delenv("RLWB_ENVIRONMENTS", raising=False)
    defaults = {"max_turns": 4, "max_episode_tokens": 512}
    message = launch_job(services, **form(**{**defaults, **change}))
    assert message.startswith("**Nothing was enqueued.**") and inert(problem) in message
    assert world["queue"].submitted == []


def test_clone_fills_back_the_environment_and_its_limits(services, world):
    change = {"environment": "guess_number", "max_turns": 6, "max_episode_tokens": 28}
    launch_job(services, **form(**change))
    launched = services.repository.list_jobs(limit=1)[0]
    values, _ = clone_form(services, launched.id)
    assert (values["environment"], values["max_turns"], values["max_episode_tokens"]) == (
        "guess_number",
        6,
        28,
    )
    world["queue"].submitted.clear()
    launch_job(services, **form())
    values, _ = clone_form(services, services.repository.list_jobs(limit=1)[0].id)
    assert values["environment"] == SINGLE_TURN and values["max_turns"] == 4  # the default


def test_choosing_an_environment_shows_its_limits_and_hides_the_rewards():
    limits, reward, more = _show_environment("calculator")
    assert (limits["visible"], reward["visible"], more["visible"]) == (True, False, False)
    limits, reward, more = _show_environment(SINGLE_TURN)
    assert (limits["visible"], reward["visible"], more["visible"]) == (False, True, True)


def test_offering_and_checking_environments_imports_no_torch():
    """The registry is read, never imported, in the UI process: listing the environments and
    checking an environment job leave torch out of it."""
    code = (
        "import sys, ui.app\n"
        "from ui.handlers.launch import environment_choices\n"
        "from workers import api\n"
        "assert ('calculator', 'calculator') in environment_choices()\n"
        "api.validate_job('train', {'model': 'demo', 'task': 'always7', "
        "'environment': 'calculator', 'output_dir': 'unused'})\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False"


def test_the_calculator_policy_comes_with_its_task_environment_and_lengths(services, world):
    """Choosing the shipped calculator policy fills in word problems in the calculator
    environment, with turns and lengths that fit its context: Launch accepts that job as it
    stands (its prompts checked against the policy's 384-token context)."""
    assert ("built-in calculator policy: word problems with a tool", "calculator-demo") in (
        model_choices(services)
    )
    preset = preset_values(api.CALCULATOR_MODEL)
    assert {name: preset[name] for name in PRESET_FIELDS[:7]} == {
        "source": TASK_SOURCE,
        "task": "word_problems",
        "environment": "calculator",
        "steps": 100,
        "max_tokens": 48,
        "max_turns": 5,
        "max_episode_tokens": 384,
    }
    message = launch_job(services, **form(model=api.CALCULATOR_MODEL, **preset))
    launched = "train calculator-demo on word_problems in environment calculator"
    assert f"is queued: {inert(launched)}" in message
    config = _submitted(world)
    assert (config["max_tokens"], config["max_turns"], config["max_episode_tokens"]) == (
        48,
        5,
        384,
    )
    assert preset_values(api.DEMO_MODEL)["environment"] == SINGLE_TURN
    assert preset_values(api.DEMO_MODEL)["task"] == "addition"


def test_a_preset_is_filled_in_for_a_shipped_policy_only(world):
    filled = _apply_preset(api.CALCULATOR_MODEL)
    assert [update["value"] for update in filled] == [
        preset_values(api.CALCULATOR_MODEL)[name] for name in PRESET_FIELDS
    ]
    assert all("value" not in update for update in _apply_preset(str(world["model"])))


def test_the_calculator_policy_is_refused_where_its_context_is_too_short(services, world):
    """The preset's lengths are what fit: a turn budget past the policy's context is refused
    at Launch, by the prompt check, before anything is queued."""
    preset = {**preset_values(api.CALCULATOR_MODEL), "max_tokens": 300, "max_episode_tokens": 900}
    message = launch_job(services, **form(model=api.CALCULATOR_MODEL, **preset))
    assert message.startswith("**Nothing was enqueued.**") and inert("384-token context") in message
    assert world["queue"].submitted == []


def test_the_r1_recipe_launches_word_problems_with_the_math_and_format_rewards(services, world):
    """Choosing the R1 recipe fills in word problems, single-turn, rewarded by `math` plus
    `format`, with a reply length that fits the policy's context: Launch accepts that job as
    it stands (its prompts checked against the context)."""
    assert ("R1 recipe (math + format): word problems in <think>/<answer>", "r1-demo") in (
        model_choices(services)
    )
    preset = preset_values(api.R1_MODEL)
    assert (preset["task"], preset["environment"]) == ("word_problems", SINGLE_TURN)
    assert (preset["reward"], preset["reward_2"]) == ("math", "format")
    message = launch_job(services, **form(model=api.R1_MODEL, **preset))
    assert f"is queued: {inert('train r1-demo on word_problems')}" in message
    config = _submitted(world)
    assert config["reward"] == [{"name": "math", "weight": 1.0}, {"name": "format", "weight": 1.0}]
    assert (config["task"], config["max_tokens"]) == ("word_problems", preset["max_tokens"])
