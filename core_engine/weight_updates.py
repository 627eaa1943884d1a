"""How the engine takes a weight update: the acknowledgement, the barrier at a step boundary
(drain or abort), the version check and the weight copy (the channels that carry updates are
`weight_sync`)."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from core_engine.batching import BatchingPolicy
from core_engine.task import ErrorCode
from core_engine.weights import WeightUpdateError, served_weights, validate_update


@dataclass(frozen=True)
class WeightUpdateAck:
    """What the engine serves after an update: the trainer checks version and checksum."""

    version: int
    prefix_entries_invalidated: int
    requests_aborted: int
    checksum: str
    seconds: float  # the whole update: validation, barrier, copy, invalidation, checksum
    control_seconds: float  # the barrier, invalidation and version switch alone


UPDATE_MODES = ("drain", "abort", "in_flight")


def check_mode(mode: str) -> None:
    if mode not in UPDATE_MODES:
        raise WeightUpdateError(f"mode must be one of {', '.join(UPDATE_MODES)}, got {mode!r}")


def barrier(batching: BatchingPolicy, mode: str, abort: Callable, step: Callable) -> int:
    """Leave no started request behind before an update: the engine's `abort` for each, or
    its `step` (admitting nothing fresh) until they are done; in flight they go on under the
    new weights. Returns how many were aborted. Called under the engine's lock."""
    if mode == "in_flight":
        return 0
    if mode == "abort":
        started = batching.started()
        for task in started:
            abort(task, ErrorCode.POLICY_UPDATED, "the policy was updated mid-request")
        return len(started)
    while batching.started():
        step(admit_fresh=False)
    return 0


def copy_weights(served: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> float:
    """Copy `weights` into the served tensors in place (captured graphs stay valid); returns
    the seconds it took."""
    start = time.perf_counter()
    with torch.no_grad():
        for name, tensor in served.items():
            if weights[name].data_ptr() != tensor.data_ptr():  # the served tensor itself: no copy
                tensor.copy_(weights[name])
    return time.perf_counter() - start


def next_version(version: object, current: int) -> int:
    """`version` as an int (numpy integers accepted) when it is greater than `current`."""
    if isinstance(version, bool):
        raise WeightUpdateError(f"policy version must be an integer, got {version!r}")
    try:
        value = operator.index(version)
    except TypeError:
        raise WeightUpdateError(
            f"policy version must be an integer, got {type(version).__name__} {version!r}"
        ) from None
    if value <= current:
        raise WeightUpdateError(f"policy version {value} is not greater than the served {current}")
    return value


def served_update(
    model: torch.nn.Module, weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The served tensors (`served_weights`: a LoRA engine's are its adapter's), checked
    against `weights`. A tied model's alias names (e.g. `lm_head.weight` of a
    `model.state_dict()`) are accepted when they equal their tensor."""
    served = served_weights(model)
    aliases = {
        name: tensor
        for name, tensor in model.state_dict(keep_vars=True).items()
        if name not in served and name in weights
    }
    for name, own in aliases.items():
        owner = next(n for n, t in served.items() if t is own)
        given = weights[name]
        if not isinstance(given, torch.Tensor) or not torch.equal(given, weights.get(owner, given)):
            raise WeightUpdateError(f"{name} is tied to {owner} but the update differs from it")
    validate_update(served, {k: v for k, v in weights.items() if k not in aliases})
    return served
