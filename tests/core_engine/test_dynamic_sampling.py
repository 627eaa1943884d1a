"""DAPO's dynamic sampling: a step's batch is drawn until `batch_size` groups have mixed
rewards, every drawn group is stored, the filtered ones with their reason; the bound on draws
rejects the step, saying so."""

import json
import statistics

import pytest

from core_engine.rl.config import GRPOConfig
from core_engine.rl.rollout import RolloutResult
from core_engine.rl.trainer.records import TrainerHooks
from workers.records import trainer_batches

from .test_rl_trainer import make_trainer


def groups_mixed_when(predicate):
    """A reward whose k-th group scored in the run (counted over calls) has rewards 0, 1, 0, 1
    when `predicate(k)`, else all 1: which groups are mixed is known before the run."""
    seen = {"groups": 0}

    def reward(completions, references, prompts):
        scores = []
        for i in range(len(completions)):
            group = seen["groups"] + i // 4
            scores.append(float(i % 2) if predicate(group) else 1.0)
        seen["groups"] += len(completions) // 4
        return scores

    return reward


def test_draws_until_the_batch_holds_enough_mixed_groups(checkpoint, tmp_path):
    steps = []
    trainer = make_trainer(
        checkpoint, tmp_path, TrainerHooks(on_step=steps.append), dynamic_sampling=True, steps=1
    )
    trainer.runner.reward_fn = groups_mixed_when(lambda k: k % 3 != 2)
    record = trainer.step()
    # draw 1: groups 0-3, mixed 0, 1, 3; draw 2: groups 4-7, mixed 4, 6, 7 -> 4 kept: 0 1 3 4
    assert trainer.source.batches_drawn == 2 and record.metrics["sampling_draws"] == 2
    assert record.status == "accepted" and len(record.rollout.prompt_ids) == 8
    trained = {record.rollout.group_of(i) for i, lp in enumerate(record.trainer_logprobs) if lp}
    assert trained == {0, 1, 3, 4}
    assert set(record.rejected_groups) == {2, 5, 6, 7}
    assert "every reward of the group is 1" in record.rejected_groups[2]
    assert "beyond the batch's 4 groups" in record.rejected_groups[6]
    # stored: the trained groups accepted, every filtered group rejected with its reason
    accepted, rejected = trainer_batches(1, 0, steps[0])
    assert {s.prompt_index for s in accepted.samples} == {0, 1, 3, 4}
    assert {s.prompt_index for s in rejected.samples} == {2, 5, 6, 7}
    assert len(rejected.samples) == 16 and all(s.advantage is None for s in rejected.samples)
    assert all("filtered by dynamic sampling" in why for why in rejected.rejection_reasons)
    # each draw sampled from its own seed
    seeds = record.rollout.seeds
    assert len(set(seeds)) == len(seeds) == 32


def test_the_bound_on_draws_rejects_the_step_with_the_reason(checkpoint, tmp_path):
    trainer = make_trainer(
        checkpoint, tmp_path, dynamic_sampling=True, max_sampling_draws=3, steps=1
    )
    trainer.runner.reward_fn = groups_mixed_when(lambda k: k == 5)
    record = trainer.step()
    assert record.status == "rejected" and trainer.version == 0
    assert trainer.source.batches_drawn == 3 and len(record.rollout.prompt_ids) == 12
    assert record.reasons == [
        "dynamic sampling: 1 of 4 groups with mixed rewards after 3 draws "
        "(max_sampling_draws): the step is not trained on"
    ]
    assert set(record.rejected_groups) == set(range(12))
    # not a failure: the run stalls after too many of these, it does not error
    assert trainer._consecutive_failures == 0 and trainer._consecutive_filtered == 1


def test_without_dynamic_sampling_one_draw_per_step(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, steps=1)
    trainer.runner.reward_fn = groups_mixed_when(lambda k: k == 0)
    record = trainer.step()
    assert trainer.source.batches_drawn == 1 and len(record.rollout.prompt_ids) == 4
    assert record.rejected_groups == {}


def test_filtered_groups_survive_a_json_round_trip(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, dynamic_sampling=True, steps=1)
    trainer.runner.reward_fn = groups_mixed_when(lambda k: k % 3 != 2)
    rollout = trainer.step().rollout
    stored = json.loads(json.dumps(rollout.to_json()))  # as a checkpoint keeps it
    assert RolloutResult.from_json(stored).filtered_groups == rollout.filtered_groups


@pytest.mark.parametrize(
    ("settings", "needs"),
    [
        ({"pipeline": "one_step", "max_policy_lag": 1}, "pipeline = 'sync'"),
        ({"updates_per_batch": 2}, "updates_per_batch = 1"),
        ({"devices": 2, "batch_size": 4}, "devices = 1"),
    ],
)
def test_dynamic_sampling_refused_where_it_cannot_draw(settings, needs):
    with pytest.raises(ValueError, match=f"dynamic_sampling needs {needs}"):
        GRPOConfig(model="m", output_dir="o", task="always7", dynamic_sampling=True, **settings)


def test_max_sampling_draws_is_bounded():
    with pytest.raises(ValueError, match="max_sampling_draws must be >= 1"):
        GRPOConfig(model="m", output_dir="o", task="always7", max_sampling_draws=0)


def test_a_batch_wide_reward_scale_reads_only_the_kept_groups(checkpoint, tmp_path):
    trainer = make_trainer(
        checkpoint, tmp_path, dynamic_sampling=True, steps=1, scale_rewards="batch"
    )
    trainer.runner.reward_fn = groups_mixed_when(lambda k: k % 3 != 2)
    record = trainer.step()
    kept = [0, 1, 3, 4]  # each group's rewards 0, 1, 0, 1; the filtered ones not in the batch
    rewards = [float(i % 2) for _ in kept for i in range(4)]
    mean_of_group, std = 0.5, statistics.pstdev(rewards)  # TRL's batch scale, population std
    for group in kept:
        for i in range(4):
            truth = (float(i % 2) - mean_of_group) / (std + 1e-6)
            assert record.advantages[group * 4 + i] == pytest.approx(truth, abs=1e-6)
