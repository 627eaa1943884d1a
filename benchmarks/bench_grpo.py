"""GRPO trainer benchmark: where our synchronous step's time goes.

Our trainer on the demo recipe (`benchmarks/trl_grpo.py`: the warmed-up demo policy, 3-digit
addition, 16 prompts x G=8, temperature 1.0, lr 3e-4, clip 0.2, no KL, at most 6 completion
tokens, fp32 on one CPU thread), one optimizer step per rollout batch, weights synced into its
engine after every step. Per step: generate (the rollout without the reward), reward, train
(log-probs, loss, backward, optimizer step) and sync; the first `--warmup` steps are not timed.
A batch the trainer filters (no group with mixed rewards) costs its time and counts no step.
The comparison with TRL is `bench_vs_trl.py`.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_grpo.py --json bench_grpo.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.results import BenchmarkRun, Table
from benchmarks.trl_grpo import CLIP, GROUP, LR, MAX_TOKENS, PROMPTS, TEMPERATURE
from core_engine.assets import SHIPPED_POLICY
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import addition_records
from core_engine.rl.trainer.grpo import GRPOTrainer

PARTS = ("generate_s", "reward_s", "train_s", "sync_s", "step_s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args(argv)


def summarise(steps: list[dict[str, float]]) -> dict[str, Any]:
    """Median seconds per part, and optimizer steps per minute of summed step time."""
    optimizer_steps = sum(s["optimizer_step"] for s in steps)
    seconds = sum(s["step_s"] for s in steps)
    return {
        "batches": len(steps),
        "optimizer_steps": optimizer_steps,
        "seconds": seconds,
        "steps_per_min": 60 * optimizer_steps / seconds,
        "median_s": {part: statistics.median(s[part] for s in steps) for part in PARTS},
        "mean_s": {part: statistics.fmean(s[part] for s in steps) for part in PARTS},
    }


# ----------------------------------------------------------------------------- ours
class OurSteps:
    """Our GRPOTrainer one timed step at a time, with its own per-phase timings."""

    def __init__(self, policy: Path, records: list[dict], seed: int, run_dir: Path) -> None:
        config = GRPOConfig(
            model=str(policy),
            output_dir=str(run_dir / "ours"),
            task="addition",
            steps=1_000_000,
            batch_size=PROMPTS,
            group_size=GROUP,
            lr=LR,
            temperature=TEMPERATURE,
            clip_eps=CLIP,
            kl_coef=0.0,
            max_tokens=MAX_TOKENS,
            seed=seed,
            resume=False,
        )
        self.trainer = GRPOTrainer(config, records)
        self.steps: list[dict[str, float]] = []

    def step(self) -> None:
        start = time.perf_counter()
        record = self.trainer.step()
        step_s = time.perf_counter() - start
        m = record.metrics
        self.steps.append(
            {
                "generate_s": m.get("generate_s", 0.0),
                "reward_s": m.get("reward_s", 0.0),
                "train_s": m.get("train_s", 0.0),
                "sync_s": m.get("sync_s", 0.0),
                "step_s": step_s,
                "optimizer_step": float(record.status == "accepted"),
            }
        )


# ----------------------------------------------------------------------------- report
def step_table(results: dict[str, dict]) -> Table:
    """Median milliseconds of each part of a step, and optimizer steps per minute."""
    names = [p.removesuffix("_s") for p in PARTS]
    rows = [
        [name, *(f"{1000 * r['median_s'][p]:.2f}" for p in PARTS), f"{r['steps_per_min']:.1f}"]
        for name, r in results.items()
    ]
    return Table("GRPO step, median ms", ["trainer", *names, "optimizer steps/min"], rows)


def measure(policy: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Our timed steps, summarised."""
    records = addition_records(5000, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        ours = OurSteps(policy, records, args.seed, Path(tmp))
        for _ in range(args.warmup + args.steps):
            ours.step()
    return {"ours": summarise(ours.steps[args.warmup :])}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = BenchmarkRun("bench_grpo")
    torch.set_num_threads(1)
    policy = SHIPPED_POLICY
    print(f"threads {torch.get_num_threads()}, policy {policy}")
    results = measure(policy, args)
    table = step_table(results)
    print(table.markdown())
    if args.json:
        run.write(args.json, results, [table])


if __name__ == "__main__":
    main()
