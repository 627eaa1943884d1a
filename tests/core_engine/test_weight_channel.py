"""The one weight channel: a writer goes ahead of the engine's next step; a child process's
engine serves the trainer's changed weights from its next step and acknowledges them; a child
that dies holding the gate fails the trainer's write instead of hanging it, and a cancel
reaches a trainer waiting for the gate."""

import contextlib
import os
import signal
import threading

import pytest
import torch

from core_engine.rl.objective.logprobs import packed_response_logprobs
from core_engine.rl.rollout.control import ProducerHungError
from core_engine.rl.rollout.process import ProcessProducer, RolloutProcessError
from core_engine.weight_sync import GateWaitCancelled, PeerDiedError, StepGate

from .guards import outcome_within
from .test_rl_pipeline import PIPELINED
from .test_rl_trainer import make_trainer

NEVER = lambda: False  # noqa: E731


def test_a_waiting_writer_goes_before_the_next_step():
    """An engine loop takes the gate again right after each step, yet a writer that waits is
    let in first: no step starts while a writer waits; and the writer may run steps itself
    while it holds the gate (an update's drain)."""
    gate, order, started_while_writer_waited = StepGate(), [], []
    written = threading.Event()

    def engine_loop():
        for _ in range(1_000_000):  # a hang guard
            with gate:  # a step: some work under the gate
                started_while_writer_waited.append(gate._writers > 0)
                sum(range(5_000))
            if written.is_set():
                return

    def write():
        with gate.writing():
            order.append("write")
            with gate:
                order.append("drain step")
        written.set()

    loop = threading.Thread(target=engine_loop)
    loop.start()
    while len(started_while_writer_waited) < 100:  # the loop is stepping
        loop.join(0.001)
    writer = threading.Thread(target=write)
    writer.start()
    for thread in (writer, loop):
        thread.join()
    assert order == ["write", "drain step"]
    assert not any(started_while_writer_waited)


@pytest.fixture
def producer(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, steps=2, pipeline="one_step", **PIPELINED)
    channel = trainer.channel  # the job's one channel: the producer's child serves its gate
    made = ProcessProducer(
        trainer.config, trainer.model, trainer.engine, channel, trainer.max_seq_len, 1, 600.0
    )
    assert made.channel is channel and channel.child_alive == made.alive
    yield trainer, made
    with contextlib.suppress(ProcessLookupError):
        os.kill(made._process.pid, signal.SIGCONT)
    made.close()


def test_the_child_serves_weights_that_changed_from_its_next_step(producer):
    trainer, child = producer
    child.start(trainer.plan.at(0), 5)
    (before, fresh, _), acks = child.take(NEVER)
    assert fresh and before.policy_version == 0 and acks == []
    with child.channel.writing(1), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for parameter in trainer.model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=gen))
    assert trainer.engine.version == 1  # the trainer's own engine too
    child.start(trainer.plan.at(1), 6)
    (after, _, _), acks = child.take(NEVER)
    child.channel.check_acks(acks)
    assert [version for version, _ in acks] == [1] and after.policy_version == 1
    prompts = [after.prompt_ids[after.group_of(i)] for i in range(after.num_samples)]
    with torch.no_grad():
        scores = packed_response_logprobs(
            trainer.model, prompts, after.response_ids, after.temperature
        )
    for stored, replayed in zip(after.temp_logprobs, scores, strict=True):
        assert torch.allclose(torch.tensor(stored), replayed, atol=1e-4)


def _stop_while_holding_the_gate(trainer, child):
    """SIGSTOP the child at a moment it holds the gate (during an engine step)."""
    pid, lock = child._process.pid, child.channel.gate.lock
    child.start(trainer.plan.at(0), 5)
    for _ in range(100_000):  # a hang guard: a batch has many steps
        os.kill(pid, signal.SIGSTOP)
        if not lock.acquire(block=False):
            return
        lock.release()
        os.kill(pid, signal.SIGCONT)
        if child._conn.poll():  # the batch ended between two tries: another one
            child.take(NEVER)
            child.start(trainer.plan.at(0), 5)
    raise AssertionError("never caught the child inside a step")


def test_a_cancel_reaches_a_trainer_waiting_for_the_gate(producer):
    trainer, child = producer
    _stop_while_holding_the_gate(trainer, child)
    child.channel.cancelled = lambda: True
    with pytest.raises(GateWaitCancelled), child.channel.writing(1):
        pass
    assert trainer.engine.version == 0  # nothing was written


def test_a_child_that_dies_holding_the_gate_fails_the_write(producer):
    trainer, child = producer
    _stop_while_holding_the_gate(trainer, child)
    os.kill(child._process.pid, signal.SIGKILL)

    def write():
        with child.channel.writing(1):
            pass

    died = outcome_within(write)  # a write that waits for a dead child fails, never hangs
    assert isinstance(died, PeerDiedError) and "rollout process died while holding" in str(died)
    died = outcome_within(lambda: child.take(NEVER))
    assert isinstance(died, RolloutProcessError) and "died" in str(died)


def test_a_child_alive_without_progress_fails_the_wait(producer):
    """A rollout process stopped (SIGSTOP) with a batch asked of it is alive but silent: the
    wait fails after the producer's timeout, naming it, and closing kills the child."""
    trainer, child = producer
    child.timeout_s = 1.0
    os.kill(child._process.pid, signal.SIGSTOP)
    child.start(trainer.plan.at(0), 5)
    hung = outcome_within(lambda: child.take(NEVER))
    assert isinstance(hung, ProducerHungError), hung
    assert "rollout process made no progress" in str(hung)
    assert outcome_within(child.close) is None and not child.alive()


def test_a_pipe_reset_by_a_killed_child_names_the_rollout_process(producer):
    """A SIGKILLed child's pipe may read as reset rather than closed (`ConnectionResetError`,
    as a connection's end can): the trainer fails naming the rollout process either way."""
    trainer, child = producer

    class ResetPipe:
        def __init__(self, conn):
            self.conn = conn

        def poll(self, timeout=None):
            return True

        def recv(self):
            raise ConnectionResetError(104, "Connection reset by peer")

        def send(self, value):
            self.conn.send(value)

        def close(self):
            self.conn.close()

    child.start(trainer.plan.at(0), 0)
    child._conn = ResetPipe(child._conn)
    with pytest.raises(RolloutProcessError, match="rollout process died"):
        child.take(NEVER)
