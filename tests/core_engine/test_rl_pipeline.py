"""The asynchronous pipeline: generation of the next batch overlaps training, the lag of every
trained token is bounded, the off-policy samples get the decoupled loss, a stopped run resumes
without training a batch twice or losing one (a stop at the boundary too, and a prefetched
batch its reward rejected), and `one_step` resumes bit for bit."""

import collections
import contextlib
import itertools
import threading

import pytest
import torch

from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.rollout import sources
from core_engine.rl.rollout.seeds import batch_seed
from core_engine.rl.rollout.sources import BatchPlan, PrefetchSource, ThreadProducer
from core_engine.rl.trainer.checkpoint import latest_checkpoint, read_pending_rollout
from core_engine.rl.trainer.grpo import TrainingError
from core_engine.rl.trainer.records import StopReason, TrainerHooks
from core_engine.task import expand_runs
from core_engine.weight_sync import LocalChannel, WeightSyncError

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


def test_one_step_hides_generation_behind_training(checkpoint, tmp_path, monkeypatch):
    """Batch k+1 is generated while the trainer computes on batch k: here its engine steps
    wait until batch k's backward has begun, which only a pipeline that overlaps the two can
    satisfy (a loop that generated it before training would wait in vain and fail below).
    The trainer then only waits at the boundary for what is left of the generation."""
    backward_began = [threading.Event() for _ in range(4)]
    started = []
    start = ThreadProducer.start

    def counted_start(self, *args):
        started.append(len(started))
        return start(self, *args)

    monkeypatch.setattr(ThreadProducer, "start", counted_start)
    trainer = make_trainer(
        checkpoint, tmp_path, steps=4, pipeline="one_step", lora={"rank": 4}, **PIPELINED
    )
    backward = trainer._backward

    def marked_backward(samples):
        backward_began[trainer.step_index].set()
        return backward(samples)

    trainer._backward = marked_backward
    engine_step, overlapped = trainer.engine.step, []

    def gated_step(*args, **kwargs):
        batch = started[-1]
        producing = threading.current_thread().name == "rollout-producer"
        if producing and batch > 0 and all(overlapped):  # after a failure: no more waits
            overlapped.append(backward_began[batch - 1].wait(timeout=120))  # a hang guard
        return engine_step(*args, **kwargs)

    trainer.engine.step = gated_step
    trainer.train()
    assert trainer.version == 4 and len(started) == 4
    assert overlapped and all(overlapped)


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
    assert resumed.source.batches_drawn == len(records)  # the batch in flight is drawn again
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
    trainer.train()
    assert isinstance(trainer.source.producer, ThreadProducer)
    assert trainer.version == trainer.engine.version == 3
    for record in accepted(records):
        for i in range(record.rollout.num_samples):
            assert all(0 <= record.version.parent - v <= 1 for v in record.rollout.versions_of(i))


def test_acknowledgements_must_be_the_trainers_digests(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path)
    channel = LocalChannel(trainer.engine, trainer.model)
    channel.digests[3] = "ab" * 32
    channel.check_acks([(3, "ab" * 32)])
    with pytest.raises(WeightSyncError, match="version 3 with checksum cdcdcdcdcdcd"):
        channel.check_acks([(3, "cd" * 32)])
    with pytest.raises(WeightSyncError, match="the trainer wrote None"):
        channel.check_acks([(4, "cd" * 32)])


def test_an_in_flight_update_lands_mid_sequence(checkpoint, tmp_path, monkeypatch):
    """The update to version k+1 lands between two decode steps of batch k+1 (here its second
    engine step waits until the trainer writes): its samples span two versions, each token
    stamped with its own at the engine, and the trainer trains their tokens at lags 1 and 0
    within one sample, recording the gap the K/V mixture leaves in the lag-0 ones."""
    writing = {v: threading.Event() for v in range(1, 5)}
    real_writing = LocalChannel.writing

    @contextlib.contextmanager
    def marked_writing(self, version):
        with real_writing(self, version):
            writing[version].set()
            yield

    monkeypatch.setattr(LocalChannel, "writing", marked_writing)
    started = []
    start = ThreadProducer.start
    monkeypatch.setattr(
        ThreadProducer, "start", lambda self, *a: (started.append(len(started)), start(self, *a))[1]
    )
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
    engine_step, steps_of_batch, landed = trainer.engine.step, collections.Counter(), []

    def gated_step(*args, **kwargs):
        batch = started[-1]  # batch k+1 is generated while step k trains, then writes k+1
        if threading.current_thread().name == "rollout-producer" and batch > 0:
            steps_of_batch[batch] += 1
            if steps_of_batch[batch] == 2:
                landed.append(writing[batch].wait(timeout=120))  # a hang guard
        return engine_step(*args, **kwargs)

    trainer.engine.step = gated_step
    trainer.train()
    assert landed and all(landed)
    spanning = 0
    for record in accepted(records)[1:]:
        rollout = record.rollout
        runs = [rollout.token_versions[i] for i in range(rollout.num_samples)]
        spanning += sum(len(r) == 2 for r in runs)
        trained_at = record.version.parent
        assert all([v for v, _ in r] == [trained_at - 1, trained_at] for r in runs if len(r) == 2)
        assert record.metrics["policy_lag/0"] > 0 and record.metrics["policy_lag/1"] > 0
        if any(len(r) == 2 for r in runs):  # version k+1's tokens over version k's K/V
            assert record.metrics["kv_mixture_tokens"] > 0
            assert record.metrics["kv_mixture_gap_max"] > 0
    assert spanning > 0


def test_lora_pipeline_with_kl_never_serves_the_base_or_train_mode(checkpoint, tmp_path):
    """The KL reference is a module tree of its own over the frozen base, and the trainer
    never switches the served modules' mode: every engine step of a pipelined LoRA job with
    a KL term runs the adapter, in eval mode, while the trainer scores the reference."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    trainer = make_trainer(
        checkpoint,
        tmp_path,
        steps=4,
        pipeline="in_flight",
        lora={"rank": 4},
        kl_coef=0.1,
        **PIPELINED,
    )
    layers = [m for m in trainer.model.modules() if isinstance(m, BaseTunerLayer)]
    assert layers and trainer.reference is not trainer.model
    engine_step, states = trainer.engine.step, []

    def observed_step(*args, **kwargs):
        with trainer.engine.lock:  # the state the step computes under
            states.append(
                (
                    any(layer.disable_adapters for layer in layers),
                    any(m.training for m in trainer.model.modules()),
                )
            )
            return engine_step(*args, **kwargs)

    trainer.engine.step = observed_step
    trainer.train()
    assert trainer.version == 4 and len(states) > 8
    assert not any(disabled for disabled, _ in states)
    assert not any(training for _, training in states)


def test_a_bf16_engine_cpu_pipeline_serves_every_version(checkpoint, tmp_path):
    """The child's bf16 engine converts the trainer's shared fp32 weights at each version (it
    once served a stale copy and failed the weight sync after version 2): every version is
    acknowledged with the trainer's digest of its bf16 image."""
    records = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=records.append),
        steps=4,
        pipeline="one_step",
        engine_dtype="bfloat16",
        **PIPELINED,
    )
    assert trainer.train() is StopReason.DONE
    assert trainer.version == trainer.engine.version == 4
    assert [r.version.version for r in accepted(records)] == [1, 2, 3, 4]
    for name, served in trainer.engine.model.state_dict().items():
        assert torch.equal(served, trainer.model.state_dict()[name].to(served.dtype)), name


def test_a_reward_error_in_the_rollout_process_rejects_its_batch_with_the_rollout(
    checkpoint, tmp_path, monkeypatch
):
    """A full-weight CPU pipeline scores in its rollout process: a reward that fails there
    rejects the batch as on the trainer's thread, with the reward's reason and the rollout
    it could not score (recorded, never trained), until the rejection limit stops the run."""
    (tmp_path / "rlwb_offline.py").write_text(
        "def fn(completions, references, prompts):\n    raise ValueError('grader offline')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLWB_REWARDS", "offline=rlwb_offline:fn")
    records = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=records.append),
        pipeline="one_step",
        reward="offline",
        max_consecutive_rejections=2,
        **PIPELINED,
    )
    assert trainer.config.generates_in_process("cpu")
    with pytest.raises(TrainingError, match=r"3 consecutive rejected batches.*grader offline"):
        trainer.train()
    assert len(records) == 3 and trainer.version == 0
    for record in records:
        assert record.version is None and "grader offline" in record.reasons[0]
        assert record.rollout.num_samples == 16 and record.rollout.policy_version == 0


def test_a_stop_while_one_step_waits_at_the_boundary_loses_no_batch(
    checkpoint, tmp_path, monkeypatch
):
    """Stop pressed while the trainer, its gradients of batch 2 computed, waits for batch 3
    (the next batch is still generating): the checkpoint keeps batch 2, so the resumed run
    trains it first and the two runs together train exactly the straight run's batches, to
    the same weights."""
    overrides = {"pipeline": "one_step", "lora": {"rank": 4}, **PIPELINED}
    straight, straight_prompts, _ = run(checkpoint, tmp_path / "a", 5, **overrides)
    stop = threading.Event()
    produce = sources.produce_rollout
    boundary = PrefetchSource.before_update
    holder = {}

    def gated_produce(runner, batch, seed):
        if seed == batch_seed(0, 3):  # batch 3 generates until the stop is pressed
            assert stop.wait(timeout=120)  # a hang guard
        return produce(runner, batch, seed)

    def stop_at_the_boundary(self):
        if holder["trainer"].version == 2:
            stop.set()
        boundary(self)

    monkeypatch.setattr(sources, "produce_rollout", gated_produce)
    monkeypatch.setattr(PrefetchSource, "before_update", stop_at_the_boundary)
    trained = []
    hooks = TrainerHooks(
        on_step=lambda r: r.version is not None and trained.append(tuple(r.rollout.prompts)),
        should_stop=stop.is_set,
    )
    first = holder["trainer"] = make_trainer(
        checkpoint, tmp_path / "b", hooks, steps=5, **overrides
    )
    assert first.train() is StopReason.STOPPED and first.version == 2
    pending = read_pending_rollout(latest_checkpoint(tmp_path / "b" / "run"))
    assert pending["rollout"]["prompts"] == list(straight_prompts[2])
    monkeypatch.setattr(sources, "produce_rollout", produce)
    monkeypatch.setattr(PrefetchSource, "before_update", boundary)
    resumed, resumed_prompts, reason = run(checkpoint, tmp_path / "b", 5, **overrides)
    assert reason is StopReason.DONE and resumed.version == 5
    assert trained + resumed_prompts == straight_prompts  # batch 2 neither lost nor twice
    assert weights_of(resumed) == weights_of(straight)


def test_a_prefetched_batch_a_reward_rejects_is_kept_by_a_stop(checkpoint, tmp_path, monkeypatch):
    """A stop that finds the next batch produced but rejected by its reward keeps that
    rejection (and its rollout) in the checkpoint: the resumed run rejects the very rollout
    the straight run rejected, never one generated again under newer weights."""
    poisoned = BatchPlan(prompt_records("always7", None, count=64), 4, 0).at(2)["input"]
    (tmp_path / "rlwb_poisoned.py").write_text(
        f"POISONED = {poisoned!r}\n"
        "def fn(completions, references, prompts):\n"
        "    if any(p in prompt for p in POISONED for prompt in prompts):\n"
        "        raise ValueError('poisoned batch')\n"
        "    return [float(c.strip() == r) for c, r in zip(completions, references)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLWB_REWARDS", "poisoned=rlwb_poisoned:fn")
    overrides = {"pipeline": "one_step", "lora": {"rank": 4}, "reward": "poisoned", **PIPELINED}

    def rejected_rollouts(root, steps, stop_at=None):
        rejected, made = [], []
        hooks = TrainerHooks(
            on_step=lambda r: r.version is None and rejected.append(r.rollout),
            should_stop=lambda: stop_at is not None and made and made[0].version >= stop_at,
        )
        made.append(make_trainer(checkpoint, root, hooks, steps=steps, **overrides))
        return made[0], made[0].train(), rejected

    _, _, straight = rejected_rollouts(tmp_path / "a", 4)
    assert straight and straight[0].policy_version == 1  # batch 2, produced while 1 trained
    first, reason, before = rejected_rollouts(tmp_path / "b", 4, stop_at=2)
    assert reason is StopReason.STOPPED and first.version == 2 and not before
    pending = read_pending_rollout(latest_checkpoint(tmp_path / "b" / "run"))
    assert "poisoned batch" in pending["reward_error"]
    _, reason, after = rejected_rollouts(tmp_path / "b", 4)
    assert reason is StopReason.DONE
    assert [r.to_json() for r in after] == [r.to_json() for r in straight]
