"""Every algorithm preset (`core_engine.rl.presets`: GRPO, Dr. GRPO, DAPO, GSPO, RLOO) trained
on the same tasks from the same policies: does each one train?

Two tasks, each run as its demo runs it: the demo task (3-digit addition from the shipped demo
policy, `grpo_demo.make_trainer`'s recipe with the preset's settings over it, 1,000 held-out
problems scored greedily) and word problems with the shipped calculator policy in its
environment (the Launch form's job with the preset chosen, run by the worker's job runner on a
temporary SQLite database as `calculator_demo.py` does; its held-out word problems scored by
the worker, greedy episodes). Each seed runs every preset for `--steps` steps (word problems:
`--calculator-steps`, their steps being far longer): on the demo
task interleaved step by step (`grpo_demo.run_interleaved`), on word problems one job after
another in an order rotated by the seed; so the machine's load falls on all alike.

Per task and preset: held-out accuracy at the start and the end (mean over seeds, with the
lowest and highest), steps per minute of training (evaluations left out: on the demo task the
steps' own time, on word problems from version 1 to the last, version 0's evaluation being
before version 1), and whether every run trained (its versions advanced, no failed job).
A few steps show that each preset trains; they do not rank the presets.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_objectives.py --seeds 0 1 --steps 30 \\
        --json docs/benchmarks/bench_objectives.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_objectives.py --quick
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import calculator_demo, grpo_demo
from benchmarks.results import BenchmarkRun, Table
from core_engine.assets import SHIPPED_POLICY
from core_engine.rl.presets import ALGORITHM_PRESETS
from core_engine.rl.trainer.grpo import GRPOTrainer

PRESETS = tuple(ALGORITHM_PRESETS)
TASKS = ("demo", "calculator")
SUCCEEDED = "succeeded"  # a job's status when it ran all its steps


@dataclass(frozen=True)
class PresetRun:
    """One preset's run on one task with one seed. `steps` were taken in `step_seconds`
    (None: too few to time); `status` is the job's end (`SUCCEEDED`) or what went wrong."""

    task: str
    preset: str
    seed: int
    start_accuracy: float | None
    end_accuracy: float | None
    versions: int
    steps: int
    step_seconds: float | None
    status: str

    @property
    def trained(self) -> bool:
        return self.status == SUCCEEDED and self.versions > 0


def demo_runs(data: Path, seed: int, steps: int) -> list[PresetRun]:
    """Every preset on the demo task with `seed`, interleaved step by step, scored at the start
    and the end."""
    args = grpo_demo.parse_args(["--seed", str(seed), "--steps", str(steps)])
    trainers = {
        preset: grpo_demo.make_trainer(
            SHIPPED_POLICY, data / f"demo-{seed}-{i}", args, grpo_demo.Variant(), preset
        )
        for i, preset in enumerate(PRESETS)
    }
    curves = grpo_demo.run_interleaved(trainers, minutes=math.inf, eval_every=steps + 1)
    return [
        PresetRun(
            "demo",
            preset,
            seed,
            curve.points[0].accuracy,
            curve.points[-1].accuracy,
            trainers[preset].version,
            trainers[preset].step_index,
            curve.stepping,
            demo_status(trainers[preset]),
        )
        for preset, curve in curves.items()
    ]


def demo_status(trainer: GRPOTrainer) -> str:
    """`SUCCEEDED` when the trainer took all its steps, else why it stopped (a demo run that
    raises stops the benchmark)."""
    if trainer.step_index >= trainer.config.steps:
        return SUCCEEDED
    return f"stopped: {trainer.stop_reason()}"


def calculator_run(
    data: Path, preset: str, seed: int, steps: int, heldout_prompts: int | None
) -> PresetRun:
    """`preset` on word problems: the Launch form's calculator job with the preset chosen (its
    fields filled as the form fills them), scored at version 0 and at its last."""
    from ui.handlers.algorithm_form import algorithm_form

    form = calculator_demo.launch_form(steps) | algorithm_form(preset)[0]
    form |= {"preset": preset, "seed": seed, "heldout_every": steps}
    if heldout_prompts is not None:
        form["heldout_prompts"] = heldout_prompts
    repo, job = calculator_demo.submit_launch(data, form)
    outcome = calculator_demo.run_submitted(repo, job.id)
    points = calculator_demo.heldout_points(repo, job.id)
    versions = repo.list_versions(job.id)
    last = versions[-1].version if versions else 0
    timed = last >= 2  # version 1 to the last: steps without version 0's evaluation
    seconds = (versions[-1].created_at - versions[1].created_at).total_seconds() if timed else None
    status = outcome.status if outcome.status != "failed" else f"failed: {outcome.error}"
    return PresetRun(
        "calculator",
        preset,
        seed,
        points[0][2] if points else None,
        points[-1][2] if len(points) > 1 else None,
        last,
        last - 1 if timed else 0,
        seconds,
        status,
    )


def rotated(presets: Sequence[str], seed: int) -> list[str]:
    """The presets starting at the `seed`-th, so no preset always runs first."""
    start = seed % len(presets)
    return [*presets[start:], *presets[:start]]


def percent(values: list[float | None]) -> str:
    """Mean and (lowest-highest) in percent over the runs that have a value; '-' for none."""
    known = [100 * v for v in values if v is not None]
    if not known:
        return "-"
    mean = f"{sum(known) / len(known):.1f}"
    return mean if len(known) == 1 else f"{mean} ({min(known):.1f}-{max(known):.1f})"


def summary_table(runs: list[PresetRun]) -> Table:
    """One row per task and preset (in the order first run): held-out accuracy at the start
    and the end, steps per minute over the timed runs, versions per seed, and whether every
    run trained (else each one that did not, with its status)."""
    groups: dict[tuple[str, str], list[PresetRun]] = {}
    for run in runs:
        groups.setdefault((run.task, run.preset), []).append(run)
    rows = []
    for (task, preset), group in groups.items():
        timed = [r for r in group if r.step_seconds]
        rate = (
            f"{60 * sum(r.steps for r in timed) / sum(r.step_seconds for r in timed):.1f}"
            if timed
            else "-"
        )
        failed = [f"seed {r.seed}: {r.status}, v{r.versions}" for r in group if not r.trained]
        rows.append(
            [
                task,
                preset,
                ", ".join(str(r.seed) for r in group),
                percent([r.start_accuracy for r in group]),
                percent([r.end_accuracy for r in group]),
                rate,
                ", ".join(str(r.versions) for r in group),
                "yes" if not failed else "no (" + "; ".join(failed) + ")",
            ]
        )
    columns = [
        "task",
        "preset",
        "seeds",
        "held-out % at start",
        "held-out % at end",
        "steps/min",
        "versions",
        "all trained",
    ]
    return Table("Presets, held-out accuracy: mean (lowest-highest) over seeds", columns, rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30, help="steps of each run")
    parser.add_argument(
        "--calculator-steps", type=int, help="steps of each word-problem run (default: --steps)"
    )
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument(
        "--calculator-heldout",
        type=int,
        help="held-out word problems per evaluation (default: the Launch form's)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: one seed, 3 steps, 20 word problems"
    )
    parser.add_argument("--json", type=Path, help="write the result file here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.calculator_steps, args.calculator_heldout = [0], 3, 3, 20
    args.calculator_steps = args.calculator_steps or args.steps
    if min(args.steps, args.calculator_steps) < 2:
        parser.error("each run needs at least 2 steps (word problems are timed from version 1)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    record = BenchmarkRun("bench_objectives")
    data = calculator_demo.use_temporary_data()
    import torch

    torch.set_num_threads(1)
    runs: list[PresetRun] = []
    for seed in args.seeds:
        if "demo" in args.tasks:
            runs += demo_runs(data, seed, args.steps)
        if "calculator" in args.tasks:
            for preset in rotated(PRESETS, seed):
                runs.append(
                    calculator_run(
                        data, preset, seed, args.calculator_steps, args.calculator_heldout
                    )
                )
                print(runs[-1], flush=True)
    table = summary_table(runs)
    print(f"{table.title}\n{table.markdown()}")
    if args.json:
        results = {
            "steps": {"demo": args.steps, "calculator": args.calculator_steps},
            "seeds": args.seeds,
            "runs": [asdict(r) for r in runs],
        }
        record.write(args.json, results, [table])


if __name__ == "__main__":
    main()
