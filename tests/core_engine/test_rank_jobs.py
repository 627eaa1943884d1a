"""A GRPO job on two ranks (`core_engine.rl.ranks.launch`: this process is rank 0, rank 1 a
spawned child) against the same job in one process.

Data-parallel rollouts sample each prompt with the seeds the one-process batch gives it, so
both runs see the same batches; the two-rank step equals the one-process step (fp32, within
1e-6), full weights (FSDP2, and replicated) and LoRA. Each version's checkpoint holds the
trainer's weights whole and, sharded, its optimizer state in one file per rank, and the engine
serves exactly those weights (its checksum). Checkpoints
resume on the same number of ranks bit for bit, and on another (resharding) as the one-process
run continues. A rank killed mid-job fails it with the rank named; a cancel stops every rank.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from core_engine.adapters import ADAPTER_FILE
from core_engine.model import load_model
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.ranks import is_sharded
from core_engine.rl.ranks.channel import RankChannel
from core_engine.rl.ranks.launch import RankFailedError, job_ranks
from core_engine.rl.ranks.state import is_sharded_checkpoint, load_optimizer_shards
from core_engine.rl.rollout.sources import ThreadProducer
from core_engine.rl.trainer.checkpoint import (
    OPTIMIZER_FILE,
    SHARDED_OPTIMIZER,
    checkpoint_dir,
    read_optimizer_state,
    read_pending_rollout,
    read_trainer_state,
)
from core_engine.rl.trainer.grpo import GRPOTrainer
from core_engine.rl.trainer.optimizer import build_optimizer
from core_engine.rl.trainer.records import StopReason, TrainerHooks
from core_engine.toy import save_tiny_checkpoint
from core_engine.weights import model_checksum, weights_checksum

pytestmark = pytest.mark.slow  # queued first under xdist (ranks start processes)

TIMEOUT = timedelta(seconds=120)  # generous: the ranks share two loaded cores
TOLERANCE = 1e-6
LORA = {"rank": 4, "alpha": 8.0}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    """A tiny Llama over digits: `always7`'s groups have reward variance."""
    path = tmp_path_factory.mktemp("llama")
    return str(save_tiny_checkpoint(path, arch="llama", alphabet="0123456789?=+"))


def _config(checkpoint: str, out: Path, devices: int, steps: int, **overrides) -> GRPOConfig:
    values = dict(
        model=checkpoint,
        output_dir=str(out),
        task="always7",
        steps=steps,
        batch_size=3,  # rank 0 generates two groups, rank 1 one
        group_size=4,
        lr=1e-4,
        max_tokens=3,
        seed=3,
        kl_coef=0.05,
        checkpoint_every=1,
        keep_last=0,  # every version's weights and (the newest's) optimizer state
        devices=devices,
    )
    return GRPOConfig(**{**values, **overrides})


def _records(config: GRPOConfig) -> list[dict[str, str]]:
    return prompt_records(config.task, config.data, seed=config.seed)  # as the CLI and worker


def _train(config: GRPOConfig, hooks: TrainerHooks | None = None) -> tuple[GRPOTrainer, list]:
    """The job in this process (rank 0 of `config.devices`); its step records."""
    steps: list = []
    hooks = hooks or TrainerHooks()
    hooks.on_step = hooks.on_step or steps.append
    if config.devices == 1:
        trainer = GRPOTrainer(config, _records(config), hooks)
        trainer.train()
        return trainer, steps
    with job_ranks(config, _records(config), TIMEOUT) as info:
        trainer = GRPOTrainer(config, _records(config), hooks, info)
        trainer.train()
    return trainer, steps


def _weights(out: Path, version: int) -> dict[str, torch.Tensor]:
    directory = checkpoint_dir(out, version)
    adapter = directory / ADAPTER_FILE
    return load_file(adapter if adapter.exists() else directory / "model.safetensors")


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.allclose(got[name], tensor, rtol=0, atol=TOLERANCE), name


def _optimizer_tensors(out: Path, version: int) -> dict:
    """A checkpoint's optimizer tensors, whole: read by one process (a sharded run's, resharded
    from its ranks' shards as a one-process resume reads them)."""
    directory = checkpoint_dir(out, version)
    if not is_sharded_checkpoint(directory):
        state = read_optimizer_state(directory)["state"]
        return {(i, k): v for i, fields in state.items() for k, v in fields.items()}
    model = load_model(directory, torch.float32, "cpu")
    optimizer = build_optimizer(model.parameters(), 1e-4, 0.0, "float32")
    groups = read_trainer_state(directory)["optimizer"]["param_groups"]
    load_optimizer_shards(optimizer, directory, groups)
    state = optimizer.state_dict()["state"]
    return {(i, k): v for i, fields in state.items() for k, v in fields.items()}


@pytest.mark.parametrize("mode", ["full", "replicated", "lora"])
def test_a_job_on_two_ranks_trains_as_in_one_process(llama, tmp_path, mode):
    lora = LORA if mode == "lora" else None
    sharding = "replicate" if mode == "replicated" else "fsdp2"
    _, one_steps = _train(_config(llama, tmp_path / "one", 1, 2, lora=lora))
    two, two_steps = _train(_config(llama, tmp_path / "two", 2, 2, lora=lora, sharding=sharding))
    assert [s.version.version for s in two_steps if s.version] == [1, 2]
    assert is_sharded(two.model) == (mode == "full")  # replicated: whole weights on each rank
    for got, want in zip(two_steps, one_steps, strict=True):  # rejections included
        assert got.rollout.response_ids == want.rollout.response_ids  # the same samples
        assert got.rollout.rewards == want.rollout.rewards
        assert got.rollout.ranks == [0] * 8 + [1] * 4  # whole groups, rank 0 the first two
        if got.version is not None:
            assert got.metrics["loss"] == pytest.approx(want.metrics["loss"], abs=TOLERANCE)
    for version in (1, 2):
        _assert_close(_weights(tmp_path / "two", version), _weights(tmp_path / "one", version))
    _assert_close(_optimizer_tensors(tmp_path / "two", 2), _optimizer_tensors(tmp_path / "one", 2))
    # the engine serves the gathered weights: rank 0's (and so, acknowledged, rank 1's)
    served = model_checksum(two.engine.model)
    assert two_steps[-1].version.checksum == served
    if mode != "lora":
        written = _weights(tmp_path / "two", 2)
        assert served == weights_checksum(written)


PIPELINED = {"max_policy_lag": 1, "drop_zero_variance_groups": False}


@pytest.mark.parametrize("mode", ["full", "replicated", "lora"])
def test_a_one_step_job_on_two_ranks_trains_as_in_one_process(llama, tmp_path, mode):
    """Each rank generates its share one batch ahead while the trainer computes; the gathered
    batches, the lag-1 updates and the weights equal the one-process `one_step` job's (whose
    full-weight rollouts come from its child process, LoRA's from a thread). Replicated, a
    rank's thread generates with the very modules its trainer computes with."""
    lora = LORA if mode == "lora" else None
    pipelined = {"pipeline": "one_step", "lora": lora, **PIPELINED}
    sharding = "replicate" if mode == "replicated" else "fsdp2"
    _, one_steps = _train(_config(llama, tmp_path / "one", 1, 3, **pipelined))
    two, two_steps = _train(_config(llama, tmp_path / "two", 2, 3, sharding=sharding, **pipelined))
    assert [s.version.version for s in two_steps] == [1, 2, 3]
    for got, want in zip(two_steps, one_steps, strict=True):
        assert got.rollout.response_ids == want.rollout.response_ids
        assert got.rollout.ranks == [0] * 8 + [1] * 4
        assert got.rollout.policy_version == want.rollout.policy_version
        assert got.metrics["policy_lag_max"] == want.metrics["policy_lag_max"]
        assert got.metrics["loss"] == pytest.approx(want.metrics["loss"], abs=TOLERANCE)
    assert [s.rollout.policy_version for s in two_steps] == [0, 0, 1]  # one ahead: lag 1
    for version in (1, 2, 3):
        _assert_close(_weights(tmp_path / "two", version), _weights(tmp_path / "one", version))
    assert two_steps[-1].version.checksum == model_checksum(two.engine.model)


def test_a_stopped_one_step_job_on_two_ranks_resumes_bit_for_bit(llama, tmp_path):
    """A job stopped at version 2 checkpoints the gathered next batch (produced ahead,
    completed and verified), and the resumed ranks train it as the uninterrupted job does."""
    pipelined = {"pipeline": "one_step", **PIPELINED}
    _train(_config(llama, tmp_path / "straight", 2, 4, **pipelined))
    done: list = []
    hooks = TrainerHooks(on_step=done.append, should_stop=lambda: len(done) >= 2)
    _train(_config(llama, tmp_path / "resumed", 2, 4, **pipelined), hooks)  # a cancel at v2
    pending = read_pending_rollout(checkpoint_dir(tmp_path / "resumed", 2))
    assert pending is not None and pending["rollout"]["ranks"] == [0] * 8 + [1] * 4
    _train(_config(llama, tmp_path / "resumed", 2, 4, **pipelined))
    want, got = _weights(tmp_path / "straight", 4), _weights(tmp_path / "resumed", 4)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_an_in_flight_update_lands_mid_sequence_on_two_ranks(llama, tmp_path, monkeypatch):
    """Rank 0's second engine step of each batch after the first waits until the trainer
    writes the next version: its samples span two versions, stamped per token at the engine;
    the gathered batch keeps them, and every trained token is within the lag bound."""
    writing = {v: threading.Event() for v in range(1, 5)}
    real_writing = RankChannel.writing

    @contextlib.contextmanager
    def marked_writing(self, version):
        with real_writing(self, version):
            writing[version].set()
            yield

    monkeypatch.setattr(RankChannel, "writing", marked_writing)
    config = _config(llama, tmp_path / "run", 2, 3, pipeline="in_flight", **PIPELINED)
    steps: list = []
    with job_ranks(config, _records(config), TIMEOUT) as info:
        trainer = GRPOTrainer(config, _records(config), TrainerHooks(on_step=steps.append), info)
        engine_step, landed = trainer.engine.step, []
        started = []
        start = ThreadProducer.start
        monkeypatch.setattr(
            ThreadProducer, "start", lambda s, *a: (started.append(len(started)), start(s, *a))[1]
        )
        calls = collections.Counter()

        def gated_step(*args, **kwargs):
            batch = started[-1]  # batch k+1 is generated while step k trains, then writes k+1
            if threading.current_thread().name == "rollout-producer" and batch > 0:
                calls[batch] += 1
                if calls[batch] == 2:
                    landed.append(writing[batch].wait(timeout=120))  # a hang guard
            return engine_step(*args, **kwargs)

        trainer.engine.step = gated_step
        trainer.train()
    assert landed and all(landed)
    assert [s.version.version for s in steps] == [1, 2, 3]
    spanning = 0
    for record in steps:
        rollout, trained_at = record.rollout, record.version.parent
        assert rollout.ranks == [0] * 8 + [1] * 4
        for i in range(rollout.num_samples):
            assert all(0 <= trained_at - v <= 1 for v in rollout.versions_of(i))
        spanning += sum(len(rollout.token_versions[i]) == 2 for i in range(8))  # rank 0's
    assert spanning > 0
    assert trainer.engine.version == 3


def test_a_checkpoint_resumes_on_the_same_and_on_another_number_of_ranks(llama, tmp_path):
    """Each rank writes its own shard of the optimizer state (DCP, safetensors), and the
    weights are consolidated into one Hugging Face file; resumed on 2 ranks the run continues
    bit for bit, on 1 (resharded) as the one-process run does, and back."""
    _train(_config(llama, tmp_path / "straight", 2, 4))
    _train(_config(llama, tmp_path / "half", 2, 2))
    saved = checkpoint_dir(tmp_path / "half", 2)
    assert not (saved / OPTIMIZER_FILE).exists()  # nothing gathered to rank 0
    assert len(list((saved / SHARDED_OPTIMIZER).glob("shard-*.safetensors"))) == 2
    assert sorted(p.name for p in saved.glob("*.safetensors")) == ["model.safetensors"]
    for devices, name in ((2, "same"), (1, "fewer")):
        shutil.copytree(tmp_path / "half", tmp_path / name)
        _train(_config(llama, tmp_path / name, devices, 4))
    want = _weights(tmp_path / "straight", 4)
    same = _weights(tmp_path / "same", 4)
    assert all(torch.equal(same[k], want[k]) for k in want)  # bit for bit
    _assert_close(_weights(tmp_path / "fewer", 4), want)  # resharded: 2 ranks -> 1
    _train(_config(llama, tmp_path / "one", 1, 2))
    shutil.copytree(tmp_path / "one", tmp_path / "more")
    _train(_config(llama, tmp_path / "more", 2, 4))
    _assert_close(_weights(tmp_path / "more", 4), want)  # resharded: 1 rank -> 2


def _child() -> multiprocessing.Process:
    (child,) = [p for p in multiprocessing.active_children() if p.name == "rank-1"]
    return child


def test_a_rank_killed_mid_job_fails_it_naming_the_rank(llama, tmp_path):
    def kill_rank_1(step) -> None:
        if step.version is not None and step.version.version == 1:
            os.kill(_child().pid, signal.SIGKILL)

    config = _config(llama, tmp_path / "run", 2, 4)
    with pytest.raises(RankFailedError, match=r"rank 1 was killed \(signal 9\)"):
        _train(config, TrainerHooks(on_step=kill_rank_1))


def test_a_cancel_stops_every_rank_at_the_same_step(llama, tmp_path):
    asked: list[multiprocessing.Process] = []  # rank 1's process, at each question
    made: list[GRPOTrainer] = []  # asked while loading too (the prompts' render): not counted

    def cancel_after_one() -> bool:
        if not made:
            return False
        asked.append(_child())
        return len(asked) > 1

    config = _config(llama, tmp_path / "run", 2, 4)
    batches: list = []
    hooks = TrainerHooks(on_step=batches.append, should_stop=cancel_after_one)
    with job_ranks(config, _records(config), TIMEOUT) as info:
        made.append(GRPOTrainer(config, _records(config), hooks, info))
        assert made[0].train() is StopReason.STOPPED
    assert len(batches) == 1  # stopped before the second batch
    assert asked[0].exitcode == 0  # rank 1 stopped there too, and ended on its own


def test_torchrun_runs_a_job_file_as_its_ranks(llama, tmp_path):
    """The multi-machine path on one machine: ``torchrun`` starts both ranks of the job file
    (`core_engine.rl.cli`); they train exactly as the ranks the worker starts."""
    config = _config(llama, tmp_path / "torchrun", 2, 2)
    values = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(values))
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "core_engine.rl", "train", str(job_file)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: version 2" in done.stdout
    _train(_config(llama, tmp_path / "worker", 2, 2))
    for version in (1, 2):
        got, want = (_weights(tmp_path / name, version) for name in ("torchrun", "worker"))
        assert all(torch.equal(got[k], want[k]) for k in want)
