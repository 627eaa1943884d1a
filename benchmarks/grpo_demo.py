"""GRPO learning demo: held-out accuracy of the warmed-up addition policy before and during GRPO.

Starts from the shipped demo policy (`core_engine/assets/demo-policy`), or, with any warm-up option,
builds (or reuses) one under `$RLWB_DATA_DIR/demo-policy-warmup` (`db.data_dir`), then runs
our `GRPOTrainer` on 3-digit addition (recipe of the RL notes' appendix: lr 3e-4, 16 prompts x
G=8, temperature 1.0, clip 0.2, no KL) and scores 1,000 held-out problems greedily at the start
and every `--eval-every` versions. Minutes are wall time since GRPO started, evaluations
included. Accuracy swings between evaluations, so a moving average is shown too.

`--lora-rank R` trains a LoRA adapter (all-linear, alpha `--lora-alpha`, default 2R) instead of
every weight; without `--lr` a LoRA run uses the LoRA default (3e-3, 10x full fine-tuning's).
`--variants` runs several configurations in one process, interleaved step by step (one step of
each in turn, each timed on its own clock: its steps and its evaluations), so that every one sees
the same machine load, and prints their held-out accuracy at equal minutes and equal versions.
A variant is `full`, `rR` (rank R, alpha 2R) or `rRaA` (alpha A), optionally `@LR`.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/grpo_demo.py --minutes 10 --out curve.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/grpo_demo.py --minutes 2 \
        --variants full@3e-4 r16@3e-3 r64@3e-3 --out compare.json
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import db
from benchmarks.results import BenchmarkRun, Table
from core_engine.policies.demo import (
    DEMO_SEEDS,
    SHIPPED_POLICY,
    TARGET_ACCURACY,
    build_demo_policy,
    greedy_accuracy,
    heldout_records,
)
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import addition_records
from core_engine.rl.presets import ALGORITHM_PRESETS
from core_engine.rl.trainer.grpo import GRPOTrainer

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
    """Held-out accuracy per evaluated version, with a moving average. Its clock counts only the
    time spent inside `timed()` (a run's steps and evaluations): runs interleaved in one process
    each get their own time."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.stepping = 0.0  # the part of `spent` in steps, evaluations left out
        self.points: list[Point] = []

    @contextlib.contextmanager
    def timed(self, step: bool = False):
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.spent += elapsed
            if step:
                self.stepping += elapsed

    def add(self, version: int, accuracy: float) -> Point:
        recent = [p.accuracy for p in self.points[-(SMOOTHING - 1) :]] + [accuracy]
        minutes = self.spent / 60
        self.points.append(Point(version, minutes, accuracy, sum(recent) / len(recent)))
        return self.points[-1]

    def elapsed_s(self) -> float:
        return self.spent


@dataclass(frozen=True)
class Variant:
    """A GRPO configuration: full fine-tuning (rank 0) or LoRA of `lora_rank`; lr None is the
    trainer's default for the mode (3e-4 full, 3e-3 LoRA)."""

    lora_rank: int = 0
    lora_alpha: float | None = None  # default 2 x rank
    lr: float | None = None

    @property
    def name(self) -> str:
        kind = "full" if not self.lora_rank else f"LoRA r={self.lora_rank} a={self.alpha:g}"
        return f"{kind} lr={self.lr:g}" if self.lr is not None else kind

    @property
    def alpha(self) -> float:
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank

    def lora(self) -> dict | None:
        if not self.lora_rank:
            return None
        return {"rank": self.lora_rank, "alpha": self.alpha, "target_modules": "all-linear"}


def parse_variant(text: str) -> Variant:
    """`full`, `r16`, `r64a64`, each optionally `@LR` (e.g. `r16@3e-3`)."""
    spec, _, lr = text.partition("@")
    match = re.fullmatch(r"full|r(\d+)(?:a([\d.]+))?", spec)
    if not match:
        raise argparse.ArgumentTypeError(f"variant {text!r}: full, rR or rRaA, then @LR if any")
    rank = int(match.group(1) or 0)
    alpha = float(match.group(2)) if match.group(2) else None
    return Variant(rank, alpha, float(lr) if lr else None)


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
        help=f"the warm-up stops at this held-out accuracy (default {TARGET_ACCURACY})",
    )
    parser.add_argument(
        "--lr", type=float, help="default: 3e-4, or 3e-3 with --lora-rank (the trainer's)"
    )
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank (all-linear)"
    )
    parser.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 2 x rank)")
    parser.add_argument(
        "--variants",
        nargs="+",
        type=parse_variant,
        help="interleave these runs (full, rR, rRaA, each optionally @LR), e.g. full@3e-4 r16",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="write the curve as .json or .csv")
    return parser.parse_args(argv)


def make_trainer(
    policy: Path,
    run_dir: Path,
    args: argparse.Namespace,
    variant: Variant,
    preset: str | None = None,
) -> GRPOTrainer:
    """The recipe's GRPO run on training problems that never appear in the held-out set; with
    an algorithm `preset` (`core_engine.rl.presets`), its settings replace the recipe's."""
    recipe = dict(
        model=str(policy),
        output_dir=str(run_dir),
        task="addition",
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        lr=variant.lr,
        lora=variant.lora(),
        temperature=args.temperature,
        clip_eps=0.2,
        kl_coef=0.0,
        max_tokens=6,
        seed=args.seed,
        resume=False,
    )
    if preset is not None:
        settings = ALGORITHM_PRESETS[preset].settings
        recipe = {k: v for k, v in recipe.items() if k not in settings} | {"preset": preset}
    config = GRPOConfig.from_dict(recipe)
    held_out = {r["input"] for r in heldout_records()}
    records = [r for r in addition_records(5000, seed=1) if r["input"] not in held_out]
    return GRPOTrainer(config, records)


def run(trainer: GRPOTrainer, minutes: float, eval_every: int) -> list[Point]:
    """Train until the step or time budget is spent; evaluate at start and every `eval_every`."""
    return run_interleaved({"": trainer}, minutes, eval_every)[""].points


def run_interleaved(
    trainers: dict[str, GRPOTrainer], minutes: float, eval_every: int
) -> dict[str, Curve]:
    """One step of each run in turn until each has spent `minutes` of its own time (or its
    steps); each is evaluated at its start, every `eval_every` versions and at its end."""
    heldout = heldout_records()
    curves = {name: Curve() for name in trainers}

    def evaluate_now(name: str) -> None:
        trainer, curve = trainers[name], curves[name]
        with curve.timed():
            accuracy = greedy_accuracy(trainer.engine, heldout)
        point = curve.add(trainer.version, accuracy)
        print(point.row() + (f"  {name}" if name else ""), flush=True)

    print(HEADER)
    for name in trainers:
        evaluate_now(name)
    active = list(trainers)
    while active:
        for name in list(active):
            trainer, curve = trainers[name], curves[name]
            done = trainer.step_index >= trainer.config.steps or trainer.stop_reason() is not None
            if done or curve.elapsed_s() >= minutes * 60:
                active.remove(name)
                if curve.points[-1].version != trainer.version:
                    evaluate_now(name)
                continue
            with curve.timed(step=True):
                accepted = trainer.step().status == "accepted"
            if accepted and trainer.version % eval_every == 0:
                evaluate_now(name)
    return curves


def accuracy_at(curve: list[Point], minutes: float | None = None, version: int | None = None):
    """The last evaluation at or before `minutes` of the run's time, or at `version`."""
    if version is not None:
        return next((p for p in curve if p.version == version), None)
    before = [p for p in curve if p.minutes <= minutes + 1e-9]
    return before[-1] if before else None


def comparison(curves: dict[str, list[Point]], minutes: float, eval_every: int) -> list[Table]:
    """Held-out accuracy (raw / moving average) at equal minutes (the last mark is each run's
    final evaluation, just past its budget) and at equal versions."""
    marks = [minutes * k / 4 for k in range(1, 5)]
    last = max(c[-1].version for c in curves.values())
    step = max(eval_every, -(-last // 6 // eval_every) * eval_every)
    versions = list(range(0, last + 1, step))

    def cell(point: Point | None) -> str:
        if point is None:
            return "-"
        return f"{100 * point.accuracy:.1f}/{100 * point.moving_average:.1f}"

    def at_minutes(curve: list[Point], mark: float) -> Point | None:
        return curve[-1] if mark >= minutes else accuracy_at(curve, minutes=mark)

    at_marks = Table(
        "Held-out accuracy %, raw / moving average, at equal minutes",
        ["run", "versions", *(f"{m:g} min" for m in marks)],
        [
            [name, str(curve[-1].version), *(cell(at_minutes(curve, m)) for m in marks)]
            for name, curve in curves.items()
        ],
    )
    at_versions = Table(
        "Held-out accuracy %, raw / moving average, at equal versions",
        ["run", *(f"v{v}" for v in versions)],
        [
            [name, *(cell(accuracy_at(curve, version=v)) for v in versions)]
            for name, curve in curves.items()
        ],
    )
    return [at_marks, at_versions]


CURVE_ROWS = 12  # the evaluations a curve's table shows, evenly spaced


def curve_table(curve: list[Point]) -> Table:
    """Held-out accuracy over versions, at most `CURVE_ROWS` evaluations (the last included)."""
    step = max(1, -(-len(curve) // CURVE_ROWS))
    shown = curve[::step] if curve[::step][-1] is curve[-1] else [*curve[::step], curve[-1]]
    rows = [
        [
            str(p.version),
            f"{p.minutes:.2f}",
            f"{100 * p.accuracy:.1f}",
            f"{100 * p.moving_average:.1f}",
        ]
        for p in shown
    ]
    columns = ["version", "minutes", "held-out accuracy %", "moving average %"]
    return Table("Held-out accuracy (greedy) over versions", columns, rows)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


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


def write_curve(path: Path, curve: list[Point], totals: dict, run: BenchmarkRun) -> None:
    """The curve as CSV (one row per evaluation) or a result file (`benchmarks.results`)."""
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(asdict(curve[0])))
            writer.writeheader()
            writer.writerows(asdict(p) for p in curve)
    else:
        results = {"summary": totals, "curve": [asdict(p) for p in curve]}
        run.write(path, results, [curve_table(curve)])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_record = BenchmarkRun("grpo_demo")
    torch.set_num_threads(1)
    data_dir = db.data_dir()
    policy = SHIPPED_POLICY
    if (args.warmup_seed, args.target_accuracy, args.warmup_minutes) != (None, None, None):
        policy = build_demo_policy(
            data_dir / "demo-policy-warmup",
            seeds=DEMO_SEEDS if args.warmup_seed is None else (args.warmup_seed,),
            target_accuracy=args.target_accuracy or TARGET_ACCURACY,
            max_minutes=args.warmup_minutes,
            log=print,
        )
    print(f"policy {policy}: {json.loads((policy / 'demo_policy.json').read_text())}")
    if args.variants:
        compare(policy, data_dir, args, run_record)
        return
    variant = Variant(args.lora_rank, args.lora_alpha, args.lr)
    trainer = make_trainer(policy, data_dir / "grpo-demo-run", args, variant)
    print(f"{variant.name}: load average {load_average()}")
    curve = run(trainer, args.minutes, args.eval_every)
    trainer.save()
    totals = summary(curve)
    print(json.dumps(totals, indent=1))
    print(f"load average at the end: {load_average()}")
    when = totals["minutes_to_target_gain"]
    verdict = f"reached after {when:.2f} min" if when is not None else "missed"
    print(f"target +{100 * TARGET_GAIN:.0f} points (moving average) {verdict}")
    if args.out:
        write_curve(args.out, curve, totals, run_record)


def compare(
    policy: Path, data_dir: Path, args: argparse.Namespace, run_record: BenchmarkRun
) -> None:
    """The variants interleaved step by step, each for `--minutes` of its own time."""
    trainers = {
        v.name: make_trainer(policy, data_dir / f"grpo-demo-run-{i}", args, v)
        for i, v in enumerate(args.variants)
    }
    for name, trainer in trainers.items():
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        print(f"{name}: {trainable:,} trainable parameters, lr {trainer.config.lr:g}")
    loads = [load_average()]
    print(f"load average at the start: {loads[0]}")
    curves = {
        n: c.points for n, c in run_interleaved(trainers, args.minutes, args.eval_every).items()
    }
    loads.append(load_average())
    print(f"load average at the end: {loads[1]}")
    tables = comparison(curves, args.minutes, args.eval_every)
    for table in tables:
        print(f"{table.title}\n{table.markdown()}")
    totals = {name: summary(curve) for name, curve in curves.items()}
    print(json.dumps(totals, indent=1))
    if args.out:
        result = {
            "load_average": loads,
            "minutes": args.minutes,
            "runs": {
                name: {"summary": totals[name], "curve": [asdict(p) for p in curve]}
                for name, curve in curves.items()
            },
        }
        run_record.write(args.out, result, tables)


if __name__ == "__main__":
    main()
