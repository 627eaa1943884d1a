"""GRPO trainer benchmark: our step-time breakdown, and optimizer steps per minute against TRL.

Both trainers start from the same checkpoint (the warmed-up demo policy, so groups have mixed
rewards), on 3-digit addition with the same hyper-parameters: 16 prompts x G=8, temperature 1.0,
lr 3e-4 (constant), clip 0.2, no KL, one optimizer step per rollout batch, at most 6 completion
tokens, fp32 on one CPU thread. Ours generates with our engine and syncs weights into it after
every step; TRL's `GRPOTrainer` generates with `transformers` `generate` on the trained model
(no vLLM, so nothing to sync). A few warm-up steps are not timed.

Per step: generate (rollout without the reward), reward, train (log-probs, loss, backward,
optimizer step; for TRL everything that is neither generation nor reward) and sync. Steps per
minute count optimizer steps over the timed wall time; a batch our trainer filters (no group
with mixed rewards) costs its generation time and counts no step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_grpo.py --json bench_grpo.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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

from core_engine.rl.config import GRPOConfig
from core_engine.rl.demo_policy import build_demo_policy
from core_engine.rl.rewards import exact_match
from core_engine.rl.tasks import addition_records
from core_engine.rl.trainer import GRPOTrainer

PROMPTS, GROUP, LR, TEMPERATURE, CLIP, MAX_TOKENS = 16, 8, 3e-4, 1.0, 0.2, 6
PARTS = ("generate_s", "reward_s", "train_s", "sync_s")
TARGET_RATIO = 2.0  # ours / TRL, optimizer steps per minute


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps of ours")
    parser.add_argument("--trl-steps", type=int, default=50, help="timed steps of TRL")
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


def summarise(steps: list[dict[str, float]], wall_s: float, optimizer_steps: int) -> dict:
    """Median seconds per part and per step, and optimizer steps per minute of wall time."""
    per_part = {part: statistics.median(s[part] for s in steps) for part in (*PARTS, "step_s")}
    return {
        "optimizer_steps": optimizer_steps,
        "batches": len(steps),
        "wall_s": wall_s,
        "steps_per_min": 60 * optimizer_steps / wall_s,
        "median_s": per_part,
    }


# ----------------------------------------------------------------------------- ours
def bench_ours(policy: Path, records: list[dict], args: argparse.Namespace, run_dir: Path) -> dict:
    """Our GRPOTrainer; generate_s of its metrics includes the reward, which is timed apart."""
    config = GRPOConfig(
        model=str(policy),
        output_dir=str(run_dir / "ours"),
        task="addition",
        steps=args.warmup + args.steps,
        batch_size=PROMPTS,
        group_size=GROUP,
        lr=LR,
        temperature=TEMPERATURE,
        clip_eps=CLIP,
        kl_coef=0.0,
        max_tokens=MAX_TOKENS,
        seed=args.seed,
        resume=False,
    )
    trainer = GRPOTrainer(config, records)
    reward_s: list[float] = []
    trainer.runner.reward_fn = timed(trainer.runner.reward_fn, reward_s)
    for _ in range(args.warmup):
        trainer.step()
    steps, accepted, start = [], 0, time.perf_counter()
    for _ in range(args.steps):
        reward_s.clear()
        begin = time.perf_counter()
        record = trainer.step()
        step_s = time.perf_counter() - begin
        accepted += record.status == "accepted"
        m = record.metrics
        steps.append(
            {
                "generate_s": m.get("generate_s", 0.0) - sum(reward_s),
                "reward_s": sum(reward_s),
                "train_s": m.get("train_s", 0.0),
                "sync_s": m.get("sync_s", 0.0),
                "step_s": step_s,
            }
        )
    return summarise(steps, time.perf_counter() - start, accepted)


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


class StepClock(TrainerCallback):
    """Keeps the wall-clock begin and end of every optimizer step."""

    def __init__(self) -> None:
        self.begins: list[float] = []
        self.ends: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begins.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


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
        max_steps=args.warmup + args.trl_steps,
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


def bench_trl(policy: Path, records: list[dict], args: argparse.Namespace, run_dir: Path) -> dict:
    """TRL's steps, with its generation and reward calls timed by wrapping them."""
    trainer = trl_trainer(policy, records, args, run_dir)
    generate_s: list[float] = []
    reward_s: list[float] = []
    trainer._generate_single_turn = timed(trainer._generate_single_turn, generate_s)
    trainer.reward_funcs[0] = timed(trainer.reward_funcs[0], reward_s)
    clock = StepClock()
    trainer.add_callback(clock)
    trainer.train()
    steps = []
    for i in range(args.warmup, len(clock.ends)):
        step_s = clock.ends[i] - clock.begins[i]
        steps.append(
            {
                "generate_s": generate_s[i],
                "reward_s": reward_s[i],
                "train_s": step_s - generate_s[i] - reward_s[i],
                "sync_s": 0.0,
                "step_s": step_s,
            }
        )
    first = clock.ends[args.warmup - 1] if args.warmup else clock.begins[0]
    return summarise(steps, clock.ends[-1] - first, len(steps))


# ----------------------------------------------------------------------------- report
def print_table(results: dict[str, dict]) -> None:
    print(
        f"{'trainer':<8}" + "".join(f"{p:>11}" for p in (*PARTS, "step_s")) + f"{'steps/min':>11}"
    )
    for name, r in results.items():
        parts = "".join(f"{r['median_s'][p]:>11.3f}" for p in (*PARTS, "step_s"))
        print(f"{name:<8}{parts}{r['steps_per_min']:>11.1f}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    data_dir = Path(os.environ.get("RLWB_DATA_DIR", "data"))
    policy = build_demo_policy(data_dir / "demo-policy", seed=args.seed, max_minutes=8)
    records = addition_records(5000, seed=1)
    print(f"threads {torch.get_num_threads()}, policy {policy}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["ours"] = bench_ours(policy, records, args, Path(tmp))
        reason = trl_missing()
        if reason is None:
            results["trl"] = bench_trl(policy, records, args, Path(tmp))
    print_table({k: v for k, v in results.items() if isinstance(v, dict)})
    if reason is None:
        ratio = results["ours"]["steps_per_min"] / results["trl"]["steps_per_min"]
        results["ratio_ours_over_trl"] = ratio
        verdict = "met" if ratio >= TARGET_RATIO else "missed"
        print(f"ours / TRL steps per minute: {ratio:.2f}x (target {TARGET_RATIO}x {verdict})")
    else:
        results["trl_skipped"] = reason
        print(f"TRL skipped: {reason}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
