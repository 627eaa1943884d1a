"""The demo policy: a tiny Llama-style model warmed up on 3-digit addition until GRPO can take over.

Recipe (RL notes, appendix): a character vocabulary (digits, `+`, `=` and the special tokens: 19
tokens), hidden 128, 2 layers, 4 heads, MLP 512, tied embeddings (527k parameters); supervised
teacher forcing on `a+b=sum</s>` (loss on the answer and EOS only), AdamW lr 3e-3 (beta2 0.98),
batch 256, stopped as soon as greedy held-out accuracy first reaches ~15-20%. From much lower,
GRPO barely learns (almost no group has mixed rewards); from much higher there is little left
for it to show.

Seeds differ in when the accuracy jumps, and that decides whether GRPO can take over (GRPO
lr 3e-4, 16 x 8): warm-ups that reached 18% within 340-500 steps gave policies GRPO lifted by
20-35 points in 1-2 minutes; those that needed 530 steps or more gave policies it left flat or
made worse (the same with a lower lr, lr warm-up, a per-digit reward, temperature 1.3). When
the jump comes also depends on the CPU's rounding (the warm-up is chaotic; docs/benchmarks.md),
so seeds are tried in the order `DEMO_SEEDS`, and one that has not reached the target within
`WarmupSettings.seed_patience` steps gives way to the next, within the overall step budget.

Because of that, the policy is built once and shipped in the repository (`SHIPPED_POLICY`,
~2 MB), so every machine starts its first job from the same weights at once. Rebuild it with
`python -m core_engine.policies.demo` (`make demo-policy`); `demo_policy.json` beside the
weights says how it was built and what it scores.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from core_engine.assets import SHIPPED_POLICY
from core_engine.model import CausalLM
from core_engine.policies.warmup import (
    WarmupResult,
    build_record,
    eval_engine,
    initial_model,
    rebuild_main,
    save_policy,
    supervised_batch,
    supervised_step,
)
from core_engine.rl.data.tasks import HELDOUT_SEED, addition_records
from core_engine.rl.rewards import exact_match
from core_engine.rl.trainer.evaluate import evaluate
from core_engine.scheduler import InferenceScheduler
from core_engine.task import SamplingParams
from core_engine.toy import char_tokenizer, tiny_config
from core_engine.weights import canonical_weights

DEMO_ALPHABET = "0123456789+="
# Renders only the user turns: the prompt is exactly `a+b=`.
DEMO_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
)
INFO_FILE = "demo_policy.json"
GREEDY = SamplingParams(temperature=0, max_tokens=6)
TARGET_ACCURACY = 0.18
MAX_WARMUP_STEPS = 3000  # the budget when the target is not reached first
# The order seeds are tried in: first those whose warm-ups GRPO took over from on both machines
# measured (docs/benchmarks.md: seed 2 reached 18% in 440 and 500 steps; 6 in 380 on one, 0 in 340
# on the other), then the rest. Which seed is fast depends on the CPU's rounding, not only the seed.
DEMO_SEEDS = (2, 6, 0, 1, 3, 4, 5, 7, 8, 9)


@dataclass(frozen=True)
class WarmupSettings:
    lr: float = 3e-3
    beta2: float = 0.98  # with the default 0.999 the jump comes hundreds of steps later
    batch_size: int = 256
    eval_every: int = 10
    eval_count: int = 1000
    seed_patience: int = 550  # steps a seed gets to reach the target before the next is tried


def demo_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Digits, `+`, `=` and the special tokens; the chat template renders the bare user text."""
    tokenizer = char_tokenizer(DEMO_ALPHABET)
    tokenizer.chat_template = DEMO_CHAT_TEMPLATE
    return tokenizer


def demo_config(vocab_size: int) -> transformers.LlamaConfig:
    """Llama-style hidden 128, 2 layers, 4 heads (no GQA), MLP 512, tied embeddings."""
    return tiny_config(
        "llama",
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=32,
        initializer_range=0.02,
        tie_word_embeddings=True,
    )


def heldout_records(count: int = 1000) -> list[dict[str, str]]:
    """The fixed held-out problems (seed 2) that the warm-up stops on and the demo scores."""
    return addition_records(count, seed=HELDOUT_SEED)


def greedy_accuracy(engine: InferenceScheduler, records: Sequence[dict[str, str]]) -> float:
    """Exact-match accuracy of greedy answers from the engine's current weights."""
    return evaluate(engine, records, exact_match, GREEDY).mean_reward


def problem_stream(seed: int, exclude: set[str]):
    """Endless seeded `(prompt, answer)` pairs of 3-digit addition, never a held-out prompt."""
    rng = random.Random(seed)
    while True:
        a, b = rng.randrange(1000), rng.randrange(1000)
        prompt = f"{a}+{b}="
        if prompt not in exclude:
            yield prompt, str(a + b)


def addition_batch(
    problems: Sequence[tuple[str, str]], tokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `prompt answer </s>` ids and next-token targets on the answer and EOS
    only (the prompt is never a training target)."""
    prompts, answers = zip(*problems, strict=True)
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(list(answers), add_special_tokens=False)["input_ids"]
    examples = [
        (p + a + [tokenizer.eos_token_id], [0] * len(p) + [1] * (len(a) + 1))
        for p, a in zip(prompt_ids, answer_ids, strict=True)
    ]
    return supervised_batch(examples, tokenizer.pad_token_id)


def warm_up(
    model: CausalLM,
    tokenizer,
    seed: int,
    target_accuracy: float,
    max_minutes: float | None,
    max_steps: int,
    settings: WarmupSettings,
    log: Callable[[str], None] | None = None,
) -> WarmupResult:
    """Supervised steps until held-out greedy accuracy first reaches the target, evaluated
    every `settings.eval_every` steps through our engine, or until a budget runs out."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, betas=(0.9, settings.beta2), weight_decay=0.0
    )
    heldout = heldout_records(settings.eval_count)
    problems = problem_stream(seed, {r["input"] for r in heldout})
    engine = eval_engine(model, tokenizer, settings.eval_count)
    start, step, accuracy, loss = time.perf_counter(), 0, 0.0, float("nan")
    while accuracy < target_accuracy:
        minutes = (time.perf_counter() - start) / 60
        if step >= max_steps or (max_minutes is not None and minutes >= max_minutes):
            break
        batch = [next(problems) for _ in range(settings.batch_size)]
        loss = supervised_step(model, optimizer, *addition_batch(batch, tokenizer))
        step += 1
        if step % settings.eval_every == 0 or step == max_steps:
            engine.update_weights(canonical_weights(model), step)
            accuracy = greedy_accuracy(engine, heldout)
            if log:
                log(
                    f"warm-up seed {seed}, step {step}: loss {loss:.3f}, "
                    f"held-out accuracy {accuracy:.3f}"
                )
    return WarmupResult(seed, step, loss, accuracy, round(time.perf_counter() - start, 1))


def build_demo_policy(
    path: str | Path,
    seeds: Sequence[int] = DEMO_SEEDS,
    target_accuracy: float = TARGET_ACCURACY,
    max_minutes: float | None = None,
    max_steps: int = MAX_WARMUP_STEPS,
    settings: WarmupSettings | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Warm up the demo policy until held-out greedy accuracy first reaches `target_accuracy`
    and save it to `path`; `demo_policy.json` there says how it went. Each of `seeds` in turn
    gets `settings.seed_patience` steps, then the next one starts afresh, until the seeds, the
    step budget (`max_steps`, all seeds together) or an optional time budget run out: then the
    last attempt is saved, short of the target. Reuses an existing checkpoint at `path`.
    Without `max_minutes` the result depends on the seed only, not on how busy the machine
    is (a time budget on a loaded machine stops early, with a weaker policy)."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    if not seeds:
        raise ValueError("build_demo_policy needs at least one seed")
    settings = settings or WarmupSettings()
    tokenizer = demo_tokenizer()
    start, attempts = time.perf_counter(), []
    for seed in seeds:
        remaining = max_steps - sum(a.steps for a in attempts)
        minutes_left = None
        if max_minutes is not None:
            minutes_left = max_minutes - (time.perf_counter() - start) / 60
        config = demo_config(len(tokenizer))
        model = initial_model(config, seed)
        budget = min(settings.seed_patience, remaining)
        result = warm_up(
            model, tokenizer, seed, target_accuracy, minutes_left, budget, settings, log
        )
        attempts.append(result)
        if result.accuracy >= target_accuracy or result.steps < budget or budget == remaining:
            break
        if log and seed != seeds[-1]:
            log(f"seed {seed} short of {target_accuracy:.0%} after {budget} steps: next seed")
    builder = "core_engine.policies.demo.build_demo_policy"
    info = build_record(
        result,
        target_accuracy,
        settings,
        builder,
        model,
        seeds_tried=[a.seed for a in attempts],
        total_steps=sum(a.steps for a in attempts),
        total_seconds=round(time.perf_counter() - start, 1),
        heldout={"seed": HELDOUT_SEED, "prompts": settings.eval_count, "metric": "greedy"},
    )
    return save_policy(path, model.eval(), config, tokenizer, (INFO_FILE, info))


def main(argv: Sequence[str] | None = None) -> None:
    """Rebuild the demo policy (by default the shipped one, replaced)."""
    rebuild_main(main.__doc__, SHIPPED_POLICY, build_demo_policy, INFO_FILE, argv)


if __name__ == "__main__":
    main()
