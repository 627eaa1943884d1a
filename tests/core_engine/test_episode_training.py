"""GRPO over episodes: a group is several episodes of one task, the loss covers their assistant
tokens only, and it runs in every pipeline mode and with LoRA; an environment that hangs ends
its episodes with a reason, its batch is never trained on, and the trainer goes on."""

import time

import pytest

from core_engine.rl.trainer.records import TrainerHooks

from .test_rl_trainer import make_trainer

NAME = "chatty"

pytestmark = pytest.mark.slow


class Chatty:
    """Answers "more" twice, then is done; each turn's reward is its text's length parity (so
    groups have reward variance); a task whose input is "hang" never answers."""

    def __init__(self) -> None:
        self.tools = []
        self.task, self.turns = {}, 0

    def reset(self, task):
        self.task = task
        return [{"role": "user", "content": task["input"]}]

    def step(self, turn):
        if self.task["input"] == "hang":
            time.sleep(600)
        self.turns += 1
        reward = float(len(turn["text"]) % 2)
        return {
            "messages": [{"role": "user", "content": "more"}],
            "reward": reward,
            "done": self.turns >= 3,
        }


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setenv("RLWB_ENVIRONMENTS", f"{NAME}={__name__}:Chatty")
    monkeypatch.setenv("RLWB_ENV_TIMEOUT", "5")


EPISODES = {
    "environment": NAME,
    "max_turns": 3,
    "max_episode_tokens": 96,
    "max_tokens": 8,
    "max_tokens_per_micro_batch": 512,
    "drop_zero_variance_groups": False,
}


def trained(records):
    return [r for r in records if r.version is not None]


@pytest.mark.parametrize(
    "mode",
    [
        {"pipeline": "sync"},
        {"pipeline": "one_step", "max_policy_lag": 1},
        {"pipeline": "in_flight", "max_policy_lag": 1},
        {"pipeline": "in_flight", "max_policy_lag": 1, "lora": {"rank": 4}},
    ],
    ids=["sync", "one_step", "in_flight", "in_flight-lora"],
)
def test_grpo_trains_on_episodes_in_every_mode(checkpoint, tmp_path, mode):
    records = []
    trainer = make_trainer(
        checkpoint, tmp_path, TrainerHooks(on_step=records.append), steps=3, **EPISODES, **mode
    )
    trainer.train()
    steps = trained(records)
    assert [r.version.version for r in steps] == [1, 2, 3]
    for record in steps:
        rollout = record.rollout
        assert rollout.episode_finishes and set(rollout.episode_finishes) <= {
            "done",
            "context_exceeded",
        }
        assert record.metrics["turns_per_episode"] > 1
        for i in range(rollout.num_samples):
            mask, parts = rollout.loss_masks[i], rollout.segments[i]
            assert any(p["role"] == "user" for p in parts)  # observations between turns
            assert [
                p["role"] == "assistant" for p in parts for _ in range(p["end"] - p["start"])
            ] == [bool(m) for m in mask]
            assert rollout.rewards[i] == sum(p.get("reward") or 0.0 for p in parts)
            lags = [record.version.parent - v for v in rollout.versions_of(i)]
            assert all(0 <= lag <= (1 if mode["pipeline"] != "sync" else 0) for lag in lags)


def test_a_hanging_environment_rejects_its_batch_and_the_trainer_goes_on(checkpoint, tmp_path):
    records = []
    trainer = make_trainer(
        checkpoint, tmp_path, TrainerHooks(on_step=records.append), batch_size=1, **EPISODES
    )
    hung = trainer.step({"instruction": [""], "input": ["hang"], "output": ["7"]})
    assert hung.version is None and trainer.version == 0
    assert {"env_timeout", "env_error"} >= set(hung.rollout.episode_finishes)
    assert "env_timeout" in hung.rollout.episode_finishes
    assert any("env_timeout" in why for why in hung.reasons + list(hung.rejected_groups.values()))
    fine = trainer.step({"instruction": [""], "input": ["2+3"], "output": ["7"]})
    assert fine.version is not None and trainer.version == 1
    assert trainer.engine.is_idle()


def test_held_out_evaluation_of_an_environment_job_runs_greedy_episodes(checkpoint, tmp_path):
    """An environment job's held-out score is its environment's reward over greedy episodes
    (one per record), not a single-turn reward of the first reply."""
    from core_engine.rl.episodes.env_sandbox import EnvironmentSession
    from core_engine.rl.episodes.runner import EpisodeLimits
    from core_engine.rl.trainer.evaluate import evaluate
    from core_engine.task import SamplingParams

    trainer = make_trainer(checkpoint, tmp_path, **EPISODES)
    records = [{"instruction": "", "input": f"{n}?", "output": "7"} for n in range(3)]
    with EnvironmentSession(NAME) as session:
        episodes = (session, EpisodeLimits(3, 96))
        result = evaluate(
            trainer.engine, records, None, SamplingParams(temperature=0, max_tokens=8), 0, episodes
        )
    assert len(result.rewards) == 3 and result.rollout.segments
    for reward, parts in zip(result.rewards, result.rollout.segments, strict=True):
        assert sum(p["role"] == "assistant" for p in parts) == 3
        assert reward == sum(p.get("reward") or 0.0 for p in parts)
    assert result.mean_reward == sum(result.rewards) / 3


def test_a_finished_run_ends_its_environment_session(checkpoint, tmp_path):
    """Issue 45: the run's environment child (and every process of its group) ends with it."""
    from .test_environment_processes import all_gone

    trainer = make_trainer(checkpoint, tmp_path, steps=1, **EPISODES)
    session = trainer.runner.generator.session
    child = session.process_group
    trainer.train()
    assert session.process_group is None and all_gone([child])
