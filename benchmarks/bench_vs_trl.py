"""Ours against TRL's GRPOTrainer, each at its best on this machine: time to accuracy first,
optimizer steps per minute beside it.

Same task, policy, hyper-parameters and objective on both sides (`benchmarks/trl_grpo.py`:
the demo recipe; TRL with loss_type="dapo" and scale_rewards="group", ours training every group,
which is the same token-mean objective). Every variant starts from the shipped demo policy:

- ours: the synchronous loop on one intra-op thread and on all cores, the `one_step` and
  `in_flight` pipelines (one thread for training plus one in the rollout process);
- TRL (`transformers.generate` on the trained model) on one thread and on all cores.

They run in one process, interleaved in turns of `--slice` seconds of their own clocks until
each has trained `--minutes` (the machine's load is shared alike), from `--seeds` seeds. A
clock counts training only: every `--eval-every` optimizer steps the policy is scored greedily
on the same 1,000 held-out problems by the same evaluator (TRL's weights are loaded into an
engine for it), outside the clock, as is a pipeline's rollout process start. The headline is
the time each side needs to first reach `--target` points over the start (the same start for
all: the shipped policy's score), at its best variant; steps per minute beside it.

TRL runs in a virtual environment with the `bench` extra (`python -m venv .venv-bench &&
.venv-bench/bin/pip install -e '.[bench]'`):

    OMP_NUM_THREADS=1 .venv-bench/bin/python benchmarks/bench_vs_trl.py --json out.json
    OMP_NUM_THREADS=1 .venv-bench/bin/python benchmarks/bench_vs_trl.py --quick

`--real-shape` measures the protocol's other part instead (`benchmarks/vs_trl_shape.py`): a few
steps at the Qwen2.5-0.5B shape, LoRA and full, steps per minute and peak memory per side.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import vs_trl_shape
from benchmarks.bench_pipeline import VARIANTS, Timed, _timed_start
from benchmarks.results import BenchmarkRun, Table
from benchmarks.trl_grpo import (
    TRL_LOSS_TYPE,
    TRL_SCALE_REWARDS,
    StepClock,
    trl_missing,
    trl_trainer,
)
from core_engine.config import EngineConfig
from core_engine.engine import load_engine
from core_engine.policies.demo import SHIPPED_POLICY, greedy_accuracy, heldout_records
from core_engine.rl.data.tasks import addition_records
from core_engine.rl.rollout import sources
from core_engine.weights import canonical_weights

GOAL = 1 / 3  # our time to the target at most a third of TRL's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="training time of each")
    parser.add_argument("--slice", type=float, default=20.0, help="seconds per turn")
    parser.add_argument("--eval-every", type=int, default=25, help="optimizer steps between evals")
    parser.add_argument("--target", type=float, default=0.20, help="gain over the start")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=3, help="runs: --seed, --seed + 1, ...")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--real-shape",
        action="store_true",
        help="instead: the Qwen2.5-0.5B shape, LoRA and full, steps/min and peak memory "
        "(benchmarks/vs_trl_shape.py)",
    )
    parser.add_argument("--steps", type=int, default=3, help="--real-shape: steps of a run")
    parser.add_argument("--rounds", type=int, default=1, help="--real-shape: runs of a variant")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.slice, args.eval_every, args.seeds = 0.25, 5.0, 3, 1
    args.wide = False  # `Timed` reads it: the demo policy, not bench_pipeline's wide model
    return args


class TRLEvaluator:
    """The evaluator our trainers use (`greedy_accuracy` on our engine), fed TRL's weights."""

    def __init__(self) -> None:
        self.engine = load_engine(SHIPPED_POLICY, EngineConfig(max_batch_size=256), dtype="float32")

    def __call__(self, model: torch.nn.Module) -> float:
        weights = {k: v.detach() for k, v in canonical_weights(model).items()}
        self.engine.update_weights(weights, self.engine.version + 1)
        return greedy_accuracy(self.engine, heldout_records())


class TRLTurns:
    """TRL's training run in a process of its own (its own threads: torch's intra-op pool is
    not for two Python threads at once), run a turn at a time: it trains while the rotation
    waits, and waits while another trainer has the turn."""

    def __init__(self, threads: int, records: list[dict], args: argparse.Namespace, root: Path):
        self.name, self.threads = f"TRL x{threads}", threads
        self.seconds, self.steps = 0.0, 0
        self.points: list[dict[str, float]] = []
        self._conn, child = multiprocessing.Pipe()
        config = (threads, records, vars(args), root / self.name.replace(" ", "_"))
        self._process = multiprocessing.get_context("spawn").Process(
            target=_trl_child, args=(child, config), daemon=True
        )
        self._process.start()

    @property
    def steps_per_min(self) -> float:
        return 60 * self.steps / max(self.seconds, 1e-9)

    def run_slice(self, seconds: float) -> None:
        self._conn.send(seconds)
        state = self._conn.recv()
        self.seconds, self.steps, self.points = state["seconds"], state["steps"], state["points"]


def _trl_child(conn, config: tuple) -> None:
    """The TRL process: waits for a turn's length, trains for it, reports its state."""
    threads, records, args, run_dir = config
    torch.set_num_threads(threads)
    evaluator = TRLEvaluator()
    trainer = trl_trainer(SHIPPED_POLICY, records, run_dir, args["seed"], 10**6)
    state: dict[str, Any] = {"seconds": 0.0, "steps": 0, "points": []}
    turn = {"left": conn.recv()}

    def evaluate() -> None:
        point = {"version": state["steps"], "minutes": state["seconds"] / 60}
        state["points"].append({**point, "accuracy": evaluator(trainer.model)})

    def after_step() -> None:  # outside the step's clock
        state["steps"] += 1
        state["seconds"] += clock.step_s[-1]
        turn["left"] -= clock.step_s[-1]
        if state["steps"] % args["eval_every"] == 0:
            evaluate()
        if state["seconds"] >= args["minutes"] * 60:
            trainer.control.should_training_stop = True
        elif turn["left"] <= 0:
            conn.send(state)
            turn["left"] = conn.recv()

    clock = StepClock(after_step)
    trainer.add_callback(clock)
    evaluate()
    trainer.train()
    conn.send(state)


def rotate(trainers: list, args: argparse.Namespace) -> None:
    """Turns of `--slice` seconds, one trainer after another, until each has `--minutes`."""
    budget = args.minutes * 60
    while any(t.seconds < budget for t in trainers):
        for trainer in trainers:
            if trainer.seconds < budget:
                trainer.run_slice(args.slice)  # each sets its own threads


def time_to(points: list[dict[str, float]], accuracy: float) -> float | None:
    """Minutes of training at the first evaluation at or above `accuracy`, None if none is."""
    return next((p["minutes"] for p in points if p["accuracy"] >= accuracy - 1e-9), None)


def run_seed(args: argparse.Namespace, records: list[dict]) -> dict:
    """Every variant from one seed, interleaved; per variant its curve, steps/min and time to
    the target."""
    print(f"seed {args.seed}", flush=True)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ours = [
            Timed(v, records, args, root, SHIPPED_POLICY, drop_zero_variance_groups=False)
            for v in VARIANTS
        ]
        trl = [TRLTurns(n, records, args, root) for n in sorted({1, cores})]
        rotate([*ours, *trl], args)
    start = ours[0].points[0]["accuracy"]
    target = start + args.target
    variants = {}
    for side, trainers in (("ours", ours), ("TRL", trl)):
        for t in trainers:
            minutes = time_to(t.points, target)
            variants[t.name] = {
                "side": side,
                "steps": t.trainer.version if side == "ours" else t.steps,
                "minutes": t.seconds / 60,
                "steps_per_min": t.steps_per_min,
                "time_to_target_min": minutes,
                "final_accuracy": t.points[-1]["accuracy"],
                "points": t.points,
            }
            print(
                f"  {t.name:<10} {variants[t.name]['steps_per_min']:>7.1f} steps/min, "
                f"to +{100 * args.target:.0f} pts: {_minutes(minutes)}, "
                f"final {100 * t.points[-1]['accuracy']:.1f}%",
                flush=True,
            )
    return {
        "seed": args.seed,
        "start_accuracy": start,
        "target_accuracy": target,
        "variants": variants,
    }


def summarise(runs: list[dict]) -> dict[str, Any]:
    """Per variant over the seeds: the median time to the target (a seed that never reached
    it counts as never), mean steps/min; each side's best variant and the headline ratio."""
    names = list(runs[0]["variants"])
    summary: dict[str, Any] = {"variants": {}}
    for name in names:
        rows = [run["variants"][name] for run in runs]
        times = [r["time_to_target_min"] for r in rows]
        reached = [t for t in times if t is not None]
        summary["variants"][name] = {
            "side": rows[0]["side"],
            "steps_per_min": statistics.fmean(r["steps_per_min"] for r in rows),
            "reached": f"{len(reached)}/{len(times)}",
            # a median over seeds, "never" (None) when half or more never reached the target
            "time_to_target_min": (
                statistics.median(sorted(reached) + [float("inf")] * (len(times) - len(reached)))
                if len(reached) * 2 > len(times)
                else None
            ),
            "final_accuracy": statistics.fmean(r["final_accuracy"] for r in rows),
        }
    for side in ("ours", "TRL"):
        own = {n: v for n, v in summary["variants"].items() if v["side"] == side}
        summary[f"best_{side}"] = min(own, key=lambda n: _rank(own[n]))
    best_ours = summary["variants"][summary["best_ours"]]
    best_trl = summary["variants"][summary["best_TRL"]]
    if best_ours["time_to_target_min"] and best_trl["time_to_target_min"]:
        summary["time_ratio"] = best_ours["time_to_target_min"] / best_trl["time_to_target_min"]
    summary["steps_per_min_ratio"] = best_ours["steps_per_min"] / best_trl["steps_per_min"]
    return summary


def _rank(variant: dict) -> tuple[float, float]:
    """Fastest to the target first; among those that never reach it, the most steps/min."""
    minutes = variant["time_to_target_min"]
    return (minutes if minutes is not None else float("inf"), -variant["steps_per_min"])


def _minutes(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} min"


def table(summary: dict[str, Any], args: argparse.Namespace, seeds: int) -> Table:
    best = {summary["best_ours"], summary["best_TRL"]}
    rows = [
        [
            f"**{name}**" if name in best else name,
            f"{v['steps_per_min']:.1f}",
            _minutes(v["time_to_target_min"]),
            v["reached"],
            f"{100 * v['final_accuracy']:.1f}%",
        ]
        for name, v in summary["variants"].items()
    ]
    title = (
        f"Time to +{100 * args.target:.0f} points of held-out accuracy, {args.minutes:g} min "
        f"each, {seeds} seed(s); best of each side in bold"
    )
    columns = ["variant", "steps/min", "time to target (median)", "reached", "final accuracy"]
    return Table(title, columns, rows)


def real_shape(args: argparse.Namespace) -> int:
    """Part 4 of the protocol: ours and TRL at the Qwen2.5-0.5B shape (`vs_trl_shape`)."""
    run = BenchmarkRun("bench_vs_trl_shape")
    with tempfile.TemporaryDirectory() as tmp:
        results = vs_trl_shape.measure(Path(tmp), args.steps, args.rounds)
    shown = vs_trl_shape.table(results)
    print(shown.markdown())
    if args.json:
        run.write(args.json, {"runs": results, "args": {"steps": args.steps}}, [shown])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if (reason := trl_missing()) is not None:
        print(reason)
        return 1
    if args.real_shape:
        return real_shape(args)
    run = BenchmarkRun("bench_vs_trl")
    sources.PrefetchSource.open = _timed_start(sources.PrefetchSource.open)
    print(
        f"objective: TRL loss_type={TRL_LOSS_TYPE!r}, scale_rewards={TRL_SCALE_REWARDS!r}; ours "
        f"token mean over the step, every group trained; {args.minutes:g} min each, turns of "
        f"{args.slice:g} s, {os.cpu_count()} cores",
        flush=True,
    )
    records = addition_records(5000, seed=1)
    held_out = {r["input"] for r in heldout_records()}
    records = [r for r in records if r["input"] not in held_out]
    runs = [
        run_seed(argparse.Namespace(**{**vars(args), "seed": seed}), records)
        for seed in range(args.seed, args.seed + args.seeds)
    ]
    summary = summarise(runs)
    shown = table(summary, args, len(runs))
    print(shown.markdown())
    ratio = summary.get("time_ratio")
    verdict = (
        "" if ratio is None else f" (goal <= {GOAL:.2f}: {'met' if ratio <= GOAL else 'missed'})"
    )
    print(
        f"best: ours {summary['best_ours']}, TRL {summary['best_TRL']}; time to target ours/TRL: "
        f"{'n/a' if ratio is None else f'{ratio:.2f}'}{verdict}; steps/min ours/TRL: "
        f"{summary['steps_per_min_ratio']:.2f}x"
    )
    if args.json:
        results = {
            "objective": {"trl_loss_type": TRL_LOSS_TYPE, "trl_scale_rewards": TRL_SCALE_REWARDS},
            "args": {k: str(v) for k, v in vars(args).items()},
            "runs": runs,
            "summary": summary,
        }
        run.write(args.json, results, [shown])
    return 0


if __name__ == "__main__":
    sys.exit(main())
