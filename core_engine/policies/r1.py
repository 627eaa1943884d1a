"""The R1 demo policy: a tiny Llama-style model that answers word problems in the R1 template,
`<think>worked lines</think><answer>N</answer>`, warmed up only until the template shows in
some samples, so the R1 recipe (the `math` + `format` rewards on `word_problems`) has mixed
rewards to learn from on a CPU.

Recipe: the calculator policy's pattern without the tool. A byte-level BPE tokenizer trained
here on the warm-up texts (numbers cut out, so every digit is a token), the chat roles and end
of turn (`<|im_end|>`, the EOS) special, the four tags single added tokens; a Qwen-style chat
template. Each warm-up example is a problem's user turn and, as the assistant's reply, its
worked lines (GSM8K's `<<...>>` annotations dropped) in `<think>` and the final number in
`<answer>`; the loss is on the reply and its EOS only. The warm-up stops as soon as the share of
held-out samples at temperature 1 that the `format` reward passes first reaches
`TARGET_FORMAT`: the template is there to be reinforced, the answers mostly wrong.

The policy ships in the repository (`R1_POLICY`); `python -m core_engine.policies.r1`
(`make r1-policy`) rebuilds it, and `r1_policy.json` beside the weights says how it was built
and what it scores.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from core_engine.assets import R1_POLICY
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
from core_engine.policies.word_chat import (
    VOCAB_SIZE,
    WarmupSettings,
    chat_config,
    chat_tokenizer,
    heldout_records,
    problem_stream,
)
from core_engine.prompts import encode_prompt, render_prompt
from core_engine.rl.data.tasks import HELDOUT_SEED
from core_engine.rl.rewards import DEFAULT_TAGS, format_pattern, regex_reward
from core_engine.rl.trainer.evaluate import EvalResult, evaluate
from core_engine.scheduler import InferenceScheduler
from core_engine.task import SamplingParams
from core_engine.weights import canonical_weights

TAGS = [f"<{t}>" for t in DEFAULT_TAGS] + [f"</{t}>" for t in DEFAULT_TAGS]
CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
INFO_FILE = "r1_policy.json"
TRAIN_SEED = 0  # the warm-up's problems and initial weights; never HELDOUT_SEED
TARGET_FORMAT = 0.3
MAX_WARMUP_STEPS = 2000
R1_SETTINGS = WarmupSettings(eval_every=10, eval_count=64)
MAX_TOKENS = 160  # a reply of 4 worked lines is ~110 tokens
CONTEXT = 320  # the longest prompt is ~90 tokens
SAMPLE_SEED = 0  # the held-out samples' seed: the stop is measured on the same draws each time
_ANNOTATION = re.compile(r"<<[^<>]*>>")


def reasoning(row: dict[str, str]) -> str:
    """A worked GSM8K-style row's reply in the R1 template: its worked lines, annotations
    dropped, in `<think>`, its final number in `<answer>`."""
    *lines, final = row["answer"].splitlines()
    think = "\n".join(_ANNOTATION.sub("", line) for line in lines)
    think_tag, answer_tag = DEFAULT_TAGS
    answer = final.removeprefix("#### ")
    return f"<{think_tag}>{think}</{think_tag}><{answer_tag}>{answer}</{answer_tag}>"


def r1_tokenizer(
    rows: Sequence[dict[str, str]], vocab_size: int = VOCAB_SIZE
) -> transformers.PreTrainedTokenizerFast:
    """The chat tokenizer (`word_chat.chat_tokenizer`) trained on the questions and replies of
    `rows`, the R1 tags single added tokens."""
    texts = [f"user\n{row['question']}\nassistant\n{reasoning(row)}\n" for row in rows]
    return chat_tokenizer(texts, TAGS, CHAT_TEMPLATE, vocab_size)


def training_example(tokenizer: Any, row: dict[str, str]) -> tuple[list[int], list[int]]:
    """A problem's prompt as the engine renders it, then its reply and EOS, with the loss mask
    (1 on the reply and EOS)."""
    prompt = encode_prompt(tokenizer, render_prompt(tokenizer, [_user(row)]))
    reply = [*encode_prompt(tokenizer, reasoning(row)), tokenizer.eos_token_id]
    return prompt + reply, [0] * len(prompt) + [1] * len(reply)


def _user(row: dict[str, str]) -> dict[str, str]:
    return {"role": "user", "content": row["question"]}


def format_samples(engine: InferenceScheduler, records: Sequence[dict[str, str]]) -> EvalResult:
    """One sample per record at temperature 1 (seed `SAMPLE_SEED`) of the engine's current
    weights, scored by the `format` reward: `mean_reward` is the share in the template."""
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS)
    return evaluate(engine, records, regex_reward(format_pattern()), params, seed=SAMPLE_SEED)


def answered_right(result: EvalResult) -> float:
    """The share of `result`'s samples whose answer tag holds the reference exactly."""
    _, answer_tag = DEFAULT_TAGS
    tag = re.compile(rf"<{answer_tag}>(.*?)</{answer_tag}>", re.S)
    right = [
        bool((m := tag.findall(c)) and m[-1].strip() == r)
        for c, r in zip(result.rollout.completions, result.rollout.references, strict=True)
    ]
    return sum(right) / len(right) if right else 0.0


def warm_up(
    model: CausalLM,
    tokenizer: Any,
    seed: int,
    target: float,
    max_steps: int,
    settings: WarmupSettings,
    log: Callable[[str], None] | None = None,
) -> tuple[WarmupResult, float]:
    """Supervised steps on the worked replies until the held-out samples' format share (every
    `settings.eval_every` steps) first reaches `target`, or `max_steps` are done; returns the
    result (its `accuracy` the format share) and the share answered right."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, betas=(0.9, settings.beta2), weight_decay=0.0
    )
    heldout = heldout_records(settings.eval_count)
    rows = problem_stream(seed, {r["input"] for r in heldout})
    engine = eval_engine(model, tokenizer, settings.eval_count)
    start, step, share, right, loss = time.perf_counter(), 0, 0.0, 0.0, float("nan")
    while share < target and step < max_steps:
        examples = [training_example(tokenizer, next(rows)) for _ in range(settings.batch_size)]
        batch = supervised_batch(examples, tokenizer.pad_token_id)
        loss = supervised_step(model, optimizer, *batch)
        step += 1
        if step % settings.eval_every == 0 or step == max_steps:
            engine.update_weights(canonical_weights(model), step)
            result = format_samples(engine, heldout)
            share, right = result.mean_reward, answered_right(result)
            if log:
                log(f"warm-up step {step}: loss {loss:.3f}, format {share:.3f}, right {right:.3f}")
    seconds = round(time.perf_counter() - start, 1)
    return WarmupResult(seed, step, loss, share, seconds), right


def build_r1_policy(
    path: str | Path,
    seed: int = TRAIN_SEED,
    target_format: float = TARGET_FORMAT,
    max_steps: int = MAX_WARMUP_STEPS,
    settings: WarmupSettings | None = None,
    tokenizer_rows: int = 2000,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Train the tokenizer on `tokenizer_rows` problems, warm the policy up until the format
    share of held-out samples first reaches `target_format` (or `max_steps` are done) and save
    it to `path`, with `r1_policy.json`. Reuses an existing checkpoint there."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    settings = settings or R1_SETTINGS
    heldout = {r["input"] for r in heldout_records(settings.eval_count)}
    stream = problem_stream(seed, heldout)
    tokenizer = r1_tokenizer([next(stream) for _ in range(tokenizer_rows)])
    config = chat_config(tokenizer, CONTEXT)
    model = initial_model(config, seed)
    result, right = warm_up(model, tokenizer, seed, target_format, max_steps, settings, log)
    info = build_record(
        result,
        target_format,
        settings,
        "core_engine.policies.r1.build_r1_policy",
        model,
        heldout={
            "seed": HELDOUT_SEED,
            "prompts": settings.eval_count,
            "metric": "format reward of one sample each at temperature 1",
            "sample_seed": SAMPLE_SEED,
            "max_tokens": MAX_TOKENS,
            "answered_right": right,
        },
        tokenizer={"rows": tokenizer_rows, "vocab_size": len(tokenizer)},
        parameters=sum(p.numel() for p in model.parameters()),
    )
    return save_policy(path, model.eval(), config, tokenizer, (INFO_FILE, info))


def main(argv: Sequence[str] | None = None) -> None:
    """Rebuild the R1 demo policy (by default the shipped one, replaced)."""
    rebuild_main(main.__doc__, R1_POLICY, build_r1_policy, INFO_FILE, argv)


if __name__ == "__main__":
    main()
