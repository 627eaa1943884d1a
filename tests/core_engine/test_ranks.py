"""One job across several devices (`core_engine.rl.ranks`, issue 31).

Two `gloo` ranks run in processes spawned here, on a tiny Llama. Their step on a batch split
across them is checked against the one-process step on the whole batch (what `GRPOTrainer`
runs: `accumulate_gradients`, `clip_grad_norm_`, the optimizer step): the gradients, their
norm, the statistics and the weights after the optimizer step agree, with full weights (FSDP2,
and replicated) and with LoRA. A rank that dies or stops answering makes the other's collective
fail within the group's timeout. A job asking for more devices than a worker has is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from core_engine.adapters import add_adapter, base_view
from core_engine.lora_settings import LoraSettings
from core_engine.model import CausalLM, load_model
from core_engine.rl.objective.advantages import advantages as estimate
from core_engine.rl.objective.update import TrainSample, UpdateSettings, accumulate_gradients
from core_engine.rl.ranks import (
    RankSetupError,
    clip_gradients,
    distribute_policy,
    distributed_backward,
    is_sharded,
    rank_from_environment,
    rank_group,
    rank_share,
)
from core_engine.rl.trainer.optimizer import build_optimizer
from core_engine.toy import save_tiny_checkpoint

pytestmark = pytest.mark.slow  # queued first under xdist (ranks start processes)

WORLD = 2
GROUP_SIZE = 2
STEPS = 2  # the second step also checks the optimizer state and (LoRA) the A matrices
# lr: Adam's first step is lr * g / (|g| + 1e-8). Where cancellation leaves |g| near 1e-9,
# the summation order alone changes g by ~2e-10 and so the step by up to ~lr / 50 (measured:
# 1.3e-6 at lr 1e-4); at 1e-5 that stays under the tolerance, while most weights move by lr.
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-5, 0.01, 0.5
WEIGHT_TOLERANCE = 1e-6
SETTINGS = UpdateSettings(
    temperature=0.9, clip_eps=0.2, kl_coef=0.05, max_tokens=16, chunk_rows=8
)  # 16 tokens: rank 0 packs more micro-batches than rank 1
LORA = LoraSettings(rank=4, alpha=8.0, modules_to_save=("lm_head",))
STEP_TIMEOUT = timedelta(seconds=120)  # generous: the ranks share two loaded cores
FAULT_TIMEOUT = timedelta(seconds=15)  # how long rank 0 waits for a rank that stopped answering
JOIN_TIMEOUT_S = 300.0  # a test whose ranks hang fails instead of hanging the suite


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return str(save_tiny_checkpoint(tmp_path_factory.mktemp("llama"), arch="llama"))


def _batch(vocab: int) -> list[TrainSample]:
    """Three groups of two (rank 0 takes two, rank 1 one), uneven lengths, a partly masked
    response and a lagged token (importance correction), behaviour log-probs off the policy's
    so that some ratios leave the clip range."""
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.2], [0.0, 1.0]])
    advantages = estimate(rewards, torch.ones_like(rewards)).view(-1).tolist()
    generator = torch.Generator().manual_seed(7)
    samples = []
    for i, advantage in enumerate(advantages):
        prompt = torch.randint(3, vocab, (3 + i % 3,), generator=generator).tolist()
        response = torch.randint(3, vocab, (2 + (5 * i) % 6,), generator=generator).tolist()
        behaviour = (torch.randn(len(response), generator=generator) * 0.4 - 3.0).tolist()
        mask = [1, 0] * (len(response) // 2) + [1] * (len(response) % 2) if i == 3 else None
        lags = [1] + [0] * (len(response) - 1) if i in (1, 4) else None
        samples.append(TrainSample(prompt, response, behaviour, advantage, None, lags, mask))
    return samples


def _policy(mode: str, checkpoint: str, adapter_seed: int) -> tuple[CausalLM, CausalLM]:
    """The fp32 policy (with a fresh adapter seeded by `adapter_seed` for LoRA) and its KL
    reference, as `core_engine.rl.trainer.policy` builds them."""
    model = load_model(checkpoint, torch.float32, "cpu").eval()
    if mode != "lora":  # full weights, sharded ("full") or "replicated"
        return model, load_model(checkpoint, torch.float32, "cpu").eval()
    torch.manual_seed(adapter_seed)
    add_adapter(model, LORA)
    return model.eval(), base_view(model)


def _optimizer(model: CausalLM) -> torch.optim.Optimizer:
    trainable = [p for p in model.parameters() if p.requires_grad]
    return build_optimizer(trainable, LR, WEIGHT_DECAY, "float32")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A whole tensor (FSDP2's shards gathered: a collective, on every rank)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _record(model: CausalLM, update, norm: float) -> dict:
    grads = {n: _full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    return {"update": dataclasses.asdict(update), "norm": norm, "grads": grads}


def _one_process(mode: str, checkpoint: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The reference: the whole batch in this process, as `GRPOTrainer` steps."""
    model, reference = _policy(mode, checkpoint, adapter_seed=0)
    optimizer = _optimizer(model)
    batch = _batch(model.config.vocab_size)
    steps = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        update = accumulate_gradients(model, batch, SETTINGS, reference)
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM))
        steps.append(_record(model, update, norm))
        optimizer.step()
    return steps, {n: _full(p) for n, p in model.named_parameters()}


def _step_on_rank(rank: int, mode: str, checkpoint: str, out: str) -> None:
    """Rank `rank` of the 2-rank step; rank 1 starts from another adapter (rank 0's must
    reach it)."""
    with rank_group("cpu", STEP_TIMEOUT) as info:
        model, reference = _policy(mode, checkpoint, adapter_seed=rank)
        model = distribute_policy(model, shard=mode == "full")
        assert is_sharded(model) == (mode == "full")
        optimizer = _optimizer(model)
        share = rank_share(_batch(model.config.vocab_size), GROUP_SIZE, rank, info.world_size)
        steps = []
        for _ in range(STEPS):  # as `GRPOTrainer` steps on a rank
            optimizer.zero_grad(set_to_none=True)
            update = distributed_backward(model, share, SETTINGS, reference)
            norm = clip_gradients(model, MAX_GRAD_NORM)
            steps.append(_record(model, update, norm))
            optimizer.step()
        weights = {n: _full(p) for n, p in model.named_parameters()}
        torch.save({"steps": steps, "weights": weights}, Path(out) / f"rank{rank}.pt")


def _dead_or_silent_peer(rank: int, how: str, out: str) -> None:
    """Rank 1 dies (SIGKILL) or stops answering (alive, in no collective) once the group is
    up; rank 0's next collective must raise, and rank 0 writes what it raised."""
    report = Path(out) / "rank0.txt"
    with rank_group("cpu", FAULT_TIMEOUT):
        dist.barrier()
        if rank == 1:
            if how == "dies":
                os.kill(os.getpid(), signal.SIGKILL)
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            while not report.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            os._exit(0)  # gone without leaving the group
        try:
            dist.all_reduce(torch.ones(1))
            report.write_text("no error")
        except Exception as exc:  # what the job would report as the step's failure
            report.write_text(f"{type(exc).__name__}: {exc}")


def _rank_main(target, rank: int, port: int, args: tuple) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    target(rank, *args)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_ranks(target, *args) -> list[int | None]:
    """`target(rank, *args)` in `WORLD` spawned processes; their exit codes. Processes still
    running after `JOIN_TIMEOUT_S` are killed and fail the test."""
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    processes = [
        context.Process(target=_rank_main, args=(target, rank, port, args)) for rank in range(WORLD)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for rank in hung:
        processes[rank].kill()
        processes[rank].join()
    assert not hung, f"ranks {hung} still running after {JOIN_TIMEOUT_S:.0f} s"
    return [process.exitcode for process in processes]


def _assert_update_equal(got: dict, want: dict) -> None:
    for key in ("loss", "kl", "clip_fraction", "ratio_outside_fraction", "ratio_max", "entropy"):
        assert math.isclose(got[key], want[key], rel_tol=1e-6, abs_tol=1e-6), key
    assert got["importance"].keys() == want["importance"].keys()
    for key, value in want["importance"].items():
        assert math.isclose(got["importance"][key], value, rel_tol=1e-6, abs_tol=1e-6), key
    assert len(got["logprobs"]) == len(want["logprobs"])
    for row, expected in zip(got["logprobs"], want["logprobs"], strict=True):
        # fp32 log-probs of about -log(vocab): a few units in the last place
        torch.testing.assert_close(torch.tensor(row), torch.tensor(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["full", "replicated", "lora"])
def test_a_step_on_two_ranks_equals_the_one_process_step(llama, tmp_path, mode):
    assert _run_ranks(_step_on_rank, mode, llama, str(tmp_path)) == [0, 0]
    want_steps, want_weights = _one_process(mode, llama)
    assert want_steps[0]["norm"] > MAX_GRAD_NORM  # the clip is exercised
    assert want_steps[0]["update"]["clip_fraction"] > 0 and want_steps[0]["update"]["importance"]
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for step, want in zip(got["steps"], want_steps, strict=True):
            assert math.isclose(step["norm"], want["norm"], rel_tol=1e-6)
            _assert_update_equal(step["update"], want["update"])
            assert step["grads"].keys() == want["grads"].keys()
            for name, grad in want["grads"].items():
                torch.testing.assert_close(step["grads"][name], grad, rtol=1e-5, atol=1e-7)
        assert got["weights"].keys() == want_weights.keys()
        for name, weight in want_weights.items():
            torch.testing.assert_close(got["weights"][name], weight, rtol=0, atol=WEIGHT_TOLERANCE)
    start = dict(_policy(mode, llama, adapter_seed=0)[0].named_parameters())
    moved = max(float((w - start[n].detach()).abs().max()) for n, w in want_weights.items())
    assert moved > 10 * WEIGHT_TOLERANCE  # the comparison of the weights is not vacuous


@pytest.mark.parametrize("how", ["dies", "stops_answering"])
def test_a_lost_rank_fails_the_others_collective_instead_of_hanging(tmp_path, how):
    exit_codes = _run_ranks(_dead_or_silent_peer, how, str(tmp_path))
    report = (tmp_path / "rank0.txt").read_text()
    assert exit_codes[0] == 0
    assert exit_codes[1] == (-signal.SIGKILL if how == "dies" else 0)
    assert report.startswith(("DistBackendError", "RuntimeError")), report
    waited = f"Timed out waiting {FAULT_TIMEOUT // timedelta(milliseconds=1)}ms"
    if how == "dies":  # gloo sees the connection go (or, at the latest, the group's timeout)
        assert "Connection" in report or waited in report, report
    else:  # only the group's timeout ends the wait
        assert waited in report, report


@pytest.mark.parametrize(
    ("samples", "shares"),
    [(6, [[0, 1, 2, 3], [4, 5]]), (4, [[0, 1], [2, 3]]), (2, [[0, 1], []])],
)
def test_a_batch_splits_into_whole_groups_in_order(samples, shares):
    assert [rank_share(list(range(samples)), 2, r, 2) for r in range(2)] == shares
    with pytest.raises(ValueError, match="whole groups"):
        rank_share(list(range(5)), 2, 0, 2)


def test_a_rank_is_read_from_torchrun_variables():
    environ = dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="h", MASTER_PORT="1")
    info = rank_from_environment(environ, "cpu")
    assert (info.rank, info.world_size, info.device) == (1, 2, torch.device("cpu"))
    with pytest.raises(RankSetupError, match="MASTER_PORT"):
        rank_from_environment({**environ, "MASTER_PORT": ""}, "cpu")
    with pytest.raises(RankSetupError, match="no rank 2"):
        rank_from_environment({**environ, "RANK": "2"}, "cpu")


JOB = {"model": "demo", "task": "always7", "steps": 2}


@pytest.mark.parametrize(("devices", "problem"), [(0, ">= 1"), (65, "<= 64"), (1.0, "whole")])
def test_devices_is_a_whole_number_from_1_to_64(devices, problem):
    from workers.specs import SpecError
    from workers.submission import validate_job

    with pytest.raises(SpecError, match=f"devices must be .*{problem}"):
        validate_job("train", {**JOB, "devices": devices})


def test_sharding_is_fsdp2_or_replicate_at_submission(monkeypatch):
    from workers.specs import SpecError
    from workers.submission import validate_job

    monkeypatch.setenv("RLWB_DEVICES", "2")
    assert validate_job("train", {**JOB, "devices": 2, "sharding": "replicate"}) == 2
    with pytest.raises(SpecError, match="sharding must be one of fsdp2, replicate"):
        validate_job("train", {**JOB, "devices": 2, "sharding": "zero3"})


def test_more_devices_than_a_worker_has_are_refused_at_submission(monkeypatch):
    from workers.specs import SpecError, machine_devices
    from workers.submission import validate_job

    monkeypatch.setenv("RLWB_DEVICES", "2")
    assert validate_job("train", {**JOB, "devices": 2}) == 2
    with pytest.raises(SpecError, match=r"devices = 3 > the 2 CPU cores a worker has"):
        validate_job("train", {**JOB, "devices": 3})
    monkeypatch.delenv("RLWB_DEVICES")
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    with pytest.raises(SpecError, match=r"devices = 4 > the 3 CPU cores"):
        validate_job("train", {**JOB, "devices": 4})
    cuda = {**JOB, "device": "cuda", "devices": max(2, torch.cuda.device_count() + 1)}
    with pytest.raises(SpecError, match="CUDA devices a worker has"):
        validate_job("train", cuda)  # torch is loaded here, as in the worker
    monkeypatch.setenv("RLWB_DEVICE", "cuda")  # a job naming no device runs on the worker's
    with pytest.raises(SpecError, match="CUDA devices a worker has"):
        validate_job("train", {**JOB, "devices": cuda["devices"]})
    monkeypatch.delitem(sys.modules, "torch")
    assert machine_devices("cuda") is None  # the UI: left to the worker's re-check


def _load_shard_on_rank(rank: int, checkpoint: str, out: str) -> None:
    """Rank `rank` loads the sharded policy; it writes the bytes its reader copied out of the
    checkpoint, the bytes of its parameters' storage and its rows of each weight."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    from core_engine.rl.ranks.state import load_sharded_model

    read = []
    real_read = HuggingFaceStorageReader._process_read_request

    def counted(self, f, req, planner):
        read.append(math.prod(req.lengths) * 4)  # fp32
        return real_read(self, f, req, planner)

    HuggingFaceStorageReader._process_read_request = counted
    with rank_group("cpu", STEP_TIMEOUT):
        model = load_sharded_model(checkpoint, torch.device("cpu"))
    storages = {p.to_local().untyped_storage().data_ptr(): p.to_local() for p in model.parameters()}
    held = sum(t.untyped_storage().nbytes() for t in storages.values())
    local = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
    torch.save({"read": sum(read), "held": held, "local": local}, Path(out) / f"{rank}.pt")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: the LM head tied to the embedding
def test_each_rank_reads_and_holds_only_its_shard(tmp_path, arch):
    """Built on the meta device and sharded first, a rank's policy gets storage for its rows
    alone (FSDP2 pads each to torch.chunk's largest), and reads exactly those rows."""
    checkpoint = str(save_tiny_checkpoint(tmp_path / "model", arch=arch, vocab_size=64))
    assert _run_ranks(_load_shard_on_rank, checkpoint, str(tmp_path)) == [0, 0]
    full = load_model(checkpoint, torch.float32, "cpu")
    weights = {n: p.detach() for n, p in full.named_parameters()}  # tied: once
    padded = sum(w.chunk(WORLD)[0].numel() * 4 for w in weights.values())
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"{rank}.pt")
        mine = {n: w.chunk(WORLD)[rank] for n, w in weights.items()}
        assert got["read"] == sum(w.numel() * 4 for w in mine.values())  # its rows, once each
        assert got["held"] == padded  # 1/N of the model, not all of it
        assert got["local"].keys() == mine.keys()
        for name, rows in mine.items():
            assert torch.equal(got["local"][name], rows), name


def _held(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (an FSDP2 parameter's: its shard)."""
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None]
    return sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in local}.values()
    )


def _footprint_on_rank(rank: int, checkpoint: str, out: str) -> None:
    """Rank `rank` builds the trainer's policy as `GRPOTrainer` does, steps once, and writes
    the bytes its tensors hold: weights, gradients, AdamW moments, the KL reference, the
    engine's copy."""
    from core_engine.rl.config import GRPOConfig
    from core_engine.rl.trainer.policy import trained_policy

    config = GRPOConfig(checkpoint, output_dir=out, task="always7", devices=WORLD, kl_coef=0.05)
    with rank_group("cpu", STEP_TIMEOUT) as info:
        policy = trained_policy(config, None, info.device, on_ranks=True)
        model, optimizer = policy.model, policy.optimizer
        share = rank_share(_batch(model.config.vocab_size), GROUP_SIZE, rank, info.world_size)
        distributed_backward(model, share, SETTINGS, policy.reference)
        optimizer.step()
        moments = [v for s in optimizer.state.values() for v in s.values() if v.dim()]  # no step
        held = {
            "trainer": _held(
                [*model.parameters(), *(p.grad for p in model.parameters()), *moments]
            ),
            "reference": _held(policy.reference.parameters()),
            "engine": _held(policy.whole_model.parameters()),
        }
    (Path(out) / f"{rank}.json").write_text(json.dumps(held))


def test_the_footprint_is_what_a_sharded_rank_holds(llama, tmp_path):
    """What `training_footprint` counts for one of two FSDP2 ranks is what rank 0 (the one
    with the most rows) holds after a step, its tensors' storage counted; rank 1 holds no more."""
    from transformers import AutoConfig

    from core_engine.rl.config import GRPOConfig
    from core_engine.rl.footprint.estimate import training_footprint

    assert _run_ranks(_footprint_on_rank, llama, str(tmp_path)) == [0, 0]
    config = GRPOConfig(
        llama, output_dir=str(tmp_path), task="always7", devices=WORLD, kl_coef=0.05
    )
    footprint = training_footprint(
        config, AutoConfig.from_pretrained(llama), torch.device("cpu"), WORLD
    )
    counted = {
        "trainer": footprint.trainer_bytes,
        "reference": footprint.reference_bytes,
        "engine": footprint.engine_copy_bytes,
    }
    held = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(WORLD)]
    assert held[0] == counted
    assert all(held[1][part] <= counted[part] for part in counted)


STAGED_FILE_BYTES = 20_000  # the ranks' bound below: a tiny Llama's shards are 4-16 KiB


def _save_on_rank(rank: int, checkpoint: str, out: str) -> None:
    """Rank `rank` saves its shards of the policy and of its AdamW state under files of at most
    `STAGED_FILE_BYTES`; it writes, for each file its writer built in memory, the number of
    tensors and their bytes."""
    import safetensors.torch

    from core_engine.rl.ranks import state

    staged = []
    real_save = safetensors.torch.save

    def counted(tensors, metadata=None):
        staged.append([len(tensors), sum(t.nbytes for t in tensors.values())])
        return real_save(tensors, metadata)

    safetensors.torch.save = counted  # what DCP's writer calls on each file's tensors
    state.FILE_BYTES = STAGED_FILE_BYTES
    with rank_group("cpu", STEP_TIMEOUT):
        model = state.load_sharded_model(checkpoint, torch.device("cpu"))
        optimizer = build_optimizer(model.parameters(), LR, WEIGHT_DECAY, "float32")
        state.initialise_state(optimizer)
        state.save_sharded_state(model, optimizer, Path(out) if rank == 0 else None)
    (Path(out) / f"{rank}.json").write_text(json.dumps(staged))


def test_a_sharded_save_stages_at_most_one_bounded_file_at_a_time(llama, tmp_path):
    """DCP's writer builds each file whole in memory: a rank's shards are written in files of at
    most `FILE_BYTES` (a larger tensor alone), never all at once, and the weights' files still
    consolidate into the model the ranks loaded."""
    from safetensors.torch import load_file

    assert _run_ranks(_save_on_rank, llama, str(tmp_path)) == [0, 0]
    full = load_model(llama, torch.float32, "cpu")
    weights = {n: p.detach() for n, p in full.named_parameters()}
    for rank in range(WORLD):
        staged = json.loads((tmp_path / f"{rank}.json").read_text())
        assert all(count == 1 or size <= STAGED_FILE_BYTES for count, size in staged)
        assert any(count > 1 for count, _ in staged)  # small tensors share a file
        mine = sum(w.chunk(WORLD)[rank].numel() * 4 for w in weights.values())
        # its rows of the weights and of both moments, and some of the AdamW steps (replicated
        # 4-byte scalars: DCP has each written by one rank)
        assert sum(size for _, size in staged) - 3 * mine in range(0, 4 * len(weights) + 1)
    saved = load_file(tmp_path / "model.safetensors")
    assert saved.keys() == weights.keys()
    for name, weight in weights.items():
        assert torch.equal(saved[name], weight), name
