"""GRPO trainer benchmark: our step-time breakdown, and optimizer steps per minute against TRL.

Both trainers start from the same checkpoint (the warmed-up demo policy, so groups have mixed
rewards), on 3-digit addition with the same hyper-parameters: 16 prompts x G=8, temperature 1.0,
lr 3e-4 (constant), clip 0.2, no KL, one optimizer step per rollout batch, at most 6 completion
tokens, fp32 on one CPU thread. Ours generates with our engine and syncs weights into it after
every step; TRL's `GRPOTrainer` generates with `transformers` `generate` on the trained model
(no vLLM, so nothing to sync).

The machine is shared, so the two alternate step by step (one of ours after each of TRL's) and
see the same load; the first `--warmup` steps of each are not timed. Per step: generate (the
rollout without the reward), reward, train (log-probs, loss, backward, optimizer step; for TRL
everything in its step that is neither generation nor reward) and sync. Steps per minute count
optimizer steps over the summed step times; a batch our trainer filters (no group with mixed
rewards) costs its time and counts no step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_grpo.py --json bench_grpo.json
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.results import BenchmarkRun, Table
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import addition_records
from core_engine.rl.demo_policy import SHIPPED_POLICY
from core_engine.rl.rewards import exact_match
from core_engine.rl.trainer.grpo import GRPOTrainer

PROMPTS, GROUP, LR, TEMPERATURE, CLIP, MAX_TOKENS = 16, 8, 3e-4, 1.0, 0.2, 6
PARTS = ("generate_s", "reward_s", "train_s", "sync_s", "step_s")
TARGET_RATIO = 2.0  # ours / TRL, optimizer steps per minute


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps of each trainer")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args(argv)


def timed(fn: Callable, seconds: list[float]) -> Callable:
    """`fn` that appends its own duration to `seconds` on every call."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    return wrapper


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


# ----------------------------------------------------------------------------- TRL
def trl_missing() -> str | None:
    """Why TRL's GRPOTrainer cannot run here, or None."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        return f"TRL is not installed ({exc}); `pip install trl` (it keeps torch 2.13.0)"
    return None


def trl_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """Exact match against the dataset's `answer` column (TRL passes columns as kwargs)."""
    return exact_match(completions, answer, None)


class Alternate(TrainerCallback):
    """Times each TRL optimizer step, then runs `between()` outside the timed span."""

    def __init__(self, between: Callable[[], None]) -> None:
        self.between = between
        self.step_s: list[float] = []
        self._begin = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_s.append(time.perf_counter() - self._begin)
        self.between()


def trl_trainer(policy: Path, records: list[dict], args: argparse.Namespace, run_dir: Path):
    """TRL's GRPOTrainer on the same checkpoint, data and hyper-parameters as ours."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    config = TRLConfig(
        output_dir=str(run_dir / "trl"),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        learning_rate=LR,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=TEMPERATURE,
        beta=0.0,
        epsilon=CLIP,
        loss_type="dapo",  # token-averaged over the batch, like ours
        max_steps=args.warmup + args.steps,
        logging_strategy="no",
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_list([{"prompt": r["input"], "answer": r["output"]} for r in records])
    return TRLTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32),
        reward_funcs=trl_reward,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(policy),
    )


def run_alternating(trainer, ours: OurSteps) -> list[dict[str, float]]:
    """TRL's training run with one of our steps after each of its steps; TRL's timed steps."""
    generate_s: list[float] = []
    reward_s: list[float] = []
    trainer._generate_single_turn = timed(trainer._generate_single_turn, generate_s)
    trainer.reward_funcs[0] = timed(trainer.reward_funcs[0], reward_s)
    clock = Alternate(ours.step)
    trainer.add_callback(clock)
    trainer.train()
    return [
        {
            "generate_s": gen,
            "reward_s": reward,
            "train_s": step - gen - reward,
            "sync_s": 0.0,
            "step_s": step,
            "optimizer_step": 1.0,
        }
        for gen, reward, step in zip(generate_s, reward_s, clock.step_s, strict=True)
    ]


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
    """Our steps (alternating with TRL's when TRL is installed) and the ratio."""
    records = addition_records(5000, seed=1)
    reason = trl_missing()
    with tempfile.TemporaryDirectory() as tmp:
        ours = OurSteps(policy, records, args.seed, Path(tmp))
        if reason is not None:
            for _ in range(args.warmup + args.steps):
                ours.step()
            return {"ours": summarise(ours.steps[args.warmup :]), "trl_skipped": reason}
        trl_steps = run_alternating(trl_trainer(policy, records, args, Path(tmp)), ours)
    results = {
        "ours": summarise(ours.steps[args.warmup :]),
        "trl": summarise(trl_steps[args.warmup :]),
    }
    results["ratio_ours_over_trl"] = (
        results["ours"]["steps_per_min"] / results["trl"]["steps_per_min"]
    )
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = BenchmarkRun("bench_grpo")
    torch.set_num_threads(1)
    policy = SHIPPED_POLICY
    print(f"threads {torch.get_num_threads()}, policy {policy}")
    results = measure(policy, args)
    table = step_table({k: v for k, v in results.items() if k in ("ours", "trl")})
    print(table.markdown())
    if "trl" in results:
        ratio = results["ratio_ours_over_trl"]
        verdict = "met" if ratio >= TARGET_RATIO else "missed"
        print(f"ours / TRL steps per minute: {ratio:.2f}x (target {TARGET_RATIO}x {verdict})")
    else:
        print(f"TRL skipped: {results['trl_skipped']}")
    if args.json:
        run.write(args.json, results, [table])


if __name__ == "__main__":
    main()
