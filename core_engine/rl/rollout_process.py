"""Rollouts produced by a child process over the trainer's own weights in shared memory (CPU).

Python threads share one interpreter lock: at the demo's size the engine's per-token Python and
the trainer's forward take turns on it, and a thread pipeline gains nothing (measured in
`benchmarks/bench_pipeline.py`). A spawned process has its own. The child serves the trainer's
parameters themselves (`share_memory`), so nothing is copied at an update; what keeps every
token attributable is the generation gate, a lock the child holds for each engine step and
releases between two:

- the trainer changes the weights only while it holds the gate, and sets the shared version
  number before it lets go (`GRPOTrainer._publish_next_version`);
- before each step the child takes the gate and, if the number moved, updates its engine to it
  (`update_weights(mode="in_flight")` over the same tensors: the version switch, the prefix
  invalidation and the acknowledged checksum), so a token is stamped with the version of the
  weights that computed it. The acknowledgements come back with the rollout and must equal the
  trainer's checksums of those versions.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from core_engine.model import CausalLM
from core_engine.model.config import ModelConfig
from core_engine.rl.colocate import colocated_engine, rollout_runner
from core_engine.rl.config import GRPOConfig
from core_engine.rl.rewards import RewardError
from core_engine.rl.rollout import Produced, RolloutResult, produce_rollout
from core_engine.scheduler import InferenceScheduler
from core_engine.weights import canonical_weights

STARTUP_TIMEOUT_S = 600.0


class GenerationGate:
    """The lock between the trainer's weight changes and the child's engine steps, fair to the
    trainer: while it waits, the child does not take the lock back between two steps."""

    def __init__(self, context: Any, version: int) -> None:
        self.lock = context.Lock()
        self.wanted = context.Event()  # the trainer waits for the lock
        self.free = context.Event()  # the trainer is done with it
        self.free.set()
        self.version = context.Value("q", version)

    @contextlib.contextmanager
    def held_by_trainer(self, new_version: int) -> Iterator[None]:
        """No engine step runs in the child for the duration; `new_version` is published to
        it when the block ends (the weights are then that version's)."""
        self.free.clear()
        self.wanted.set()
        with self.lock:
            self.wanted.clear()
            try:
                yield
            finally:
                self.version.value = new_version
                self.free.set()


class _ChildSync:
    """The child's side of the gate: held during each engine step, released between two."""

    def __init__(self, gate: GenerationGate, engine: InferenceScheduler) -> None:
        self.gate, self.engine = gate, engine
        self.held = False
        self.acks: list[tuple[int, str]] = []

    def before_step(self) -> bool:
        """Take the gate (after the trainer, if it waits) and serve its version; never
        cancels the batch."""
        self.release()
        if self.gate.wanted.is_set():
            self.gate.free.wait()
        self.gate.lock.acquire()
        self.held = True
        target = self.gate.version.value
        if target > self.engine.version:
            served = canonical_weights(self.engine.model)
            ack = self.engine.update_weights(served, target, mode="in_flight")
            self.acks.append((ack.version, ack.checksum))
        return False

    def release(self) -> None:
        if self.held:
            self.gate.lock.release()
            self.held = False


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
    gate: GenerationGate,
) -> None:
    """The child: build the engine over the shared weights, then produce a rollout per
    request until told to stop (or the trainer is gone)."""
    torch.set_num_threads(threads)
    try:
        tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True)
        model = _shared_model(config.model, weights)
        engine = colocated_engine(config, model, tokenizer, max_seq_len, gate.version.value)
        runner = rollout_runner(config, engine, tokenizer, lambda: engine.version)
        sync = _ChildSync(gate, engine)
        runner.generator.before_step = sync.before_step
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
            sync.before_step()  # serve the trainer's version from the first token
            result, fresh, timings = produce_rollout(runner, batch, seed)
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        finally:
            sync.release()
        if isinstance(result, RewardError):
            rollout = getattr(result, "rollout", None)
            payload = (str(result), None if rollout is None else _raw_json(rollout))
            conn.send(("reward_error", (payload, sync.acks)))
        else:
            conn.send(("rollout", (result.to_json(), fresh, timings, sync.acks)))
        sync.acks = []


def _raw_json(rollout: Any) -> dict[str, Any]:
    return RolloutResult(**vars(rollout)).to_json()


class ProcessProducer:
    """`pipeline.RolloutProducer`'s interface, producing in a spawned process. `acks` holds
    the (version, checksum) updates the child acknowledged for the last taken rollout."""

    def __init__(
        self, config: GRPOConfig, model: CausalLM, max_seq_len: int, version: int, threads: int
    ) -> None:
        context = torch.multiprocessing.get_context("spawn")
        model.share_memory()
        self.gate_lock = GenerationGate(context, version)
        self._conn, child = context.Pipe()
        weights = {name: t.detach() for name, t in canonical_weights(model).items()}
        self._process = context.Process(
            target=_serve,
            args=(child, config, weights, max_seq_len, threads, self.gate_lock),
            name="rollout-process",
            daemon=True,
        )
        self._process.start()
        child.close()
        self._busy = False
        self._outcome: Any = None
        self.acks: list[tuple[int, str]] = []
        kind, problem = self._receive(STARTUP_TIMEOUT_S)
        if kind != "ready":
            self.close()
            raise RuntimeError(problem)

    @property
    def busy(self) -> bool:
        return self._busy

    def gate(self, new_version: int) -> contextlib.AbstractContextManager[None]:
        return self.gate_lock.held_by_trainer(new_version)

    def start(self, batch: Mapping[str, Sequence[str]], seed: int) -> None:
        assert not self._busy, "one batch at a time"
        self._conn.send((dict(batch), seed))
        self._busy, self._outcome = True, None

    def join(self) -> None:
        if self._busy and self._outcome is None:
            self._outcome = self._receive(None)

    def finished_rollout(self) -> RolloutResult | None:
        if not self._busy or self._outcome is None or self._outcome[0] != "rollout":
            return None
        return RolloutResult.from_json(self._outcome[1][0])

    def take(self) -> Produced:
        self.join()
        (kind, payload), self._busy, self._outcome = self._outcome, False, None
        if kind == "error":
            raise RuntimeError(f"rollout process: {payload}")
        if kind == "reward_error":
            (message, raw), self.acks = payload
            error = RewardError(message)
            error.rollout = None if raw is None else RolloutResult.from_json(raw)
            return error, True, {}
        values, fresh, timings, self.acks = payload
        return RolloutResult.from_json(values), fresh, timings

    def _receive(self, timeout: float | None) -> tuple[str, Any]:
        if not self._conn.poll(timeout) and timeout is not None:
            return "error", f"no answer from the rollout process in {timeout:.0f} s"
        try:
            return self._conn.recv()
        except EOFError:
            return "error", f"the rollout process ended (exit code {self._process.exitcode})"

    def close(self) -> None:
        """Stop the child (after the batch it is producing, if any)."""
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(None)
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._conn.close()
