"""The named interfaces (`rollout.interfaces`, `weight_sync.WeightChannel`): every
implementation declares the one it implements and satisfies it structurally (each member
defined, not left to the interface's stub, with the interface's parameters in its order and
kinds, any extra one optional); a job's weight channel is one object, the trainer's."""

import inspect

import pytest

from core_engine.rl.ranks.channel import RankChannel
from core_engine.rl.ranks.rollouts import RankProducer, RankSource
from core_engine.rl.rollout.control import Heartbeat
from core_engine.rl.rollout.interfaces import RolloutProducer, RolloutSource
from core_engine.rl.rollout.process import ProcessProducer
from core_engine.rl.rollout.sources import PrefetchSource, SyncSource, ThreadProducer
from core_engine.weight_sync import LocalChannel, ProcessChannel, WeightChannel

from .test_rl_pipeline import PIPELINED
from .test_rl_trainer import make_trainer

IMPLEMENTATIONS = [
    (RolloutSource, SyncSource),
    (RolloutSource, PrefetchSource),
    (RolloutSource, RankSource),
    (RolloutProducer, ThreadProducer),
    (RolloutProducer, ProcessProducer),
    (RolloutProducer, RankProducer),
    (WeightChannel, LocalChannel),
    (WeightChannel, ProcessChannel),
    (WeightChannel, RankChannel),
]


def members(protocol):
    """The interface's own members: its methods and properties, and its annotated data."""
    own = {
        name: value
        for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    data = {name: None for name in vars(protocol).get("__annotations__", {})}
    return {**own, **data}


def is_stub(member) -> bool:
    """A member the interface only names (its body `...`): an implementation must define it."""
    function = member.fget if isinstance(member, property) else member
    return inspect.getsource(function).rstrip().endswith("...")


def fits(required: inspect.Signature, given: inspect.Signature) -> list[str]:
    """Why `given` cannot be called as `required` is (nothing: it can)."""
    wanted, have = list(required.parameters.values()), list(given.parameters.values())
    problems = []
    for i, param in enumerate(wanted):
        if i >= len(have) or (have[i].name, have[i].kind) != (param.name, param.kind):
            problems.append(f"parameter {i} should be {param.name} ({param.kind.name})")
    problems += [
        f"extra parameter {p.name} has no default"
        for p in have[len(wanted) :]
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    return problems


@pytest.mark.parametrize(("protocol", "implementation"), IMPLEMENTATIONS)
def test_each_implementation_declares_and_satisfies_its_interface(protocol, implementation):
    assert protocol in implementation.__mro__, f"{implementation.__name__} does not declare it"
    problems = []
    for name, member in members(protocol).items():
        if member is None:  # data: set by a constructor of the implementation's classes
            mine = [c for c in implementation.__mro__ if c is not protocol]
            code = "".join(
                inspect.getsource(c) for c in mine if c.__module__ not in ("builtins", "typing")
            )
            if f"self.{name} =" not in code and f"self.{name}," not in code:
                problems.append(f"{name}: never set")
            continue
        given = inspect.getattr_static(implementation, name)
        if given is member and is_stub(member):
            problems.append(f"{name}: left to the interface's stub")
        elif isinstance(member, property):
            if not isinstance(given, property):
                problems.append(f"{name}: not a property")
        else:
            why = fits(inspect.signature(member), inspect.signature(given))
            problems += [f"{name}: {w}" for w in why]
    assert not problems, f"{implementation.__name__}: {problems}"


def test_the_structural_check_catches_a_wrong_implementation():
    """The check above, against implementations that break the interface each one way."""

    class NoTake(ThreadProducer):
        take = RolloutProducer.take  # the stub, not an implementation

    class WrongTake(ThreadProducer):
        def take(self, timeout, cancelled):  # parameters out of order
            return super().take(cancelled)

    class ExtraRequired(ThreadProducer):
        def start(self, batch, seed, priority):  # a parameter the interface never passes
            return super().start(batch, seed)

    for broken in (NoTake, WrongTake, ExtraRequired):
        with pytest.raises(AssertionError):
            test_each_implementation_declares_and_satisfies_its_interface(RolloutProducer, broken)


def test_instances_satisfy_the_interfaces_and_a_job_has_one_channel(checkpoint, tmp_path):
    """Built instances pass `isinstance` against the runtime-checkable interfaces; the trainer
    writes through the channel its parts built, and a pipelined source verifies against that
    same object (no channel of its own)."""
    sync = make_trainer(checkpoint, tmp_path / "sync")
    assert isinstance(sync.source, RolloutSource) and isinstance(sync.channel, WeightChannel)
    assert not hasattr(sync.source, "channel")
    assert isinstance(ThreadProducer(sync.runner, 1, Heartbeat(), 600.0), RolloutProducer)
    assert not isinstance(object(), RolloutProducer) and not isinstance(sync.runner, WeightChannel)
    lora = {"lora": {"rank": 4}}  # a thread producer (a full-weight CPU job spawns a child)
    piped = make_trainer(checkpoint, tmp_path / "piped", pipeline="one_step", **PIPELINED, **lora)
    assert isinstance(piped.source, PrefetchSource) and isinstance(piped.source, RolloutSource)
    assert piped.source.channel is piped.channel and type(piped.channel) is LocalChannel
