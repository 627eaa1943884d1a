"""The supervised warm-up the shipped policies are built with (`demo`, `calculator`, `r1`):
Hugging Face's seeded initialisation, teacher-forced AdamW steps with the loss on masked-in
tokens only, the engine that scores held-out problems between steps,
and the checkpoint written with a record of how it was built."""

from __future__ import annotations

import argparse
import copy
import json
import platform
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers

from core_engine.atomic_dir import atomic_dir
from core_engine.engine import load_engine
from core_engine.model import CausalLM, build_model, load_state
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.weights import model_checksum, save_weights

IGNORED = -100  # a target the loss skips (`F.cross_entropy(ignore_index=...)`)


@dataclass(frozen=True)
class WarmupResult:
    seed: int
    steps: int
    loss: float
    accuracy: float
    seconds: float


def initial_model(config: transformers.PretrainedConfig, seed: int) -> CausalLM:
    """Our decoder with Hugging Face's seeded initialisation of `config`."""
    torch.manual_seed(seed)
    reference = transformers.AutoModelForCausalLM.from_config(config)
    model = build_model(config)
    load_state(model, reference.state_dict())
    return model.train()


def supervised_batch(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `(ids, mask)` examples as inputs and next-token targets: a position's
    target is the next id where that id's mask is 1, else `IGNORED`."""
    width = max(len(ids) for ids, _ in examples)
    inputs = torch.full((len(examples), width), pad_id)
    targets = torch.full((len(examples), width), IGNORED)
    for i, (ids, mask) in enumerate(examples):
        inputs[i, : len(ids)] = torch.tensor(ids)
        following = torch.tensor(ids[1:], dtype=torch.long)
        trained = torch.tensor(mask[1:], dtype=torch.long) == 1
        targets[i, : len(ids) - 1] = torch.where(trained, following, IGNORED)
    return inputs, targets


def supervised_step(model: CausalLM, optimizer: torch.optim.Optimizer, inputs, targets) -> float:
    """One teacher-forced step; returns the loss."""
    logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORED)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def eval_engine(model: CausalLM, tokenizer: Any, batch_size: int) -> InferenceScheduler:
    """An engine serving a copy of `model`, for greedy evaluation between warm-up steps."""
    config = EngineConfig(max_batch_size=batch_size)
    return load_engine(copy.deepcopy(model).eval(), config, tokenizer=tokenizer)


def save_policy(
    path: Path,
    model: CausalLM,
    config: transformers.PretrainedConfig,
    tokenizer: Any,
    info: tuple[str, dict],
) -> Path:
    """A Hugging Face checkpoint directory (its generation config's EOS the tokenizer's) with
    `info = (file name, record)` beside the weights, written atomically."""
    generation = transformers.GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    name, record = info
    with atomic_dir(path) as tmp:
        save_weights(model, tmp)
        config.save_pretrained(tmp)
        generation.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / name).write_text(json.dumps(record, indent=1))
    return path


def build_record(
    result: WarmupResult,
    target_accuracy: float,
    settings: Any,
    builder: str,
    model: CausalLM,
    **details: Any,
) -> dict[str, Any]:
    """What a policy's record file says of its build: the warm-up's result and target, the
    builder's `details`, its settings, where it ran (`build_environment`) and the weights'
    checksum."""
    return {
        **asdict(result),
        "target_accuracy": target_accuracy,
        "reached_target": result.accuracy >= target_accuracy,
        **details,
        "settings": asdict(settings),
        "built_with": build_environment(builder),
        "weights_checksum": model_checksum(model),
    }


def build_environment(builder: str) -> dict[str, str]:
    """What a build's numerics depend on: the builder, torch and the CPU."""
    return {
        "builder": builder,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rebuild_main(
    description: str,
    default_out: Path,
    build: Callable[..., Path],
    info_file: str,
    argv: Sequence[str] | None,
) -> None:
    """The command line of a policy builder: rebuild it at `--out` (default: the shipped
    checkpoint, replaced) with one thread (the numerics its recorded figures were measured
    with) and print its record."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_out, help="checkpoint directory")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if (args.out / "config.json").is_file():
        shutil.rmtree(args.out)
    build(args.out, log=print)
    print(json.dumps(json.loads((args.out / info_file).read_text()), indent=1))
