"""Multi-turn rollout throughput: our episode runner against Hugging Face `generate` that
renders and prefills the whole conversation again every turn, on 4-turn calculator episodes.

Both sides run the same random Qwen2-shaped checkpoint (fp32, one intra-op thread) with a
byte-level BPE tokenizer trained here and a Qwen-style chat template, the calculator
environment's opening (its system prompt, a word problem, the `calculate` tool) and the same
turns: every episode makes exactly 4 assistant turns of `--turn-tokens` sampled tokens
(`ignore_eos`; HF `min_new_tokens`), and after each of the first three the environment answers
with a `calculate` result as a "tool" message. Ours goes through the real environment sandbox
(a child process) and the engine's prefix cache; HF's environment runs in-process (no cost).
Runs alternate (ours, HF, HF, ours, ...); the median of `--repeats` is printed with the ratio
of assistant tokens per second, and the share of the prompt tokens of turns 2-4 that our engine
served from the episode's cache.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_episodes.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.results import BenchmarkRun, Table
from core_engine.engine import load_engine
from core_engine.prompts import encode_prompt, render_prompt
from core_engine.rl.data.word_problems import word_problem_records
from core_engine.rl.episodes.env_sandbox import EnvironmentSession
from core_engine.rl.episodes.environments import Calculator, calculate
from core_engine.rl.episodes.runner import EpisodeGenerator, EpisodeLimits
from core_engine.scheduler import EngineConfig
from core_engine.task import SamplingParams
from core_engine.toy import byte_bpe_tokenizer

TURNS = 4
ENVIRONMENT = "bench_four_turns"
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class FourTurns(Calculator):
    """The calculator's opening; its first three turns are answered with a tool result."""

    def __init__(self) -> None:
        super().__init__()
        self.turns = 0

    def step(self, turn: dict[str, Any]) -> dict[str, Any]:
        self.turns += 1
        if self.turns >= TURNS:
            return {"messages": [], "reward": 0.0, "done": True}
        result = calculate(f"({self.turns} + 41) * 12")
        return {"messages": [{"role": "tool", "content": result}], "reward": None, "done": False}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks per batch")
    parser.add_argument("--group", type=int, default=4, help="episodes per task")
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def build_checkpoint(root: Path, records: list[dict[str, str]]) -> Path:
    """A random Qwen2-shaped checkpoint (~13 M parameters) and its BPE tokenizer."""
    corpus = [r["input"] for r in records] + [r["output"] for r in records]
    corpus += ['<tool_call>{"name": "calculate", "arguments": {"expression": "3*4"}}</tool_call>']
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = byte_bpe_tokenizer(
        corpus, specials, 1024, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = QWEN_TEMPLATE
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(root, safe_serialization=True)
    tokenizer.save_pretrained(root)
    return root


def ours(engine: Any, session: EnvironmentSession, batch: dict, args: argparse.Namespace) -> dict:
    params = SamplingParams(temperature=1.0, max_tokens=args.turn_tokens, ignore_eos=True)
    limits = EpisodeLimits(TURNS, 2048)
    generator = EpisodeGenerator(engine, params, args.group, engine.tokenizer, session, limits)
    start = time.perf_counter()
    rollout = generator.generate(batch, seed=1)
    seconds = time.perf_counter() - start
    sampled = sum(sum(mask) for mask in rollout.loss_masks)
    fed = cached = 0
    for i, parts in enumerate(rollout.segments):
        prompt = len(rollout.prompt_ids[rollout.group_of(i)])
        for part in parts:
            if part["role"] == "assistant" and part["start"]:
                fed += prompt + part["start"]
                cached += part["cached"]
    assert set(rollout.episode_finishes) == {"done"}, rollout.episode_finishes
    return {"seconds": seconds, "tokens": sampled, "cache_share": cached / max(fed, 1)}


def hf_generate(hf: Any, tokenizer: Any, tasks: list[dict], args: argparse.Namespace) -> dict:
    """Each turn: every conversation rendered whole, tokenized, left-padded, prefilled."""
    tokenizer.padding_side = "left"
    episodes = []
    for task in tasks:
        for _ in range(args.group):
            env = FourTurns()
            episodes.append((env, env.reset(task)))
    start, sampled = time.perf_counter(), 0
    for _ in range(TURNS):
        texts = [render_prompt(tokenizer, messages, [env.tools[0]]) for env, messages in episodes]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = hf.generate(
                **batch,
                max_new_tokens=args.turn_tokens,
                min_new_tokens=args.turn_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, batch["input_ids"].shape[1] :]
        sampled += new.numel()
        for (env, messages), ids in zip(episodes, new, strict=True):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            messages += env.step({"content": text, "tool_calls": [], "text": text})["messages"]
    return {"seconds": time.perf_counter() - start, "tokens": sampled}


def main() -> None:
    args = parse_args()
    run = BenchmarkRun("bench_episodes")
    torch.set_num_threads(1)
    os.environ["RLWB_ENVIRONMENTS"] = f"{ENVIRONMENT}=benchmarks.bench_episodes:FourTurns"
    records = word_problem_records(args.tasks, 3)
    batch = {key: [r[key] for r in records] for key in ("instruction", "input", "output")}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp), word_problem_records(400, 1))
        engine = load_engine(path, EngineConfig(max_seq_len=2048, max_batch_size=64))
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        prompt = encode_prompt(tokenizer, render_prompt(tokenizer, FourTurns().reset(records[0])))
        print(f"{args.tasks} tasks x {args.group} episodes, {TURNS} turns of {args.turn_tokens}")
        print(f"tokens, opening prompt {len(prompt)} tokens, one thread")
        with EnvironmentSession(ENVIRONMENT) as session:
            ours(engine, session, batch, args)  # warm-up (the first pages, the child)
            runs: dict[str, list[dict]] = {"ours": [], "hf": []}
            for repeat in range(args.repeats):
                order = ("ours", "hf") if repeat % 2 == 0 else ("hf", "ours")
                for name in order:
                    if name == "ours":
                        engine.pool.strategy.invalidate()  # no pages left by the last repeat
                        runs[name].append(ours(engine, session, batch, args))
                    else:
                        runs[name].append(hf_generate(hf, tokenizer, records, args))
    rate = {
        name: statistics.median(r["tokens"] / r["seconds"] for r in results)
        for name, results in runs.items()
    }
    share = statistics.median(r["cache_share"] for r in runs["ours"])
    print(f"ours  {rate['ours']:8.1f} assistant tok/s   turns 2-4's prompts cached: {share:.0%}")
    print(f"HF    {rate['hf']:8.1f} assistant tok/s   (re-renders and re-prefills every turn)")
    print(f"ratio {rate['ours'] / rate['hf']:.2f}x (goal >= 3x)")
    if args.json:
        table = Table(
            f"{TURNS}-turn episodes, {args.tasks} tasks x {args.group}, {args.turn_tokens} tokens "
            f"a turn, median of {args.repeats}",
            ["runner", "assistant tok/s", "turns 2-4's prompt tokens from the cache"],
            [
                [
                    "ours (episode runner, environment in its sandbox child)",
                    f"{rate['ours']:.1f}",
                    f"{share:.0%}",
                ],
                ["HF `generate`, the conversation re-rendered every turn", f"{rate['hf']:.1f}", ""],
                ["ratio", f"{rate['ours'] / rate['hf']:.2f}x", ""],
            ],
        )
        run.write(args.json, {"rates": rate, "cache_share": share, "runs": runs}, [table])


if __name__ == "__main__":
    main()
