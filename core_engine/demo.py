"""A short engine demo: build a small checkpoint, generate, update the policy, generate again.

Run with `python -m core_engine.demo [--model DIR]`. Without `--model` a small random
Qwen2-shaped checkpoint with a character tokenizer is built once under `--data-dir` (`data`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from core_engine.task import KV_STRATEGIES, SamplingParams

if TYPE_CHECKING:  # the engine loads torch: imported once the arguments are parsed
    from core_engine.scheduler import InferenceScheduler

PROMPTS = ["12+7=", "reverse: abc", "hello", "The capital of France is"]


def demo_checkpoint(data_dir: Path) -> Path:
    from core_engine.toy import save_tiny_checkpoint

    path = data_dir / "demo-model"
    if not (path / "config.json").exists():
        save_tiny_checkpoint(path, arch="qwen2", hidden_size=128, intermediate_size=256)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, help="local Hugging Face checkpoint directory")
    parser.add_argument("--kv-strategy", default="paged", choices=KV_STRATEGIES)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument(
        "--data-dir", type=Path, default=Path("data"), help="where the small checkpoint is built"
    )
    args = parser.parse_args(argv)
    import torch

    from core_engine.engine import load_engine
    from core_engine.prompts import chat_prompt_ids
    from core_engine.scheduler import EngineConfig
    from core_engine.weights import canonical_weights, weights_checksum

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model_path = args.model or demo_checkpoint(args.data_dir)
    engine = load_engine(model_path, EngineConfig(kv_strategy=args.kv_strategy, max_batch_size=16))
    tok = engine.tokenizer
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": p}]) for p in PROMPTS]
    print(f"model {model_path} | KV {args.kv_strategy} | policy version {engine.version}")
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens, seed=0)
    _run(engine, prompts, params, samples_per_prompt=1)
    _run(engine, prompts, params, samples_per_prompt=4)
    bad = engine.run_batch([[], prompts[0]], SamplingParams(max_tokens=0))
    print("bad input ->", [(r.finish_reason.value, r.error.code.value) for r in bad])
    gen = torch.Generator().manual_seed(1)
    new = {
        k: v.detach() + 0.01 * torch.randn(v.shape, generator=gen)
        for k, v in canonical_weights(engine.model).items()
    }
    ack = engine.update_weights(new, engine.version + 1)
    print(
        f"update -> version {ack.version}, prefix entries invalidated "
        f"{ack.prefix_entries_invalidated}, checksum {ack.checksum[:16]}… "
        f"(trainer side {weights_checksum(new)[:16]}…), {ack.seconds * 1e3:.1f} ms"
    )
    _run(engine, prompts, params, samples_per_prompt=1)
    print("engine:", {k: v for k, v in engine.stats().items() if not k.startswith("median")})


def _run(engine: InferenceScheduler, prompts, params: SamplingParams, samples_per_prompt: int):
    start = time.perf_counter()
    results = engine.run_batch(prompts, params, samples_per_prompt=samples_per_prompt)
    elapsed = time.perf_counter() - start
    tokens = sum(len(r.output_ids) for r in results)
    print(
        f"\n{len(results)} requests (G={samples_per_prompt}): {tokens} tokens in "
        f"{elapsed:.2f} s = {tokens / elapsed:.0f} tok/s"
    )
    for r in results[:: max(1, samples_per_prompt)]:
        print(
            f"  v{r.policy_version} {r.finish_reason.value:<6} "
            f"cached={r.num_cached_prompt_tokens:<3} {r.text!r}"
        )


if __name__ == "__main__":
    main()
