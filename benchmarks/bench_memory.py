"""Trainer memory for one GRPO step at Qwen's real 151,936-token vocabulary: ours against TRL.

A small Qwen2-shaped policy (hidden 64, 2 layers, tied embeddings) keeps the real vocabulary,
so the log-softmax dominates memory as it does for 0.5B-1.5B checkpoints. One step = the
train phase of GRPO on given samples (16-token prompts, responses of fixed length, random
advantages and behaviour log-probs): log-probs, loss, backward, gradient clip, AdamW step.
Generation is not part of it (its memory is the engine's KV pool, sized separately).

- ours: `accumulate_gradients` with a token budget per micro-batch (`--budget`) and
  `--chunk-rows` rows of vocabulary at a time;
- TRL 1.16 `GRPOTrainer.compute_loss` (loss_type "dapo", no KL), one micro-batch of
  `per_device_train_batch_size` samples at a time, chosen to hold the same token budget.

Each point runs in its own process. Reported per point: the peak of live tensor bytes (every
tensor created during the step, counted by a dispatch mode until its storage dies, on top of the
weights), the rows of the largest tensor whose last dimension is the vocabulary, and the
process's peak RSS.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_memory.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.results import BenchmarkRun, Table

VOCAB, PROMPT = 151_936, 16
GRID = [(s, n) for n in (64, 256) for s in (32, 64, 128, 256)]
MIXES = [(1, 4096 - PROMPT), (16, 256 - PROMPT), (64, 64 - PROMPT)]  # 4,096 tokens each


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of tensor storage created under the mode and still alive; their peak; and the
    rows of the largest non-view tensor whose last dimension is `vocab`."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.live, self.peak, self.vocab_rows = vocab, 0, 0, 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func._schema.is_mutable:
            return out
        for t in out if isinstance(out, tuple | list) else [out]:
            # A sparse tensor's indices and values are dense tensors, counted when made.
            if isinstance(t, torch.Tensor) and not t.is_meta and t.layout == torch.strided:
                self._track(t)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        if tensor.dim() and tensor.shape[-1] == self.vocab:
            self.vocab_rows = max(self.vocab_rows, tensor.numel() // self.vocab)
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._seen or not storage.nbytes():
            return
        self._seen.add(key)
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, key, storage.nbytes())

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes


def hf_config():
    from core_engine.toy import tiny_config

    return tiny_config(
        "qwen2",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )


def batch(samples: int, length: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(samples * 1000 + length)
    return {
        "prompt": torch.randint(3, VOCAB, (samples, PROMPT), generator=gen),
        "response": torch.randint(3, VOCAB, (samples, length), generator=gen),
        "behaviour": -torch.rand(samples, length, generator=gen) * 12,
        "advantages": torch.randn(samples, generator=gen),
    }


def ours_step(samples: int, length: int, budget: int, chunk_rows: int) -> LiveTensorBytes:
    from core_engine.model import build_model
    from core_engine.rl.objective.update import TrainSample, UpdateSettings, accumulate_gradients

    model = build_model(hf_config()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    data = batch(samples, length)
    rows = [
        TrainSample(p.tolist(), r.tolist(), b.tolist(), float(a))
        for p, r, b, a in zip(*data.values(), strict=True)
    ]
    settings = UpdateSettings(1.0, 0.2, 0.0, budget, chunk_rows)
    with LiveTensorBytes(VOCAB) as probe:
        accumulate_gradients(model, rows, settings)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return probe


def trl_step(samples: int, length: int, budget: int, chunk_rows: int) -> LiveTensorBytes:
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = transformers.AutoModelForCausalLM.from_config(hf_config())
    per_device = max(2, budget // (PROMPT + length) // 2 * 2)
    args = GRPOConfig(
        output_dir="/tmp/bench-memory-trl",
        per_device_train_batch_size=per_device,
        num_generations=2,
        max_completion_length=length,
        beta=0.0,
        loss_type="dapo",
        use_cpu=True,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a"] * 8}),
        processing_class=_trl_tokenizer(),
    )
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop
    data = batch(samples, length)
    tokens = torch.tensor(float(samples * length))
    with LiveTensorBytes(VOCAB) as probe:
        for start in range(0, samples, per_device):
            part = slice(start, start + per_device)
            inputs = {
                "prompt_ids": data["prompt"][part],
                "prompt_mask": torch.ones_like(data["prompt"][part]),
                "completion_ids": data["response"][part],
                "completion_mask": torch.ones_like(data["response"][part]),
                "advantages": data["advantages"][part],
                "old_per_token_logps": data["behaviour"][part],
                "num_items_in_batch": tokens,
            }
            trainer.compute_loss(trainer.model, inputs).backward()
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    return probe


def _trl_tokenizer():
    from core_engine.toy import char_tokenizer

    return char_tokenizer("abc")


def measure_one(trainer: str, samples: int, length: int, budget: int, chunk_rows: int) -> dict:
    torch.set_num_threads(1)
    step = ours_step if trainer == "ours" else trl_step
    probe = step(samples, length, budget, chunk_rows)
    return {
        "trainer": trainer,
        "samples": samples,
        "response": length,
        "peak_tensor_mb": probe.peak / 2**20,
        "vocab_rows": probe.vocab_rows,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_point(trainer: str, samples: int, length: int, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--one", trainer, str(samples), str(length)]
    command += ["--budget", str(args.budget), "--chunk-rows", str(args.chunk_rows)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        return {
            "trainer": trainer,
            "samples": samples,
            "response": length,
            "error": done.stderr.strip().splitlines()[-1],
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def trl_available() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


COLUMNS = [
    "trainer",
    "samples x response tokens",
    "peak tensor MiB",
    "vocab rows",
    "peak RSS MiB",
    "ours / TRL",
]


def cells(result: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """One point's row of the table (`COLUMNS`)."""
    shape = f"{result['samples']} x {result['response']}"
    if "error" in result:
        return [result["trainer"], shape, f"error: {result['error'][:60]}", "", "", ""]
    ratio = ""
    if baseline and "error" not in baseline:
        ratio = f"{result['peak_tensor_mb'] / baseline['peak_tensor_mb']:.2f}"
    return [
        result["trainer"],
        shape,
        f"{result['peak_tensor_mb']:,.0f}",
        str(result["vocab_rows"] or "none"),
        f"{result['peak_rss_mb']:,.0f}",
        ratio,
    ]


def row(result: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    return "| " + " | ".join(cells(result, baseline)) + " |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--chunk-rows", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="fewer points")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=3, metavar=("TRAINER", "SAMPLES", "LENGTH"))
    args = parser.parse_args(argv)
    if args.one:
        trainer, samples, length = args.one[0], int(args.one[1]), int(args.one[2])
        print(json.dumps(measure_one(trainer, samples, length, args.budget, args.chunk_rows)))
        return
    run = BenchmarkRun("bench_memory")
    grid = GRID[:2] + GRID[4:6] if args.quick else GRID
    with_trl = trl_available()
    results = {"grid": [], "mixes": [], "largest": None}
    print(
        "| trainer | samples x response tokens | peak tensor MiB | vocab rows | peak RSS MiB "
        "| ours / TRL |\n|---|---|---|---|---|---|"
    )
    for samples, length in grid:
        baseline = run_point("trl", samples, length, args) if with_trl else None
        ours = run_point("ours", samples, length, args)
        results["grid"].append({"ours": ours, "trl": baseline})
        if baseline:
            print(row(baseline, None))
        print(row(ours, baseline), flush=True)
    print("\nFixed budget of 4,096 tokens, different mixes (ours):")
    for samples, length in MIXES:
        result = run_point("ours", samples, length, args)
        results["mixes"].append(result)
        print(row(result, None), flush=True)
    peaks = [r["peak_tensor_mb"] for r in results["mixes"] if "error" not in r]
    if peaks:
        print(f"spread of peaks across mixes: {max(peaks) / min(peaks) - 1:.1%} (target <= 10%)")
    largest = run_point("ours", 128, 320 - PROMPT, args)
    results["largest"] = largest
    print("\n128 samples x 320 tokens (target: peak RSS <= 3 GB):")
    print(row(largest, None))
    if args.json:
        grid_rows = []
        for point in results["grid"]:
            if point["trl"]:
                grid_rows.append(cells(point["trl"], None))
            grid_rows.append(cells(point["ours"], point["trl"]))
        tables = [
            Table(f"One train phase, {args.budget:,}-token micro-batches", COLUMNS, grid_rows),
            Table(
                f"A fixed budget of {args.budget:,} tokens, different mixes (ours)",
                COLUMNS,
                [cells(r, None) for r in results["mixes"]],
            ),
            Table("128 samples x 320 tokens (ours)", COLUMNS, [cells(largest, None)]),
        ]
        run.write(args.json, results, tables)


if __name__ == "__main__":
    main()
