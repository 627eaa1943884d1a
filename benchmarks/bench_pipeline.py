"""Asynchronous RL measured side by side: optimizer steps per minute and held-out accuracy of
the `one_step` and `in_flight` pipelines against the synchronous loop, on the demo task (the
comparison with TRL, which reuses these trainers, is `bench_vs_trl.py`).

Every trainer starts from the shipped demo policy with the recipe of `grpo_demo.py` (3-digit
addition, 16 prompts x G=8, lr 3e-4, temperature 1.0, clip 0.2, no KL, at most 6 tokens, fp32).
They run in one process, interleaved in turns: each in turn trains for `--slice` seconds of its
own clock (the machine's load is shared alike). A trainer's clock counts its `train()` time
only: the greedy held-out evaluation (1,000 problems) every `--eval-every` versions, taken
between two steps, and the start of a pipelined job's rollout process (once per job; printed)
are left out.

Threads: the synchronous loop on one intra-op thread (as the workers run) and on two (both
cores on one job); a pipeline on one for training plus one in its rollout process.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_pipeline.py --minutes 3 --json out.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_pipeline.py --minutes 1 --seeds 3
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_pipeline.py --wide --minutes 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.results import BenchmarkRun, Table
from benchmarks.trl_grpo import CLIP, GROUP, LR, MAX_TOKENS, PROMPTS, TEMPERATURE
from core_engine.policies.demo import (
    DEMO_ALPHABET,
    SHIPPED_POLICY,
    greedy_accuracy,
    heldout_records,
)
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import addition_records
from core_engine.rl.rollout import sources
from core_engine.rl.trainer.grpo import GRPOTrainer
from core_engine.rl.trainer.records import TrainerHooks
from core_engine.toy import save_tiny_checkpoint

# (name, pipeline mode, intra-op threads): the synchronous loop on one core and on both
VARIANTS = (("sync", "sync", 1), ("sync x2", "sync", 2), ("one_step", "one_step", 2))
VARIANTS += (("in_flight", "in_flight", 2),)
STARTUP_S: list[float] = []  # each pipelined `train()` call's rollout process start
TARGET_SPEEDUP = 1.6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="training time of each")
    parser.add_argument("--slice", type=float, default=20.0, help="seconds per turn")
    parser.add_argument("--eval-every", type=int, default=20, help="versions between evals")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="runs, seeds --seed, --seed + 1, ...; held-out accuracy is averaged over them",
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="throughput only, on a random 512-wide 6-layer model (compute-bound, ~20M "
        "parameters) instead of the demo policy; no accuracy",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args(argv)


class Timed:
    """One of our trainers, run a slice at a time; its clock counts training only."""

    def __init__(
        self,
        variant: tuple,
        records: list[dict],
        args: argparse.Namespace,
        root: Path,
        policy: Path,
        drop_zero_variance_groups: bool = True,
    ):
        """`drop_zero_variance_groups=False` trains every group (the objective TRL's "dapo"
        computes, `benchmarks/trl_grpo.py`)."""
        self.name, mode, self.threads = variant
        config = GRPOConfig(
            model=str(policy),
            output_dir=str(root / self.name.replace(" ", "_")),
            task="addition",
            steps=1_000_000,
            batch_size=PROMPTS,
            group_size=GROUP,
            lr=LR,
            temperature=TEMPERATURE,
            clip_eps=CLIP,
            kl_coef=0.0,
            max_tokens=MAX_TOKENS,
            seed=args.seed,
            resume=False,
            pipeline=mode,
            max_policy_lag=0 if mode == "sync" else 1,
            # a random model's groups mostly agree: train on them anyway (same compute)
            drop_zero_variance_groups=drop_zero_variance_groups and not args.wide,
        )
        self.eval_every = 10**9 if args.wide else args.eval_every
        self.seconds = 0.0  # training time
        self.points: list[dict[str, float]] = []  # version, minutes, accuracy
        self._deadline = 0.0
        self._excluded = 0.0
        self._in_slice = False
        self.trainer = GRPOTrainer(config, records, TrainerHooks(should_stop=self._between))

    def _between(self) -> bool:
        """Between two steps: evaluate when due (not timed); stop at the slice's end. Outside a
        slice (the trainer's set-up asks too, e.g. while it renders prompts) nothing stops."""
        if not self._in_slice:
            return False
        version = self.trainer.version
        if version % self.eval_every == 0 and (
            not self.points or self.points[-1]["version"] != version
        ):
            self.evaluate()
        return time.perf_counter() - self._excluded >= self._deadline

    def evaluate(self) -> None:
        start = time.perf_counter()
        accuracy = greedy_accuracy(self.trainer.engine, heldout_records())
        minutes = (self.seconds + start - self._slice_start - self._excluded) / 60
        self.points.append(
            {"version": self.trainer.version, "minutes": minutes, "accuracy": accuracy}
        )
        self._excluded += time.perf_counter() - start

    def run_slice(self, seconds: float) -> None:
        torch.set_num_threads(self.threads)  # pipelined: halved, 1 + 1
        self._excluded = 0.0
        started = len(STARTUP_S)
        self._slice_start = time.perf_counter()
        self._deadline = self._slice_start + seconds
        self._in_slice = True
        try:
            self.trainer.train()
        finally:
            self._in_slice = False
        self._excluded += sum(STARTUP_S[started:])  # paid once per job: not steady state
        self.seconds += time.perf_counter() - self._slice_start - self._excluded

    @property
    def steps_per_min(self) -> float:
        return 60 * self.trainer.version / max(self.seconds, 1e-9)


def rotate(ours: list[Timed], args: argparse.Namespace) -> None:
    """Turns of `--slice` seconds, one trainer after another, until each has `--minutes`."""
    budget = args.minutes * 60
    while any(t.seconds < budget for t in ours):
        for trainer in ours:
            if trainer.seconds < budget:
                trainer.run_slice(args.slice)


def accuracy_at(points: list[dict], minutes: float | None = None, version: int | None = None):
    if version is not None:
        return next((p["accuracy"] for p in points if p["version"] == version), None)
    before = [p for p in points if p["minutes"] <= minutes + 1e-9]
    return before[-1]["accuracy"] if before else None


def report(ours: list[Timed]) -> dict[str, Any]:
    sync = ours[0]
    results: dict[str, Any] = {"modes": {}}
    common_version = min(t.points[-1]["version"] if t.points else 0 for t in ours)
    common_version -= common_version % ours[0].eval_every
    minutes = min(t.seconds for t in ours) / 60
    print(
        f"{'trainer':<10}{'steps':>7}{'minutes':>9}{'steps/min':>11}{'x sync':>8}"
        f"{'acc@v' + str(common_version):>10}{f'acc@{minutes:.1f}min':>13}"
    )
    for t in ours:
        row = {
            "steps": t.trainer.version,
            "minutes": t.seconds / 60,
            "steps_per_min": t.steps_per_min,
            "speedup_over_sync": t.steps_per_min / sync.steps_per_min,
            "accuracy_at_equal_steps": accuracy_at(t.points, version=common_version),
            "accuracy_at_equal_time": accuracy_at(t.points, minutes=minutes),
            "points": t.points,
        }
        results["modes"][t.name] = row
        print(
            f"{t.name:<10}{row['steps']:>7}{row['minutes']:>9.2f}{row['steps_per_min']:>11.1f}"
            f"{row['speedup_over_sync']:>8.2f}{100 * (row['accuracy_at_equal_steps'] or 0):>10.1f}"
            f"{100 * (row['accuracy_at_equal_time'] or 0):>13.1f}"
        )
    print(
        "over sync: "
        + ", ".join(f"{t.name} {t.steps_per_min / sync.steps_per_min:.2f}x" for t in ours[1:])
        + f" (goal >= {TARGET_SPEEDUP}x)"
    )
    return results


def wide_policy(path: Path, **shape: int) -> Path:
    """A random checkpoint with the demo's tokenizer, wide enough that matrix products, not
    Python, take most of a step; `shape` overrides the default (512 wide, 6 layers)."""
    shape = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, **shape}
    heads = dict(num_attention_heads=8, num_key_value_heads=4, initializer_range=0.02)
    return save_tiny_checkpoint(path, "llama", DEMO_ALPHABET, **shape, **heads)


def _timed_start(start: Any) -> Any:
    def timed(*args: Any) -> Any:
        begin = time.perf_counter()
        producer = start(*args)
        STARTUP_S.append(time.perf_counter() - begin)
        return producer

    return timed


def run_seed(args: argparse.Namespace, records: list[dict]) -> dict[str, Any]:
    """One rotation of every trainer, from one seed; its report."""
    print(f"seed {args.seed}")
    with tempfile.TemporaryDirectory() as tmp:
        policy = wide_policy(Path(tmp) / "wide") if args.wide else SHIPPED_POLICY
        ours = [Timed(variant, records, args, Path(tmp), policy) for variant in VARIANTS]
        rotate(ours, args)
        for t in ours:
            t.trainer.stats()
        return report(ours)


def summarise_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each mode's throughput and held-out accuracy averaged over the seeds, the accuracy
    also as its difference to the synchronous loop's (the issue's 'within 3 points')."""
    names = [variant[0] for variant in VARIANTS]

    def mean(name: str, key: str) -> float:
        values = [run["modes"][name][key] or 0.0 for run in runs]
        return sum(values) / len(values)

    summary: dict[str, Any] = {}
    print(f"over {len(runs)} seeds: mean steps/min, held-out at equal steps and equal time")
    for name in names:
        row = {
            key: mean(name, key)
            for key in (
                "steps_per_min",
                "speedup_over_sync",
                "accuracy_at_equal_steps",
                "accuracy_at_equal_time",
            )
        }
        row["equal_steps_minus_sync"] = row["accuracy_at_equal_steps"] - mean(
            names[0], "accuracy_at_equal_steps"
        )
        summary[name] = row
        equal_steps, difference = row["accuracy_at_equal_steps"], row["equal_steps_minus_sync"]
        print(
            f"{name:<10}{row['steps_per_min']:>9.1f}{row['speedup_over_sync']:>7.2f}x"
            f"{100 * equal_steps:>8.1f} ({100 * difference:+.1f})"
            f"{100 * row['accuracy_at_equal_time']:>8.1f}"
        )
    return summary


def modes_table(title: str, modes: dict[str, dict[str, Any]]) -> Table:
    """Each trainer's steps per minute, its speed over sync and its held-out accuracy."""

    def percent(value: float | None) -> str:
        return "" if value is None else f"{100 * value:.1f}%"

    rows = [
        [
            name,
            f"{mode['steps_per_min']:.1f}",
            f"{mode['speedup_over_sync']:.2f}x",
            percent(mode.get("accuracy_at_equal_steps")),
            percent(mode.get("accuracy_at_equal_time")),
        ]
        for name, mode in modes.items()
    ]
    columns = ["trainer", "steps/min", "x sync", "held-out at equal steps", "at equal time"]
    return Table(title, columns, rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = BenchmarkRun("bench_pipeline")
    sources.PrefetchSource.open = _timed_start(sources.PrefetchSource.open)
    print(f"threads: sync 1 or 2, pipelined 1 + 1; {args.minutes} min, turns of {args.slice} s")
    records = addition_records(5000, seed=1)
    held_out = {r["input"] for r in heldout_records()}
    records = [r for r in records if r["input"] not in held_out]
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        runs.append(run_seed(argparse.Namespace(**{**vars(args), "seed": seed}), records))
    results: dict[str, Any] = {"runs": runs}
    if len(runs) > 1:
        results["mean_over_seeds"] = summarise_seeds(runs)
    if STARTUP_S:
        start_s = results["rollout_process_start_s"] = sorted(STARTUP_S)[len(STARTUP_S) // 2]
        print(f"rollout process start (once per job, left out): {start_s:.1f} s median")
    if args.json:
        first = args.seed
        tables = [modes_table(f"seed {first + i}", r["modes"]) for i, r in enumerate(runs)]
        if "mean_over_seeds" in results:
            title = f"mean of seeds {first}-{first + len(runs) - 1}"
            tables.append(modes_table(title, results["mean_over_seeds"]))
        run.write(args.json, results, tables)


if __name__ == "__main__":
    main()
