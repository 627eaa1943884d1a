"""The asynchronous pipeline: generation of the next batch overlaps training, the lag of every
trained token is bounded, the off-policy samples get the decoupled loss, a stopped run resumes
without training a batch twice or losing one, and `one_step` resumes bit for bit."""

import itertools

import pytest
import torch

from core_engine.rl.checkpoint import latest_checkpoint, read_pending_rollout
from core_engine.rl.pipeline import RolloutProducer, check_acks, start_producer
from core_engine.rl.records import StopReason, TrainerHooks
from core_engine.rl.rollout_process import ProcessProducer
from core_engine.task import expand_runs

from .test_rl_exactness import run, weights_of
from .test_rl_trainer import make_trainer

# Zero-variance groups are trained (advantage 0): every batch steps, whatever samples this
# CPU's rounding draws, so no test waits on a learning trajectory.
PIPELINED = {"max_policy_lag": 1, "max_tokens": 6, "drop_zero_variance_groups": False}


def accepted(records):
    return [r for r in records if r.version is not None]


@pytest.mark.parametrize("pipeline", ["one_step", "in_flight"])
def test_every_trained_token_is_within_the_lag_bound(checkpoint, tmp_path, pipeline):
    records = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=records.append),
        steps=5,
        pipeline=pipeline,
        **PIPELINED,
    )
    assert trainer.train() is StopReason.DONE
    steps = accepted(records)
    assert [r.version.version for r in steps] == [1, 2, 3, 4, 5] == list(range(1, 6))
    assert trainer.engine.version == 5
    for record in steps:
        trained_at = record.version.parent
        rollout = record.rollout
        for i in range(rollout.num_samples):
            versions = rollout.versions_of(i)
            assert versions == sorted(versions)  # tokens in the order they were sampled
            assert all(0 <= trained_at - v <= 1 for v in versions)
            assert expand_runs(rollout.token_versions[i]) == versions
            if versions:
                assert rollout.sample_version(i) == versions[0]
        lags = {k: v for k, v in record.metrics.items() if k.startswith("policy_lag/")}
        assert sum(lags.values()) > 0 and set(lags) <= {"policy_lag/0", "policy_lag/1"}
        assert record.metrics["policy_lag_max"] <= 1
    # Batches are produced one version ahead: one_step trains a batch that follows a step at
    # lag 1 (whole samples); in flight, at lag 1 unless the update landed before its first
    # token (timing). Lagged batches get the decoupled loss's importance weights.
    assert steps[0].rollout.policy_version == 0
    for before, record in itertools.pairwise(records):
        if record.version is None or before.version is None:
            continue
        if pipeline == "one_step":
            assert record.metrics["policy_lag_max"] == 1
            assert record.rollout.policy_version == record.version.parent - 1
        if record.metrics["policy_lag_max"] == 1:
            assert record.metrics["is_weight_max"] > 0 and "is_truncated_fraction" in record.metrics


def test_one_step_overlaps_generation_with_training(checkpoint, tmp_path):
    """The next batch is generated during the step: the trainer's wait at the boundary is
    shorter than the generation it would otherwise have done after the step."""
    records = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=records.append),
        steps=4,
        pipeline="one_step",
        **PIPELINED,
    )
    trainer.train()
    for record in accepted(records)[1:]:
        assert record.metrics["wait_s"] >= 0.0
        assert "train_s" in record.metrics


def test_a_stopped_one_step_run_resumes_exactly(checkpoint, tmp_path):
    """The boundary's next rollout is complete, so the checkpoint keeps it: the resumed run
    trains it (not generated again under newer weights) and ends bit-identical."""
    overrides = {"pipeline": "one_step", **PIPELINED}
    straight, straight_prompts, _ = run(checkpoint, tmp_path / "a", 6, **overrides)
    first, first_prompts, reason = run(checkpoint, tmp_path / "b", 6, stop_at=3, **overrides)
    assert reason is StopReason.STOPPED and first.version == 3
    pending = read_pending_rollout(latest_checkpoint(tmp_path / "b" / "run"))
    assert pending["prefetched"] and pending["rollout"]["policy_version"] == 2
    resumed, resumed_prompts, reason = run(checkpoint, tmp_path / "b", 6, **overrides)
    assert reason is StopReason.DONE and resumed.version == 6
    assert first_prompts + resumed_prompts == straight_prompts  # none twice, none lost
    assert weights_of(resumed) == weights_of(straight)


def test_an_in_flight_batch_cut_by_a_crash_is_generated_again(checkpoint, tmp_path):
    """A checkpoint taken while the next batch is half generated cannot keep it: a run that
    resumes from it generates that batch again, and trains every batch once."""
    overrides = {"pipeline": "in_flight", "checkpoint_every": 1, **PIPELINED}
    records = []
    crash_at = 3

    def on_step(record):
        records.append(record)
        if record.version is not None and record.version.version == crash_at:
            raise KeyboardInterrupt  # the process dies after version 3's checkpoint

    trainer = make_trainer(
        checkpoint, tmp_path, TrainerHooks(on_step=on_step), steps=6, **overrides
    )
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    checkpoint_3 = latest_checkpoint(tmp_path / "run")
    assert checkpoint_3.name.endswith("3") and read_pending_rollout(checkpoint_3) is None
    resumed_records = []
    resumed = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=resumed_records.append),
        steps=6,
        **overrides,
    )
    assert resumed.batches_drawn == len(records)  # the batch in flight is drawn again
    resumed.train()
    prompts = [tuple(r.rollout.prompts) for r in accepted(records) + accepted(resumed_records)]
    assert len(prompts) == 6 and len(set(prompts)) == 6
    assert [r.version.version for r in accepted(resumed_records)] == [4, 5, 6]


def test_a_pipelined_run_trains_and_threads_are_restored(checkpoint, tmp_path):
    before = torch.get_num_threads()
    trainer = make_trainer(checkpoint, tmp_path, steps=2, pipeline="in_flight", **PIPELINED)
    trainer.train()
    assert torch.get_num_threads() == before
    assert trainer.engine.is_idle()


def test_lora_pipelines_generate_on_a_thread_within_the_bound(checkpoint, tmp_path):
    """LoRA keeps the producer on a thread (the adapter lives where the policy is loaded): the
    optimizer step and the update wait for the engine's step in progress, and the same rules
    hold."""
    records = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=records.append),
        steps=3,
        pipeline="in_flight",
        lora={"rank": 4},
        **PIPELINED,
    )
    assert isinstance(start_producer(trainer, 1), RolloutProducer)
    trainer.train()
    assert trainer.version == trainer.engine.version == 3
    for record in accepted(records):
        for i in range(record.rollout.num_samples):
            assert all(0 <= record.version.parent - v <= 1 for v in record.rollout.versions_of(i))


def test_a_rollout_process_must_acknowledge_the_trainers_checksums():
    check_acks([(3, "ab" * 32)], {3: "ab" * 32})
    with pytest.raises(RuntimeError, match="served version 3 with checksum cdcdcdcdcdcd"):
        check_acks([(3, "cd" * 32)], {3: "ab" * 32})
    with pytest.raises(RuntimeError, match="the trainer's is None"):
        check_acks([(4, "cd" * 32)], {3: "ab" * 32})


def test_a_full_weight_cpu_pipeline_generates_in_its_own_process(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, steps=1, pipeline="one_step", **PIPELINED)
    producer = start_producer(trainer, 1)
    try:
        assert isinstance(producer, ProcessProducer)
        producer.start(trainer.batch_at(0), 5)
        rollout, fresh, _ = producer.take()
        assert fresh and rollout.policy_version == 0 and rollout.num_samples == 16
        assert producer.acks == []  # served version 0 from the start: no update
        with producer.gate(1):
            pass  # the trainer's version moves to 1 (its weights unchanged here)
        producer.start(trainer.batch_at(1), 6)
        rollout, _, _ = producer.take()
        assert rollout.policy_version == 1 and [v for v, _ in producer.acks] == [1]
    finally:
        producer.close()
