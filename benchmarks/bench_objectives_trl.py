"""Our objective against TRL's own loss code on the same tensors: for each TRL loss type we
share (and GSPO's sequence-level ratio, clip-higher, `delta`, the 80/20 mask, the entropy
bonus, the KL term), `GRPOTrainer._compute_loss` of the installed TRL (the `bench` extra) runs
on fixed log-probs, and the difference in the loss and in its gradient is printed.

TRL's method runs unchanged on a stand-in for the trainer that holds the attributes it reads:
one process, one accumulation step, no vLLM, the log-probs and entropies handed in where
TRL's forward would compute them. Not a speed measurement. Left differences are rounding: the
KL term's order of operations (TRL adds it per token before aggregating, we aggregate it
apart), and in float64 SAPO's temperatures, which TRL's `torch.where` of Python floats makes
float32.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_objectives_trl.py \\
        --json docs/benchmarks/bench_objectives_trl.json
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.results import BenchmarkRun, Table
from core_engine.rl.objective.loss import entropy_threshold, policy_loss
from core_engine.rl.objective.settings import Objective

# (label, TRL's options, our Objective's fields): TRL's cispo and sapo are loss types, ours
# policy losses aggregated as TRL aggregates them (cispo: dapo, sapo: grpo)
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("dapo (today's)", {"loss_type": "dapo"}, {}),
    ("dapo clip-higher", {"loss_type": "dapo", "epsilon_high": 0.28}, {"clip_eps_high": 0.28}),
    ("grpo + kl", {"loss_type": "grpo", "beta": 0.04}, {"loss_type": "grpo"}),
    ("bnpo + delta", {"loss_type": "bnpo", "delta": 1.5}, {"loss_type": "bnpo", "delta": 1.5}),
    ("dr_grpo", {"loss_type": "dr_grpo"}, {"loss_type": "dr_grpo"}),
    (
        "gspo (sequence, grpo)",
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    ),
    (
        "cispo",
        {"loss_type": "cispo", "epsilon_high": 1.3},
        {"policy_loss": "cispo", "clip_eps_high": 1.3},
    ),
    ("sapo", {"loss_type": "sapo"}, {"loss_type": "grpo", "policy_loss": "sapo"}),
    (
        "80/20 + entropy bonus",
        {"loss_type": "grpo", "top_entropy_quantile": 0.2, "entropy_coef": 0.01},
        {"loss_type": "grpo", "top_entropy_quantile": 0.2, "entropy_coef": 0.01},
    ),
]


class _Accelerator:
    """One process: gathers and reductions are the identity."""

    num_processes = 1
    sync_gradients = True

    def pad_across_processes(self, tensor, dim=0, pad_index=0):
        return tensor

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather

    def reduce(self, tensor, reduction="sum"):
        return tensor


def trl_loss(trainer_cls, options, tensors) -> torch.Tensor:
    """TRL's `_compute_loss`, unchanged, on a stand-in trainer with `options`."""
    logp, old, ref, advantages, mask, entropy, max_len = tensors
    trainer = object.__new__(trainer_cls)
    epsilon = 0.2
    fields = {
        "loss_type": options["loss_type"],
        "importance_sampling_level": options.get("importance_sampling_level", "token"),
        "epsilon_low": epsilon,
        "epsilon_high": options.get("epsilon_high", epsilon),
        "beta": options.get("beta", 0.0),
        "top_entropy_quantile": options.get("top_entropy_quantile", 1.0),
        "entropy_coef": options.get("entropy_coef", 0.0),
        "_entropy_bonus_enabled": bool(options.get("entropy_coef", 0.0)),
        "use_adaptive_entropy": False,
        "off_policy_mask_threshold": None,
        "use_vllm": False,
        "aux_loss_enabled": False,
        "max_completion_length": max_len,
        "current_gradient_accumulation_steps": 1,
        "accelerator": _Accelerator(),
        "model": SimpleNamespace(training=True),
        "_metrics": defaultdict(lambda: defaultdict(list)),
        "args": SimpleNamespace(
            delta=options.get("delta"),
            sapo_temperature_pos=1.0,
            sapo_temperature_neg=1.05,
            use_bias_correction_kl=False,
            steps_per_generation=1,
        ),
    }
    for name, value in fields.items():
        object.__setattr__(trainer, name, value)
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, entropy, None)
    n, t = mask.shape
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, t, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    return trainer_cls._compute_loss(trainer, None, inputs)


def our_loss(fields, options, tensors) -> torch.Tensor:
    logp, old, ref, advantages, mask, entropy, max_len = tensors
    objective = Objective(**fields, completion_length=max_len)
    threshold = None
    if objective.top_entropy:
        threshold = entropy_threshold(entropy.detach()[mask], objective.top_entropy_quantile)
    beta = options.get("beta", 0.0)
    out = policy_loss(
        logp, old, old, advantages, mask, None, clip_eps=0.2, kl_coef=beta, ref_logp=ref,
        objective=objective, entropy=entropy, threshold=threshold,
    )  # fmt: skip
    return out.loss


def fixed_tensors(seed: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(seed)
    n, t = 16, 24
    old = -torch.rand(n, t, generator=gen, dtype=dtype) * 4
    logp = (old + 0.4 * torch.randn(n, t, generator=gen, dtype=dtype)).requires_grad_(True)
    ref = old - 0.2 * torch.rand(n, t, generator=gen, dtype=dtype)
    advantages = torch.randn(n, generator=gen, dtype=dtype)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    entropy = (torch.rand(n, t, generator=gen, dtype=dtype) * 5).requires_grad_(True)
    return logp, old, ref, advantages, mask, entropy, t + 8


def compare(trainer_cls, dtype: torch.dtype, seed: int) -> list[list[Any]]:
    """Per case: TRL's loss, |ours - TRL's| and the largest gradient gap (log-probs, entropies)."""
    rows = []
    for label, options, fields in CASES:
        tensors = fixed_tensors(seed, dtype)
        theirs = trl_loss(trainer_cls, options, tensors)
        ours = our_loss(fields, options, tensors)
        inputs = (tensors[0], tensors[5])
        their_grads = torch.autograd.grad(theirs, inputs, allow_unused=True)
        our_grads = torch.autograd.grad(ours, inputs, allow_unused=True)
        gap = max(
            float((a - b).abs().max()) if a is not None else float(b.abs().max())
            for a, b in zip(our_grads, their_grads, strict=True)
            if b is not None or a is not None
        )
        loss, diff = float(theirs.detach()), abs(float((ours - theirs).detach()))
        rows.append([label, f"{loss:.8f}", f"{diff:.3e}", f"{gap:.3e}"])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the result file here")
    args = parser.parse_args(argv)
    run = BenchmarkRun("bench_objectives_trl")
    try:
        import trl
        from trl.trainer.grpo_trainer import GRPOTrainer
    except ImportError:
        print("TRL is not installed (the `bench` extra): nothing to compare against")
        return
    columns = ["case", "loss (TRL)", "abs. loss difference", "max abs. gradient difference"]
    tables, results = [], {"trl": trl.__version__, "seed": args.seed}
    for dtype in (torch.float32, torch.float64):
        rows = compare(GRPOTrainer, dtype, args.seed)
        title = f"Ours vs TRL {trl.__version__}'s _compute_loss, {str(dtype).split('.')[1]}"
        tables.append(Table(title, columns, rows))
        results[str(dtype)] = rows
        print(f"{title}\n{tables[-1].markdown()}\n")
    if args.json:
        run.write(args.json, results, tables)


if __name__ == "__main__":
    main()
