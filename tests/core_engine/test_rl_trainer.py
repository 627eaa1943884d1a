"""The GRPO loop end to end on a tiny model: versions, lag, rejection, ack, resume, learning."""

import dataclasses

import pytest
import torch
import transformers

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.objective.logprobs import packed_response_logprobs
from core_engine.rl.rewards import RewardError
from core_engine.rl.rollout import RolloutRunner
from core_engine.rl.rollout.staleness import StaleRolloutError, check_policy_lag
from core_engine.rl.trainer.grpo import GRPOTrainer, TrainingError
from core_engine.rl.trainer.records import TrainerHooks
from core_engine.weights import canonical_weights, weights_checksum


def make_config(checkpoint, tmp_path, **overrides):
    values = dict(
        model=str(checkpoint),
        output_dir=str(tmp_path / "run"),
        task="always7",
        steps=4,
        batch_size=4,
        group_size=4,
        lr=3e-3,
        max_tokens=3,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def make_trainer(checkpoint, tmp_path, hooks=None, **overrides):
    config = make_config(checkpoint, tmp_path, **overrides)
    return GRPOTrainer(config, prompt_records(config.task, None, count=64), hooks)


def snapshot(trainer):
    state = trainer.optimizer.state_dict()["state"]
    return weights_checksum(canonical_weights(trainer.model)), {
        i: {k: v.clone() for k, v in fields.items()} for i, fields in state.items()
    }


def test_versions_rise_by_one_per_step_and_acks_match(checkpoint, tmp_path):
    batches = []
    trainer = make_trainer(checkpoint, tmp_path, TrainerHooks(on_step=batches.append), steps=4)
    trainer.train()
    accepted = [b for b in batches if b.status == "accepted"]
    versions = [b.version for b in accepted]
    assert trainer.version == len(accepted) == 4
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert [v.parent for v in versions] == [0, 1, 2, 3]
    # Each accepted batch was generated at exactly the version before its step (lag 0).
    assert [b.rollout.policy_version for b in accepted] == [0, 1, 2, 3]
    assert trainer.engine.version == 4
    assert versions[-1].checksum == weights_checksum(canonical_weights(trainer.engine.model))
    for batch in accepted:
        assert batch.metrics["mismatch_max"] < 1e-4  # engine and trainer agree on-policy


def test_a_step_raises_the_advantage_weighted_likelihood_of_its_batch(checkpoint, tmp_path):
    """One GRPO step on a fixed batch moves the policy the way its advantages say: the
    advantage-weighted log-likelihood of the trained samples rises (first order, at ratio 1
    the loss is minus that sum). Fixed tensors, not a learning curve."""
    trainer = make_trainer(checkpoint, tmp_path, batch_size=8, group_size=8, lr=1e-3)
    record = trainer.step()
    assert record.status == "accepted"
    rollout = record.rollout
    trained = [i for i, lp in enumerate(record.trainer_logprobs) if lp is not None]
    prompts = [rollout.prompt_ids[rollout.group_of(i)] for i in trained]
    with torch.no_grad():
        after = packed_response_logprobs(
            trainer.model, prompts, [rollout.response_ids[i] for i in trained], 1.0
        )
    gain = sum(
        record.advantages[i] * float(new.sum() - torch.tensor(record.trainer_logprobs[i]).sum())
        for i, new in zip(trained, after, strict=True)
    )
    assert any(record.advantages[i] for i in trained) and gain > 0


def test_rejected_batch_never_reaches_the_loss_or_optimizer(checkpoint, tmp_path):
    batches = []
    trainer = make_trainer(checkpoint, tmp_path, TrainerHooks(on_step=batches.append))
    trainer.step()  # one real step so the optimizer has state
    before = snapshot(trainer)
    version = trainer.version

    def broken_reward(completions, references, prompts):
        raise ValueError("grader offline")

    trainer.runner.reward_fn = broken_reward
    record = trainer.step()
    assert record.status == "rejected" and "grader offline" in record.reasons[0]
    assert record.rollout is not None and record.advantages is None
    after = snapshot(trainer)
    assert after[0] == before[0] and trainer.version == version == trainer.engine.version
    for p, state in before[1].items():
        assert torch.equal(state["exp_avg"], after[1][p]["exp_avg"])


def test_errored_sample_rejects_the_batch_or_only_its_group(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, max_tokens=500)  # context is 512 tokens
    original = trainer.engine.run_batch

    def first_prompt_too_long(prompts, params, samples_per_prompt=1, **options):
        prompts = [[1] * 600, *prompts[1:]]
        return original(prompts, params, samples_per_prompt, **options)

    trainer.engine.run_batch = first_prompt_too_long
    record = trainer.step()
    assert record.status == "rejected"
    assert "error/prompt_too_long" in record.reasons[0]
    assert trainer.version == 0

    grouped = make_trainer(checkpoint, tmp_path / "g", reject_scope="group", max_tokens=3)

    def grouped_first_too_long(prompts, params, samples_per_prompt=1, **options):
        prompts = [[1] * 600, *prompts[1:]]
        return original.__func__(grouped.engine, prompts, params, samples_per_prompt, **options)

    grouped.engine.run_batch = grouped_first_too_long
    record = grouped.step()
    assert "error/prompt_too_long" in record.reasons[0]
    if record.status == "accepted":  # the other groups trained; the bad one got no weight
        assert grouped.version == 1


def test_too_many_consecutive_rejections_stop_the_run(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, max_consecutive_rejections=2)
    trainer.runner.reward_fn = lambda c, r, p: [float("nan")] * len(c)
    with pytest.raises(TrainingError, match="3 consecutive rejected batches"):
        trainer.train()
    assert trainer.version == 0


def test_wrong_ack_checksum_fails_loudly(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path)
    real = trainer.engine.update_weights

    def corrupting(weights, version, mode="drain"):
        return dataclasses.replace(real(weights, version, mode), checksum="0" * 64)

    trainer.engine.update_weights = corrupting
    with pytest.raises(TrainingError, match="weight sync failed"):
        trainer.step()


def test_resume_continues_at_the_saved_version(checkpoint, tmp_path):
    first = make_trainer(checkpoint, tmp_path, steps=3, checkpoint_every=1)
    first.train()
    saved = snapshot(first)
    resumed = make_trainer(checkpoint, tmp_path, steps=5)
    assert resumed.version == resumed.engine.version == 3 and resumed.step_index == 3
    assert snapshot(resumed)[0] == saved[0]
    restored = snapshot(resumed)[1]
    assert saved[1].keys() == restored.keys()
    for index, fields in saved[1].items():
        assert torch.equal(fields["exp_avg_sq"], restored[index]["exp_avg_sq"])
        assert torch.equal(fields["step"], restored[index]["step"])
    straight = make_trainer(checkpoint, tmp_path / "straight", steps=5)
    for _ in range(resumed.source.batches_drawn):
        straight.next_batch()
    assert resumed.next_batch() == straight.next_batch()  # the prompt sequence continues
    resumed.train()
    assert resumed.version == 5
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "version-00005")
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, resumed.model.eval()(ids), atol=1e-5)


def test_rollouts_are_reused_within_the_lag_bound(checkpoint, tmp_path):
    batches = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=batches.append),
        steps=4,
        updates_per_batch=2,
        max_policy_lag=1,
    )
    trainer.train()
    accepted = [b for b in batches if b.status == "accepted"]
    assert trainer.version == 4
    fresh = [b.metrics["rollout_fresh"] for b in accepted]
    versions = [b.rollout.policy_version for b in accepted]
    assert fresh == [1.0, 0.0, 1.0, 0.0] and versions == [0, 0, 2, 2]
    assert accepted[1].rollout is accepted[0].rollout  # the same samples, one version older
    # With a lag bound of 0 the second update of a batch regenerates on-policy.
    strict = make_trainer(checkpoint, tmp_path / "strict", steps=2, updates_per_batch=2)
    records = []
    strict.hooks.on_step = records.append
    strict.train()
    assert [r.rollout.policy_version for r in records if r.status == "accepted"] == [0, 1]


def test_lag_bound_refuses_future_and_stale_rollouts(checkpoint, tmp_path):
    check_policy_lag(3, 3, 0)
    check_policy_lag(2, 3, 1)
    with pytest.raises(StaleRolloutError, match="future"):
        check_policy_lag(4, 3, 5)
    with pytest.raises(StaleRolloutError, match="2 versions old"):
        check_policy_lag(1, 3, 1)


def test_runner_reuses_within_the_bound_and_reports_freshness(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path)
    clock = {"v": 0}
    runner = RolloutRunner(
        trainer.runner.generator, trainer.runner.reward_fn, lambda: clock["v"], 1
    )
    batch = trainer.next_batch()
    first, fresh = runner(batch)
    assert fresh and first.policy_version == 0
    clock["v"] = 1
    again, fresh = runner(batch)
    assert again is first and not fresh
    clock["v"] = 2  # now 2 versions old: a fresh rollout is needed, but the engine is at 0
    with pytest.raises(StaleRolloutError):
        runner(batch)


def test_reward_error_carries_the_rollout(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path)
    trainer.runner.reward_fn = lambda c, r, p: [1.0]
    with pytest.raises(RewardError) as info:
        trainer.runner(trainer.next_batch())
    assert info.value.rollout.num_samples == 16


def test_config_validation_and_files(tmp_path):
    with pytest.raises(ValueError, match="exactly one of 'task' or 'data'"):
        GRPOConfig(model="m", output_dir="o")
    with pytest.raises(ValueError, match="unknown config keys"):
        GRPOConfig.from_dict({"model": "m", "output_dir": "o", "task": "always7", "bogus": 1})
    path = tmp_path / "job.toml"
    path.write_text('model = "m"\noutput_dir = "o"\ntask = "addition"\nsteps = 7\n')
    assert GRPOConfig.from_file(path).steps == 7
