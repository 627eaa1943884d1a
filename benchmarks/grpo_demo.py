"""GRPO learning demo: held-out accuracy of the warmed-up addition policy before and during GRPO.

Builds (or reuses) the demo policy under `$RLWB_DATA_DIR/demo-policy` (default `data/`), then runs
our `GRPOTrainer` on 3-digit addition (recipe of the RL notes' appendix: lr 3e-4, 16 prompts x
G=8, temperature 1.0, clip 0.2, no KL) and scores 1,000 held-out problems greedily at the start
and every `--eval-every` versions. Minutes are wall time since GRPO started, evaluations
included. Accuracy swings between evaluations, so a moving average is shown too.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/grpo_demo.py --minutes 10 --out curve.json
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import db
from core_engine.rl.config import GRPOConfig
from core_engine.rl.demo_policy import (
    DEMO_SEEDS,
    TARGET_ACCURACY,
    build_demo_policy,
    greedy_accuracy,
    heldout_records,
)
from core_engine.rl.tasks import addition_records
from core_engine.rl.trainer import GRPOTrainer

TARGET_GAIN = 0.30  # the bar: +30 points of held-out accuracy within 10 minutes
SMOOTHING = 3  # evaluations in the moving average


@dataclass(frozen=True)
class Point:
    version: int
    minutes: float
    accuracy: float
    moving_average: float

    def row(self) -> str:
        values = (self.minutes, self.accuracy, self.moving_average)
        return f"{self.version:>7} " + " ".join(f"{v:>9.3f}" for v in values)


HEADER = f"{'version':>7} {'minutes':>9} {'accuracy':>9} {'moving':>9}"


class Curve:
    """Held-out accuracy per evaluated version, timed from construction, with a moving average."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.points: list[Point] = []

    def add(self, version: int, accuracy: float) -> Point:
        recent = [p.accuracy for p in self.points[-(SMOOTHING - 1) :]] + [accuracy]
        minutes = (time.perf_counter() - self.start) / 60
        self.points.append(Point(version, minutes, accuracy, sum(recent) / len(recent)))
        return self.points[-1]

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="GRPO wall-time budget")
    parser.add_argument("--steps", type=int, default=10_000, help="at most this many versions")
    parser.add_argument("--eval-every", type=int, default=25, help="versions between evals")
    parser.add_argument(
        "--warmup-minutes", type=float, default=None, help="optional warm-up time budget"
    )
    parser.add_argument("--seed", type=int, default=0, help="GRPO's seed")
    parser.add_argument(
        "--warmup-seed",
        type=int,
        help="warm up this seed alone (default: the demo policy's seeds, `DEMO_SEEDS`)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=float,
        default=TARGET_ACCURACY,
        help="the warm-up stops at this held-out accuracy",
    )
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="write the curve as .json or .csv")
    return parser.parse_args(argv)


def make_trainer(policy: Path, run_dir: Path, args: argparse.Namespace) -> GRPOTrainer:
    """The recipe's GRPO run on training problems that never appear in the held-out set."""
    config = GRPOConfig(
        model=str(policy),
        output_dir=str(run_dir),
        task="addition",
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        lr=args.lr,
        temperature=args.temperature,
        clip_eps=0.2,
        kl_coef=0.0,
        max_tokens=6,
        seed=args.seed,
        resume=False,
    )
    held_out = {r["input"] for r in heldout_records()}
    records = [r for r in addition_records(5000, seed=1) if r["input"] not in held_out]
    return GRPOTrainer(config, records)


def run(trainer: GRPOTrainer, minutes: float, eval_every: int) -> list[Point]:
    """Train until the step or time budget is spent; evaluate at start and every `eval_every`."""
    heldout, curve = heldout_records(), Curve()

    def evaluate_now() -> None:
        point = curve.add(trainer.version, greedy_accuracy(trainer.engine, heldout))
        print(point.row(), flush=True)

    print(HEADER)
    evaluate_now()
    while trainer.step_index < trainer.config.steps and not trainer.stalled:
        if curve.elapsed_s() >= minutes * 60:
            break
        if trainer.step().status == "accepted" and trainer.version % eval_every == 0:
            evaluate_now()
    if curve.points[-1].version != trainer.version:
        evaluate_now()
    return curve.points


def minutes_to_gain(curve: list[Point], gain: float) -> float | None:
    """Wall minutes until the moving average first stood `gain` above the start, if it did."""
    base = curve[0].accuracy
    return next((round(p.minutes, 2) for p in curve if p.moving_average - base >= gain), None)


def summary(curve: list[Point]) -> dict[str, float | None]:
    """Gains in accuracy points over the starting policy (raw best, final, moving average)."""
    base, best = curve[0].accuracy, max(p.accuracy for p in curve)
    return {
        "start_accuracy": base,
        "final_accuracy": curve[-1].accuracy,
        "best_accuracy": best,
        "gain_final_points": round(100 * (curve[-1].accuracy - base), 1),
        "gain_best_points": round(100 * (best - base), 1),
        "gain_moving_average_points": round(100 * (max(p.moving_average for p in curve) - base), 1),
        "minutes_to_target_gain": minutes_to_gain(curve, TARGET_GAIN),
        "minutes": round(curve[-1].minutes, 2),
        "versions": curve[-1].version,
    }


def write_curve(path: Path, curve: list[Point], totals: dict) -> None:
    """The curve as CSV (one row per evaluation) or JSON (with the summary)."""
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(asdict(curve[0])))
            writer.writeheader()
            writer.writerows(asdict(p) for p in curve)
    else:
        path.write_text(
            json.dumps({"summary": totals, "curve": [asdict(p) for p in curve]}, indent=1)
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    data_dir = db.data_dir()
    policy = build_demo_policy(
        data_dir / "demo-policy",
        seeds=DEMO_SEEDS if args.warmup_seed is None else (args.warmup_seed,),
        target_accuracy=args.target_accuracy,
        max_minutes=args.warmup_minutes,
        log=print,
    )
    print(f"policy {policy}: {json.loads((policy / 'demo_policy.json').read_text())}")
    trainer = make_trainer(policy, data_dir / "grpo-demo-run", args)
    curve = run(trainer, args.minutes, args.eval_every)
    trainer.save()
    totals = summary(curve)
    print(json.dumps(totals, indent=1))
    when = totals["minutes_to_target_gain"]
    verdict = f"reached after {when:.2f} min" if when is not None else "missed"
    print(f"target +{100 * TARGET_GAIN:.0f} points (moving average) {verdict}")
    if args.out:
        write_curve(args.out, curve, totals)


if __name__ == "__main__":
    main()
