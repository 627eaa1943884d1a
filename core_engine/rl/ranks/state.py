"""A sharded trainer's checkpoint state, through `torch.distributed.checkpoint.state_dict`.

A job's checkpoints keep one format whatever its number of ranks (`trainer.checkpoint`: the
model as a Hugging Face directory, the optimizer state keyed by parameter index), so any
version can be served, exported, audited, and resumed on any number of ranks. With FSDP2 the
full state is gathered to rank 0 (on its CPU) to be written (`full_state`), and on resume each
rank keeps its shard of the full state it reads (`load_optimizer_shards`): a resume on another
number of ranks reshards. With LoRA nothing is sharded: every rank holds the same adapter and
optimizer state, and rank 0 writes them as a one-process run does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from core_engine.weights import canonical_weights

GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The FSDP2 `model`'s full weights and `optimizer`'s full state (keyed by parameter index,
    as `optimizer.state_dict()`), on rank 0's CPU; empty on the other ranks. A collective."""
    weights = get_model_state_dict(model, options=GATHERED)
    state = get_optimizer_state_dict(model, optimizer, options=GATHERED)
    if not weights:
        return {}, {}
    saved = canonical_weights(model)  # a tied weight once
    return {name: weights[name] for name in saved}, _by_index(state)


def load_optimizer_shards(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Each rank keeps its shard of the full optimizer `state` (keyed by parameter index, every
    rank holding all of it), whatever number of ranks wrote it."""
    name_of = {id(param): name for name, param in model.named_parameters()}
    names = [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
    keyed = _by_name(state, names)
    set_optimizer_state_dict(
        model, optimizer, keyed, options=StateDictOptions(full_state_dict=True)
    )


def _by_index(state: dict[str, Any]) -> dict[str, Any]:
    """`get_optimizer_state_dict`'s parameter names -> their index in the optimizer's groups."""
    index = {name: i for i, name in enumerate(_names(state["param_groups"]))}
    return {
        "state": {index[name]: values for name, values in state["state"].items()},
        "param_groups": _renumbered(state["param_groups"], iter(range(len(index)))),
    }


def _by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An index-keyed optimizer state -> keyed by `names` (the parameters' in index order)."""
    return {
        "state": {names[int(i)]: values for i, values in state["state"].items()},
        "param_groups": _renumbered(state["param_groups"], iter(names)),
    }


def _names(groups: list[dict[str, Any]]) -> list[str]:
    return [name for group in groups for name in group["params"]]


def _renumbered(groups: list[dict[str, Any]], keys: Any) -> list[dict[str, Any]]:
    return [{**group, "params": [next(keys) for _ in group["params"]]} for group in groups]
