"""Algorithm presets: each published variant's settings as its paper gives them, beneath what
the job sets itself; DAPO's dynamic sampling and soft overlong punishment."""

import dataclasses

import pytest

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import default_reward
from core_engine.rl.presets import ALGORITHM_PRESETS, algorithm_label, apply_preset
from core_engine.rl.rewards.mix import RewardMix

from .test_overlong_reward import dapo_eq13

JOB = {"model": "m", "output_dir": "o", "task": "always7", "max_tokens": 20}
# the papers' settings, as each paper (or TRL's documentation of it) states them
PAPERS = {
    "DAPO": {"clip_eps": 0.2, "clip_eps_high": 0.28, "kl_coef": 0.0, "dynamic_sampling": True},
    "GSPO": {"importance_sampling_level": "sequence", "clip_eps": 3e-4, "clip_eps_high": 4e-4},
    "Dr. GRPO": {"loss_type": "dr_grpo", "kl_coef": 0.0},
    "RLOO": {"advantage": "rloo"},
    "GRPO": {"clip_eps": 0.2, "kl_coef": 0.04},
}
HAS_OBJECTIVES = {"loss_type", "advantage", "clip_eps_high"} <= {
    f.name for f in dataclasses.fields(GRPOConfig)
}
needs_objectives = pytest.mark.skipif(
    not HAS_OBJECTIVES, reason="the objective fields (issue 40 items 1-3) are not merged here"
)


@pytest.mark.parametrize("name", list(PAPERS))
def test_each_preset_sets_its_papers_settings(name):
    applied = apply_preset({**JOB, "preset": name})
    assert {key: applied[key] for key in PAPERS[name]} == PAPERS[name]
    assert ALGORITHM_PRESETS[name].url.startswith("https://arxiv.org/abs/")


def test_dapo_adds_dynamic_sampling_and_the_soft_overlong_punishment():
    applied = apply_preset({**JOB, "preset": "DAPO"})
    assert applied["dynamic_sampling"] is True
    # the task's own reward kept; the overlong reward's defaults: DAPO's cache, a fifth
    assert applied["reward"] == [{"name": default_reward("always7")}, {"name": "overlong"}]
    lengths = list(range(23))
    _, parts = RewardMix(applied["reward"], 20).score(["7"] * 23, ["7"] * 23, [""] * 23, lengths)
    assert parts["overlong"] == pytest.approx([float(dapo_eq13(n, 20, 4)) for n in lengths])


def test_what_the_job_sets_wins_and_applying_twice_changes_nothing():
    own = {**JOB, "preset": "DAPO", "clip_eps": 0.1, "dynamic_sampling": False}
    own["reward"] = [{"name": "exact_match"}, {"name": "overlong", "cache_length": 2}]
    applied = apply_preset(own)
    assert applied["clip_eps"] == 0.1 and applied["dynamic_sampling"] is False
    assert applied["reward"] == own["reward"]  # its own overlong reward, not a second one
    assert apply_preset(applied) == applied
    spec = apply_preset({**JOB, "preset": "DAPO", "reward": "regex:7"})
    assert spec["reward"] == [{"name": "regex:7"}, {"name": "overlong"}]


def test_an_environment_scores_its_episodes_so_dapo_adds_no_reward():
    values = {**JOB, "preset": "DAPO", "environment": "calculator"}
    assert "reward" not in apply_preset(values)


def test_an_unknown_preset_is_refused_naming_the_presets():
    with pytest.raises(ValueError, match=r"preset 'PPO': choose one of GRPO, Dr\. GRPO, DAPO"):
        GRPOConfig.from_dict({**JOB, "preset": "PPO"})
    with pytest.raises(ValueError, match="preset 'PPO': choose one of"):
        GRPOConfig(**JOB, preset="PPO")


def test_the_algorithm_label_of_a_job():
    assert algorithm_label({"preset": "GSPO", "loss_type": "grpo"}) == "GSPO"
    assert algorithm_label({"loss_type": "bnpo", "advantage": "rloo"}) == "bnpo / rloo"
    assert algorithm_label({"advantage": "rloo"}) == "rloo"
    assert algorithm_label({}) == "default"


@needs_objectives
@pytest.mark.parametrize("name", list(ALGORITHM_PRESETS))
def test_every_preset_makes_a_valid_job(name):
    config = GRPOConfig.from_dict({**JOB, "preset": name})
    assert config.preset == name
    for key, value in ALGORITHM_PRESETS[name].settings.items():
        assert getattr(config, key) == value


@needs_objectives
def test_a_job_file_names_its_preset(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('model = "m"\noutput_dir = "o"\ntask = "always7"\npreset = "DAPO"\n')
    config = GRPOConfig.from_file(path)
    assert config.dynamic_sampling and config.clip_eps_high == 0.28
    assert config.reward[-1] == {"name": "overlong"}
