"""A batch in production: a stop ends it at its next decode step, in every mode, and the run
resumed from that stop trains exactly the straight run's batches; a producer alive but without
progress fails the job after its rollout timeout (`core_engine.rl.rollout.control`)."""

import collections
import threading

import pytest

from core_engine.rl.config import GRPOConfig
from core_engine.rl.rollout import sources
from core_engine.rl.rollout.control import (
    DEFAULT_ROLLOUT_TIMEOUT_S,
    ProducerHungError,
    rollout_timeout,
)
from core_engine.rl.rollout.seeds import batch_seed
from core_engine.rl.trainer.records import StopReason, TrainerHooks
from core_engine.scheduler import InferenceScheduler

from .guards import outcome_within
from .test_rl_exactness import run, weights_of
from .test_rl_pipeline import PIPELINED
from .test_rl_trainer import make_trainer


def stopped_mid_batch(checkpoint, root, monkeypatch, stop_version, **overrides):
    """A run whose stop is pressed during the first decode step the engine runs at
    `stop_version`; returns (trainer, prompts trained, stop reason, decode steps run per
    version, decode steps run after the stop)."""
    holder, steps, after = {}, collections.Counter(), []
    stop = threading.Event()
    step = InferenceScheduler.step

    def counted_step(self):
        if stop.is_set():
            after.append(1)
        if "t" in holder:
            steps[holder["t"].version] += 1
            if holder["t"].version == stop_version:
                stop.set()
        return step(self)

    monkeypatch.setattr(InferenceScheduler, "step", counted_step)
    trained = []
    hooks = TrainerHooks(
        on_step=lambda r: r.version is not None and trained.append(tuple(r.rollout.prompts)),
        should_stop=stop.is_set,
    )
    trainer = holder["t"] = make_trainer(checkpoint, root, hooks, steps=4, **overrides)
    reason = trainer.train()
    monkeypatch.setattr(InferenceScheduler, "step", step)
    return trainer, trained, reason, steps, len(after)


def test_a_stop_ends_a_synchronous_batch_at_its_next_decode_step(checkpoint, tmp_path, monkeypatch):
    """Stop pressed during batch 1's first decode step: its generation ends there (no step
    after it), batch 1 is not drawn, and the resumed run trains it: the two runs together
    train the straight run's batches, to the same weights."""
    overrides = {"max_tokens": 6, "drop_zero_variance_groups": False}
    straight, straight_prompts, _ = run(checkpoint, tmp_path / "a", 4, **overrides)
    first, trained, reason, steps, after = stopped_mid_batch(
        checkpoint, tmp_path / "b", monkeypatch, 1, **overrides
    )
    assert reason is StopReason.STOPPED and first.version == 1
    assert steps[1] == 1 and after == 0 and steps[0] > 1  # batch 0 ran whole, batch 1 did not
    resumed, resumed_prompts, reason = run(checkpoint, tmp_path / "b", 4, **overrides)
    assert reason is StopReason.DONE
    assert trained + resumed_prompts == straight_prompts
    assert weights_of(resumed) == weights_of(straight)


def test_a_stop_ends_a_prefetched_batch_at_its_next_decode_step(checkpoint, tmp_path, monkeypatch):
    """A `one_step` LoRA run (its batches on a thread): stop pressed while the next batch
    generates; the trainer does not wait for that batch (no decode step after the stop) and
    the resumed run ends where the straight run does."""
    overrides = {"pipeline": "one_step", "lora": {"rank": 4}, **PIPELINED}
    straight, straight_prompts, _ = run(checkpoint, tmp_path / "a", 4, **overrides)
    _, trained, reason, _, after = stopped_mid_batch(
        checkpoint, tmp_path / "b", monkeypatch, 1, **overrides
    )
    assert reason is StopReason.STOPPED and after == 0
    resumed, resumed_prompts, reason = run(checkpoint, tmp_path / "b", 4, **overrides)
    assert reason is StopReason.DONE
    assert trained + resumed_prompts == straight_prompts
    assert weights_of(resumed) == weights_of(straight)


def test_a_producer_alive_without_progress_fails_the_job(checkpoint, tmp_path, monkeypatch):
    """Batch 1's production blocks (alive, no decode step): the trainer waiting for it fails
    with `ProducerHungError` once the job's `rollout_timeout_s` has passed."""
    released = threading.Event()
    produce = sources.produce_rollout

    def blocked(runner, batch, seed):
        if seed == batch_seed(0, 1):
            released.wait()
        return produce(runner, batch, seed)

    monkeypatch.setattr(sources, "produce_rollout", blocked)
    overrides = {"pipeline": "one_step", "lora": {"rank": 4}, **PIPELINED}
    trainer = make_trainer(checkpoint, tmp_path, steps=3, rollout_timeout_s=0.5, **overrides)
    try:
        failure = outcome_within(trainer.train)
    finally:
        released.set()
    assert isinstance(failure, ProducerHungError)
    assert "rollout thread made no progress" in str(failure) and "0.5 s" in str(failure)


def job(**fields):
    return GRPOConfig(model="m", output_dir="o", task="always7", **fields)


def test_the_rollout_timeout_is_the_job_s_else_the_worker_s_else_ten_minutes(monkeypatch):
    monkeypatch.delenv("RLWB_ROLLOUT_TIMEOUT", raising=False)
    assert rollout_timeout(job()) == DEFAULT_ROLLOUT_TIMEOUT_S == 600.0
    monkeypatch.setenv("RLWB_ROLLOUT_TIMEOUT", "30")
    assert rollout_timeout(job()) == 30.0
    assert rollout_timeout(job(rollout_timeout_s=7.0)) == 7.0


@pytest.mark.parametrize("value", [0.0, -1.0, 8 * 86_400.0])
def test_a_rollout_timeout_out_of_bounds_is_refused(value):
    with pytest.raises(ValueError, match="rollout_timeout_s"):
        job(rollout_timeout_s=value)
