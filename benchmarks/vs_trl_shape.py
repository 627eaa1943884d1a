"""The real shape against TRL (`bench_vs_trl.py --real-shape`, issue 44 part 4): a few GRPO
steps of Qwen2.5-0.5B's configuration (random weights, `bench_real_shape.QWEN25_05B`), 8 prompts
x G=4 x 64 new tokens, LoRA (r=16, alpha 32, all linear layers) and full weights, ours and TRL's
`GRPOTrainer` on the same settings: optimizer steps per minute and peak memory.

Same on both sides: the `addition` prompts, temperature 1, clip 0.2, no KL, the token-mean
objective (TRL `loss_type="dapo"`, `scale_rewards="group"`; ours trains every group), fp32
weights and AdamW moments, gradient checkpointing on, one forward for the 32 samples, one
intra-op thread (`OMP_NUM_THREADS=1`). A random model's rewards are all 0, so both sides do the
full work of a step with advantages 0 (neither skips it). Each variant runs in a process of its
own, in turns (ours LoRA, TRL LoRA, ours full, TRL full), `--rounds` times; its first step is
left out of the rate (loading, first-call costs); peak memory is the process's peak RSS. Ours
keeps what a job keeps (the newest version's weights written each step); TRL saves nothing.
Each step's generation is timed apart (ours: the trainer's `generate_s`; TRL: its `_generate`,
the completions without their scoring), so the table says which half of a step differs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.bench_real_shape import build_checkpoint, load_average
from benchmarks.results import Table
from benchmarks.trl_grpo import CLIP, TEMPERATURE, TRL_LOSS_TYPE, TRL_SCALE_REWARDS, trl_reward

PROMPTS, GROUP, MAX_TOKENS = 8, 4, 64
LR = {"LoRA": 1e-5, "full": 1e-6}  # the rate does not change a step's work
LORA = {"rank": 16, "alpha": 32.0, "target_modules": "all-linear"}
VARIANTS = ("ours LoRA", "TRL LoRA", "ours full", "TRL full")


def records(count: int) -> list[dict[str, str]]:
    from core_engine.rl.data.tasks import addition_records

    return addition_records(count, seed=1)


def ours(
    model: Path, run_dir: Path, lora: bool, steps: int
) -> tuple[list[float], list[float], float]:
    """Our synchronous trainer's seconds per step (rollout, update, the version's write), the
    generation's share of each, and its mean completion length."""
    from core_engine.rl.config import GRPOConfig
    from core_engine.rl.trainer.grpo import GRPOTrainer
    from core_engine.rl.trainer.records import TrainerHooks

    config = GRPOConfig.from_dict(
        dict(
            model=str(model),
            output_dir=str(run_dir),
            task="addition",
            steps=steps,
            batch_size=PROMPTS,
            group_size=GROUP,
            max_tokens=MAX_TOKENS,
            lr=LR["LoRA" if lora else "full"],
            temperature=TEMPERATURE,
            clip_eps=CLIP,
            kl_coef=0.0,
            drop_zero_variance_groups=False,
            gradient_checkpointing=True,
            optimizer_state_dtype="float32",
            keep_last=1,
            keep_every=0,
            resume=False,
            lora=dict(LORA) if lora else None,
        )
    )
    marks: list[float] = []
    generate_s: list[float] = []
    lengths: list[int] = []

    def on_step(record: Any) -> None:
        marks.append(time.perf_counter())
        generate_s.append(record.metrics["generate_s"])
        lengths.extend(len(ids) for ids in record.rollout.response_ids)

    trainer = GRPOTrainer(config, records(PROMPTS * steps), TrainerHooks(on_step=on_step))
    start = time.perf_counter()
    trainer.train()
    step_s = [b - a for a, b in zip([start, *marks], marks, strict=False)]
    return step_s, generate_s, sum(lengths) / len(lengths)


def trl(
    model: Path, run_dir: Path, lora: bool, steps: int
) -> tuple[list[float], list[float], float]:
    """TRL's GRPOTrainer's seconds per step (generation, reward, update), the generation's
    share of each, and its mean completion length."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from benchmarks.trl_grpo import StepClock

    config = TRLConfig(
        output_dir=str(run_dir),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        learning_rate=LR["LoRA" if lora else "full"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=TEMPERATURE,
        beta=0.0,
        epsilon=CLIP,
        loss_type=TRL_LOSS_TYPE,
        scale_rewards=TRL_SCALE_REWARDS,
        gradient_checkpointing=True,
        max_steps=steps,
        logging_strategy="no",
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    rows = [{"prompt": r["input"], "answer": r["output"]} for r in records(PROMPTS * steps)]
    peft_config = None
    if lora:
        peft_config = LoraConfig(
            r=LORA["rank"], lora_alpha=LORA["alpha"], target_modules=LORA["target_modules"]
        )
    clock = StepClock(lambda: None)
    trainer = TRLTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
        reward_funcs=trl_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model),
        peft_config=peft_config,
        callbacks=[clock],
    )
    generate_s: list[float] = []
    generate = trainer._generate

    def timed_generate(prompts: list) -> Any:
        start = time.perf_counter()
        out = generate(prompts)
        generate_s.append(time.perf_counter() - start)
        return out

    trainer._generate = timed_generate
    summary = trainer.train().metrics
    return clock.step_s, generate_s, float(summary["completions/mean_length"])


def run_variant(name: str, model: Path, run_dir: Path, steps: int) -> dict[str, Any]:
    """`name` in this process: its seconds per step and the process's peak RSS."""
    side, kind = name.split()
    train = ours if side == "ours" else trl
    step_s, generate_s, completion_tokens = train(model, run_dir, kind == "LoRA", steps)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "variant": name,
        "step_s": step_s,
        "generate_s": generate_s,
        "completion_tokens": completion_tokens,
        "peak_rss_bytes": peak_kib * 1024,
    }


def measure(root: Path, steps: int, rounds: int) -> list[dict[str, Any]]:
    """Every variant `rounds` times, in turns, each in a fresh process."""
    model = build_checkpoint(root / "qwen2.5-0.5b-shape")
    results = []
    for round_ in range(rounds):
        for name in VARIANTS:
            load = load_average()
            command = [sys.executable, __file__, "--variant", name, "--model", str(model)]
            command += ["--steps", str(steps), "--run-dir", str(root / f"{round_}-{name}")]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{name} failed:\n{done.stderr[-4000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result |= {"round": round_, "load_before": load, "load_after": load_average()}
            results.append(result)
            print(json.dumps(result), flush=True)
    return results


def table(results: list[dict[str, Any]]) -> Table:
    """Steps per minute (steps after the first, all rounds) and peak RSS, ours beside TRL's."""
    rows, rates = [], {}
    for name in VARIANTS:
        runs = [r for r in results if r["variant"] == name]
        timed = [s for r in runs for s in r["step_s"][1:]]
        generation = [s for r in runs for s in r["generate_s"][1:]]
        rates[name] = 60 * len(timed) / sum(timed)
        peak = max(r["peak_rss_bytes"] for r in runs) / 2**30
        tokens = sum(r["completion_tokens"] for r in runs) / len(runs)
        seconds = sum(timed) / len(timed)
        generate = sum(generation) / len(generation)
        rows.append(
            [
                name,
                f"{rates[name]:.2f}",
                f"{seconds:.1f}",
                f"{generate:.1f}",
                f"{seconds - generate:.1f}",
                f"{tokens:.1f}",
                f"{peak:.2f}",
            ]
        )
    for row in rows:
        side, kind = row[0].split()
        if side == "ours":
            row.append(f"{rates[row[0]] / rates[f'TRL {kind}']:.2f}x")
        else:
            row.append("")
    return Table(
        f"Qwen2.5-0.5B shape, {PROMPTS} prompts x G={GROUP} x {MAX_TOKENS} tokens, one thread",
        [
            "variant",
            "steps/min",
            "s/step",
            "generation s",
            "the rest s",
            "tokens/sample",
            "peak RSS GiB",
            "ours / TRL",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, help="run one variant here (a child)")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(run_variant(args.variant, args.model, args.run_dir, args.steps)))


if __name__ == "__main__":
    main()
