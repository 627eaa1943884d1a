"""Rollouts produced by a child process over the trainer's own weights in shared memory (CPU).

Python threads share one interpreter lock: at the demo's size the engine's per-token Python and
the trainer's forward take turns on it, and a thread pipeline gains nothing (measured in
`benchmarks/bench_pipeline.py`). A spawned process has its own. The child's engine reads the
trainer's parameters themselves (`share_memory`; a lower-precision engine keeps its own copy,
converted from them at each new version), and the weight channel between the two is a
`core_engine.weight_sync.ProcessGate`: the trainer writes only while holding it, the child's
engine takes it for each step and serves a new version first thing in the step. The child's
acknowledgements come back with each rollout and are verified before the rollout is used or
checkpointed (`sources.PrefetchSource`). A child that dies fails the job within seconds, one
alive but without progress after the job's rollout timeout (`rollout.control`); a stop ends
the child's batch at its next decode step; the child ends when its parent does.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from core_engine.model import CausalLM
from core_engine.model.config import ModelConfig
from core_engine.rl.config import GRPOConfig
from core_engine.rl.rollout.control import BatchCancelled, Heartbeat
from core_engine.rl.rollout.interfaces import RolloutProducer
from core_engine.rl.rollout.runner import Produced, produce_rollout
from core_engine.rl.trainer.policy import colocated_engine, rollout_runner
from core_engine.scheduler import InferenceScheduler
from core_engine.weight_sync import GATE_POLL_S, ChildWeights, ProcessChannel, ProcessGate
from core_engine.weights import canonical_weights, published_weights

STARTUP_TIMEOUT_S = 600.0


class RolloutProcessError(RuntimeError):
    """The rollout process failed, died or never started."""


def _shared_model(checkpoint: str, weights: Mapping[str, torch.Tensor]) -> CausalLM:
    """A model whose parameters are `weights` themselves (no copy)."""
    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_hf(AutoConfig.from_pretrained(checkpoint)))
    model.load_state_dict(dict(weights), strict=False, assign=True)
    model.tie_weights()
    model.reset_rope()
    return model.eval()


def _serve(
    conn: multiprocessing.connection.Connection,
    config: GRPOConfig,
    weights: dict[str, torch.Tensor],
    max_seq_len: int,
    threads: int,
    gate: ProcessGate,
    stop: Any,
    last_beat: Any,
) -> None:
    """The child: build the engine over the shared weights, then produce a rollout per
    request until told to stop (or the trainer is gone); its batch ends once `stop` is set,
    and each of its decode steps is recorded in `last_beat` (`control.Heartbeat`)."""
    torch.set_num_threads(threads)
    try:
        tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True)
        model = _shared_model(config.model, weights)
        engine = colocated_engine(config, model, tokenizer, max_seq_len, gate.version.value)
        dtype = engine.model.lm_head.weight.dtype
        served = ChildWeights(gate, lambda: published_weights(model, dtype))
        engine.weight_source = served
        heartbeat = Heartbeat(stop.is_set, last_beat)
        runner = rollout_runner(config, engine, tokenizer, cancelled=heartbeat)  # never reused
    except Exception as exc:
        conn.send(("error", f"the rollout process could not start: {type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        batch, seed = request
        try:
            result, fresh, timings = produce_rollout(runner, batch, seed)
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        acks, served.acks = served.acks, []
        # the rollout, or the RewardError rejecting it (its raw rollout attached), as objects:
        # the pipe pickles them (converting to JSON and back cost a sixth of a demo batch)
        conn.send(("produced", ((result, fresh, timings), acks)))


class ProcessProducer(RolloutProducer):
    """A `RolloutProducer` producing in a spawned process, which serves the other side of the
    trainer's `channel` (its gate)."""

    def __init__(
        self,
        config: GRPOConfig,
        model: CausalLM,
        engine: InferenceScheduler,
        channel: ProcessChannel,
        max_seq_len: int,
        threads: int,
        timeout_s: float,
    ) -> None:
        """`engine` is the trainer's own (updated by the same channel); the child serves
        `engine`'s version of `model` from its first step; a batch without progress for
        `timeout_s` fails the wait (`control.ProducerHungError`)."""
        context = torch.multiprocessing.get_context("spawn")
        model.share_memory()
        self.channel, gate = channel, channel.gate
        self._conn, child = context.Pipe()
        self._stop, self.timeout_s = context.Event(), timeout_s
        self.heartbeat = Heartbeat(self._stop.is_set, context.RawValue("d", 0.0))
        weights = {name: t.detach() for name, t in canonical_weights(model).items()}
        self._process = context.Process(
            target=_serve,
            args=(
                child,
                config,
                weights,
                max_seq_len,
                threads,
                gate,
                self._stop,
                self.heartbeat.last,
            ),
            name="rollout-process",
            daemon=True,
        )
        self._process.start()
        child.close()
        channel.connect(self.alive)
        self._busy = self._hung = False
        kind, problem = self._receive(STARTUP_TIMEOUT_S, lambda: False)
        if kind != "ready":
            self.close()
            raise RolloutProcessError(problem)

    def alive(self) -> bool:
        return self._process.is_alive()

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, batch: Mapping[str, Sequence[str]], seed: int) -> None:
        if self._busy:
            raise RuntimeError("a rollout producer makes one batch at a time")
        self.heartbeat.beat()
        self._conn.send((dict(batch), seed))
        self._busy = True

    def take(self, cancelled: Callable[[], bool]) -> tuple[Produced, list[tuple[int, str]]]:
        """The started batch's outcome and the (version, checksum) updates the child
        acknowledged while producing it."""
        (kind, payload), self._busy = self._receive(None, cancelled), False
        if kind == "error":
            raise RolloutProcessError(f"rollout process: {payload}")
        return payload

    def _receive(self, timeout: float | None, cancelled: Callable[[], bool]) -> tuple[str, Any]:
        """The child's next message; a child that ends or stays silent past `timeout` is an
        error; a cancel stops the wait (`control.BatchCancelled`)."""
        waited = 0.0
        while not self._conn.poll(GATE_POLL_S):
            waited += GATE_POLL_S
            if not self.alive() and not self._conn.poll():
                return "error", f"the rollout process died (exit code {self._process.exitcode})"
            if cancelled():
                raise BatchCancelled("cancelled while the rollout process generated a batch")
            if self._busy and (hung := self.heartbeat.hung(self.timeout_s, "rollout process")):
                self._hung = True
                raise hung
            if timeout is not None and waited > timeout:
                return "error", f"no answer from the rollout process in {timeout:.0f} s"
        try:
            return self._conn.recv()
        except (EOFError, ConnectionResetError):  # a killed child's pipe: closed or reset
            self._process.join(timeout=5)  # its exit code, when it has one
            return "error", f"the rollout process died (exit code {self._process.exitcode})"

    def close(self) -> None:
        """Stop the child: its batch in progress ends at its next decode step; a hung child
        (or one that does not end) is killed."""
        self._stop.set()
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(None)
        self._process.join(timeout=0 if self._hung else 30)
        if self._process.is_alive():
            self._process.kill()  # SIGKILL: a stopped process ends too
            self._process.join()
        self._conn.close()
