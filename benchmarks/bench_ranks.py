"""One job on two ranks against one rank, side by side: optimizer steps per minute of the demo
task (`core_engine.rl.ranks`: data-parallel rollouts; full weights sharded by FSDP2 or
replicated, or a replicated LoRA adapter).

Each variant trains the shipped demo policy with the recipe of `grpo_demo.py` (3-digit
addition, 16 prompts x G=8, lr 3e-4, at most 6 tokens, fp32) from the same start for
`--steps` optimizer steps; a variant's rate is its steps after the first (the warm-up) over
their time, so process starts and model loads are left out. The variants run in turns, `--rounds`
times, so the machine's load is shared alike; the median round is reported.

    1 rank x 1 thread   the worker's default (one intra-op thread)
    1 rank x 2 threads  both cores on one process (torch's intra-op parallelism)
    1 rank one_step     both cores as a pipeline: generation (a thread or a child process)
    1 rank in_flight    beside training (`bench_pipeline.py`), updates landing between steps
    2 ranks x 1 thread  `devices = 2`: one rank per core
    2 ranks one_step    each rank a pipeline: its share generated on a thread of its own
    2 ranks in_flight   beside the rank's training, and gathered when the step takes it
    2 ranks replicated  (full weights) `sharding = "replicate"`: whole weights on each rank,
                        gradients summed by one all-reduce, no FSDP2 gathers; sync and one_step

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ranks.py --steps 40 --rounds 3
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ranks.py --lora --size wide

`--memory`: peak memory per rank instead, at 1, 2 and 4 ranks (full weights, FSDP2, with a KL
reference and a checkpoint per version), beside the per-rank floor `training_footprint`
estimates. Each job runs in a fresh process (rank 0; the others its spawned children), so each
peak RSS (`ru_maxrss`: the process's high-water mark, all it ever mapped, the interpreter and
torch included) is that job's alone.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ranks.py --memory --size 100m --steps 2

`--size`: the shipped demo policy (`demo`, the default), or a random Llama with the demo's
tokenizer: `wide` (512 wide, 6 layers: ~20M parameters) or `100m` (768 wide, 12 layers:
~106M), where the weights, not the process, dominate a rank's memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench_pipeline import wide_policy

from benchmarks.results import BenchmarkRun, Table
from core_engine.assets import SHIPPED_POLICY
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import addition_records
from core_engine.rl.ranks.launch import job_ranks
from core_engine.rl.trainer.grpo import GRPOTrainer
from core_engine.rl.trainer.records import StepRecord, TrainerHooks

# (name, devices, intra-op threads, pipeline, sharding): one rank on one core, on both, both
# cores as a pipeline (training on one, generation on the other), and one rank per core,
# synchronous or pipelined, full weights sharded or replicated
VARIANTS = (
    ("1 rank x 1 thread", 1, 1, "sync", "fsdp2"),
    ("1 rank x 2 threads", 1, 2, "sync", "fsdp2"),
    ("1 rank one_step", 1, 2, "one_step", "fsdp2"),
    ("1 rank in_flight", 1, 2, "in_flight", "fsdp2"),
    ("2 ranks x 1 thread", 2, 1, "sync", "fsdp2"),
    ("2 ranks one_step", 2, 1, "one_step", "fsdp2"),
    ("2 ranks in_flight", 2, 1, "in_flight", "fsdp2"),
    ("2 ranks replicated", 2, 1, "sync", "replicate"),
    ("2 replicated one_step", 2, 1, "one_step", "replicate"),
)
TARGET = 1.6  # 2 ranks over 1 rank x 1 thread


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="turns of every variant")
    parser.add_argument("--lora", action="store_true", help="LoRA (rank 8) instead of full")
    parser.add_argument("--size", choices=SIZES, default="demo", help="the model (see above)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--memory", action="store_true", help="peak memory per rank at 1, 2, 4")
    parser.add_argument("--memory-of", type=int, help=argparse.SUPPRESS)  # one job, this process
    parser.add_argument("--policy", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


MEMORY_DEVICES = (1, 2, 4)
# a random Llama's shape beyond `bench_pipeline.wide_policy`'s defaults, by `--size`
SIZES = {
    "demo": None,
    "wide": {},
    "100m": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12),
}


def policy_of(size: str, directory: Path) -> Path:
    """The checkpoint `--size` names (a random one is written under `directory`)."""
    shape = SIZES[size]
    return SHIPPED_POLICY if shape is None else wide_policy(directory, **shape)


def memory_config(policy: Path, out: Path, devices: int, steps: int) -> GRPOConfig:
    return GRPOConfig(
        model=str(policy),
        output_dir=str(out),
        task="addition",
        steps=steps,
        batch_size=4,
        group_size=4,
        max_tokens=6,
        kl_coef=0.05,
        drop_zero_variance_groups=False,
        checkpoint_every=1,
        keep_last=1,
        devices=devices,
    )


def peak_memory(policy: Path, devices: int, steps: int) -> dict[str, float]:
    """One `devices`-rank job in this process: peak RSS of rank 0 (this process) and of the
    largest other rank (the children, reaped), in MiB, and the footprint's per-rank floor."""
    from transformers import AutoConfig

    from core_engine.rl.footprint.estimate import training_footprint

    with tempfile.TemporaryDirectory() as out:
        config = memory_config(policy, Path(out), devices, steps)
        records = addition_records(200, seed=0)
        if devices == 1:
            GRPOTrainer(config, records).train()
        else:
            with job_ranks(config, records) as info:
                GRPOTrainer(config, records, ranks=info).train()
    hf_config = AutoConfig.from_pretrained(policy)
    floor = training_footprint(config, hf_config, torch.device("cpu"), devices).total_bytes
    others = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if devices > 1 else 0
    return {
        "rank0_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "other_ranks_peak_mib": others / 1024,
        "footprint_mib": floor / 2**20,
    }


def memory_table(policy: Path, steps: int) -> dict[int, dict[str, float]]:
    """`peak_memory` at each of `MEMORY_DEVICES`, each in a fresh process."""
    results = {}
    for devices in MEMORY_DEVICES:
        command = [sys.executable, __file__, "--memory-of", str(devices), "--policy", str(policy)]
        done = subprocess.run(
            [*command, "--steps", str(steps)], capture_output=True, text=True, check=True
        )
        results[devices] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n{'ranks':>5s} {'rank 0 peak':>12s} {'others peak':>12s} {'footprint':>10s} (MiB)")
    for devices, row in results.items():
        others = f"{row['other_ranks_peak_mib']:.0f}" if devices > 1 else "-"
        print(
            f"{devices:5d} {row['rank0_peak_mib']:12.0f} {others:>12s} {row['footprint_mib']:10.0f}"
        )
    return results


def run(policy: Path, out: Path, variant: tuple, args: argparse.Namespace) -> float:
    """Steps per minute of one run (after its first step)."""
    _, devices, threads, pipeline, sharding = variant
    config = GRPOConfig(
        model=str(policy),
        output_dir=str(out),
        task="addition",
        steps=args.steps,
        batch_size=16,
        group_size=8,
        lr=3e-4,
        temperature=1.0,
        max_tokens=6,
        seed=0,
        resume=False,
        drop_zero_variance_groups=False,  # every batch trains: the same compute each step
        checkpoint_every=0,
        lora={"rank": 8, "alpha": 16.0} if args.lora else None,
        devices=devices,
        sharding=sharding,
        pipeline=pipeline,
        max_policy_lag=0 if pipeline == "sync" else 1,
    )
    records = addition_records(2000, seed=0)
    times: list[float] = []

    def on_step(record: StepRecord) -> None:
        if record.version is not None:
            times.append(time.perf_counter())

    hooks = TrainerHooks(on_step=on_step)
    torch.set_num_threads(threads)
    try:
        if devices == 1:
            GRPOTrainer(config, records, hooks).train()
        else:
            with job_ranks(config, records) as info:
                GRPOTrainer(config, records, hooks, info).train()
    finally:
        torch.set_num_threads(1)
    return (len(times) - 1) / (times[-1] - times[0]) * 60


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.memory_of:
        print(json.dumps(peak_memory(args.policy, args.memory_of, args.steps)))
        return
    if args.memory:
        run_record = BenchmarkRun("bench_ranks")
        steps = min(args.steps, 3)
        with tempfile.TemporaryDirectory() as tmp:
            results = memory_table(policy_of(args.size, Path(tmp)), steps)
        if args.json:
            rows = [
                [
                    str(devices),
                    f"{row['rank0_peak_mib']:.0f}",
                    f"{row['other_ranks_peak_mib']:.0f}" if devices > 1 else "-",
                    f"{row['footprint_mib']:.0f}",
                ]
                for devices, row in results.items()
            ]
            title = (
                f"Peak RSS per rank, MiB ({args.size} model, full weights, FSDP2, KL reference, "
                f"a checkpoint per version, {steps} steps)"
            )
            columns = ["ranks", "rank 0 peak", "other ranks' peak", "footprint estimate"]
            run_record.write(args.json, results, [Table(title, columns, rows)])
        return
    run_record = BenchmarkRun("bench_ranks")
    # LoRA replicates whatever `sharding` says: its replicated variants would repeat the others
    variants = [v for v in VARIANTS if not (args.lora and v[4] == "replicate")]
    rates: dict[str, list[float]] = {variant[0]: [] for variant in variants}
    with tempfile.TemporaryDirectory() as tmp:
        policy = policy_of(args.size, Path(tmp))
        what = f"a random {args.size} model" if SIZES[args.size] is not None else "the demo policy"
        print(f"{what}, {'LoRA' if args.lora else 'full weights'}, {args.steps} steps per run")
        for round_index in range(args.rounds):
            for index, variant in enumerate(variants):
                name = variant[0]
                out = Path(tmp) / f"r{round_index}-{index}"
                rates[name].append(run(policy, out, variant, args))
                print(f"round {round_index + 1}: {name:22s} {rates[name][-1]:7.1f} steps/min")
    base = statistics.median(rates[variants[0][0]])
    print(f"\n{'variant':22s} {'steps/min':>10s} {'x 1 rank':>9s}")
    summary: dict[str, Any] = {}
    for name, *_ in variants:
        median = statistics.median(rates[name])
        summary[name] = {"steps_per_min": median, "speedup": median / base, "runs": rates[name]}
        print(f"{name:22s} {median:10.1f} {median / base:8.2f}x")
    print(f"goal: 2 ranks >= {TARGET}x one rank x 1 thread")
    if args.json:
        what = "LoRA" if args.lora else "full weights"
        rows = [
            [name, f"{s['steps_per_min']:.1f}", f"{s['speedup']:.2f}x"]
            for name, s in summary.items()
        ]
        table = Table(
            f"Optimizer steps per minute ({what}, {args.steps} steps x {args.rounds} rounds)",
            ["variant", "steps/min", "x 1 rank x 1 thread"],
            rows,
        )
        run_record.write(args.json, summary, [table])


if __name__ == "__main__":
    main()
