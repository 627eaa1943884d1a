"""Named pure functions, verl's `core_algos.py` shape (`@register_policy_loss`,
`@register_adv_est`): a registry per part of the objective, each entry chosen by the job's
config. A name must be one of the config's choices (`objective.choices`, torch-free so the UI
lists them), so a registered function is always reachable and a listed name always runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Fn = TypeVar("Fn", bound=Callable)


class Registry(Generic[Fn]):
    """Functions of one kind by name: `@registry.register(name)`, `registry[name]`."""

    def __init__(self, kind: str, choices: Sequence[str]) -> None:
        self.kind, self.choices = kind, tuple(choices)
        self._functions: dict[str, Fn] = {}

    def register(self, name: str) -> Callable[[Fn], Fn]:
        if name not in self.choices:
            raise ValueError(f"{self.kind} {name!r} is not among the config's {self.choices}")
        if name in self._functions:
            raise ValueError(f"{self.kind} {name!r} is registered twice")

        def decorator(function: Fn) -> Fn:
            self._functions[name] = function
            return function

        return decorator

    def __getitem__(self, name: str) -> Fn:
        if name not in self._functions:
            raise ValueError(f"unknown {self.kind} {name!r}: one of {sorted(self._functions)}")
        return self._functions[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._functions)
