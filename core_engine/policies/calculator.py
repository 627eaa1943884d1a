"""The calculator demo policy: a tiny Llama-style model that solves word problems by calling the
`calculator` environment's `calculate` tool, warmed up until agentic GRPO can take over.

Recipe: a byte-level BPE tokenizer trained here on the warm-up conversations, with the chat
roles and the end of turn (`<|im_end|>`, the EOS) as special tokens and `<tool_call>` /
`</tool_call>` as plain added tokens (the episode runner decodes turns without special tokens);
a Qwen/Hermes-style chat template. Each warm-up conversation is what the environment itself
gives and answers (`Calculator`): its opening messages, one assistant turn per worked line of
the problem calling `calculate` with that line's expression (the `<<...>>` annotations, a
line's earlier results written as their expressions), the tool's result, and a final
`<answer>N</answer>` turn. Tokens are laid out as the episode runner lays out an episode
(`training_example`), and the loss is on the assistant tokens only. The warm-up stops as soon
as greedy held-out accuracy, measured by running real episodes (`episode_accuracy`), first
reaches `TARGET_ACCURACY`, so GRPO starts with mixed rewards.

The policy ships in the repository (`CALCULATOR_POLICY`); `python -m
core_engine.policies.calculator` (`make calculator-policy`) rebuilds it, and
`calculator_policy.json` beside the weights says how it was built and what it scores.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

import torch
import transformers

from core_engine.assets import CALCULATOR_POLICY
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
from core_engine.rl.episodes.env_sandbox import EnvironmentSession
from core_engine.rl.episodes.environments import Calculator
from core_engine.rl.episodes.observations import observation_ids
from core_engine.rl.episodes.runner import EpisodeLimits
from core_engine.rl.rewards import exact_match
from core_engine.rl.trainer.evaluate import EvalResult, evaluate
from core_engine.scheduler import InferenceScheduler
from core_engine.task import SamplingParams
from core_engine.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from core_engine.weights import canonical_weights

ENVIRONMENT = "calculator"
# Qwen/Hermes-style: `<|im_start|>role\ncontent<|im_end|>\n`; with `tools=` a line naming
# them ends the system message; an assistant message's OpenAI `tool_calls` are written as
# `<tool_call>{"name": ..., "arguments": ...}</tool_call>` after its content.
CHAT_TEMPLATE = (
    "{%- set names = (tools or []) | map(attribute='function') | map(attribute='name') "
    "| join(', ') %}"
    "{%- if names and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nTools: ' + names + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['content'] %}{{ m['content'] }}{% endif %}"
    "{%- if loop.first and m['role'] == 'system' and names %}{{ '\\nTools: ' + names }}{% endif %}"
    "{%- for call in m['tool_calls'] or [] %}"
    "{%- set f = call['function'] or call %}"
    "{{ '<tool_call>{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{ f['arguments'] }}"
    "{%- else %}{{ f['arguments'] | tojson }}{% endif %}"
    "{{ '}</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
INFO_FILE = "calculator_policy.json"
TRAIN_SEED = 0  # the warm-up's problems and initial weights; never HELDOUT_SEED
TARGET_ACCURACY = 0.3
MAX_WARMUP_STEPS = 3000
# Episodes: a problem has 2-4 worked lines, so at most 4 tool turns and the answer.
MAX_TURNS = 5
TURN_TOKENS = 48
CONTEXT = 384  # max_position_embeddings, and the episodes' max_episode_tokens
EPISODE_LIMITS = EpisodeLimits(MAX_TURNS, CONTEXT)
_ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")


def tool_expressions(answer: str) -> list[str]:
    """One `calculate` expression per worked line of a GSM8K-style answer: the line's last
    `<<expr=result>>` annotation, its earlier results written as their expressions
    (`<<4*4=16>> ... <<23+16=39>>` -> `23+4*4`)."""
    expressions = []
    for line in answer.splitlines():
        annotations = _ANNOTATION.findall(line)
        if not annotations:
            continue
        expression = annotations[-1][0]
        for inner, result in reversed(annotations[:-1]):  # the rightmost use of the result
            head, found, tail = expression.rpartition(result)
            if found:
                expression = f"{head}{inner}{tail}"
        expressions.append(expression)
    return expressions


def tool_call_text(expression: str) -> str:
    """An assistant turn calling `calculate` (Hermes/Qwen format)."""
    call = {"name": "calculate", "arguments": {"expression": expression}}
    return f"{TOOL_CALL_OPEN}{json.dumps(call)}{TOOL_CALL_CLOSE}"


def conversation(row: dict[str, str]) -> list[dict[str, str]]:
    """A worked GSM8K-style row as the calculator environment plays it: its opening messages,
    a tool call per worked line and the tool's reply, then the final answer (reward 1)."""
    env = Calculator()
    answer = row["answer"].rsplit("#### ", 1)[1]
    messages = env.reset({"instruction": "", "input": row["question"], "output": answer})
    for expression in tool_expressions(row["answer"]):
        call = {"name": "calculate", "arguments": {"expression": expression}}
        reply = env.step({"content": "", "tool_calls": [call]})
        messages += [{"role": "assistant", "content": tool_call_text(expression)}]
        messages += reply["messages"]
    final = f"<answer>{answer}</answer>"
    if env.step({"content": final, "tool_calls": []})["reward"] != 1.0:
        raise ValueError(f"the worked answer does not solve {row['question']!r}")
    return [*messages, {"role": "assistant", "content": final}]


def calculator_tokenizer(
    rows: Sequence[dict[str, str]], vocab_size: int = VOCAB_SIZE
) -> transformers.PreTrainedTokenizerFast:
    """The chat tokenizer (`word_chat.chat_tokenizer`) trained on the conversations of `rows`
    (each message with its role), the tool-call tags single added tokens: every digit a token
    of its own, written the same in a question, a call and a result, which the policy copies
    between."""
    tools = "\nTools: " + Calculator().tools[0]["function"]["name"]  # the template's line
    texts = [
        "".join(f"{m['role']}\n{m['content']}\n" for m in conversation(row)) + tools for row in rows
    ]
    return chat_tokenizer(texts, [TOOL_CALL_OPEN, TOOL_CALL_CLOSE], CHAT_TEMPLATE, vocab_size)


def training_example(
    tokenizer: Any, messages: Sequence[dict[str, str]], tools: Sequence[dict]
) -> tuple[list[int], list[int]]:
    """A conversation's token ids laid out as the episode runner lays out an episode (the
    opening prompt, each assistant turn's content and end-of-turn token, the template's
    tokens between turns) and its loss mask (1 on the assistant tokens)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    opening = messages[:first]
    ids = encode_prompt(tokenizer, render_prompt(tokenizer, opening, tools))
    mask = [0] * len(ids)
    for assistant, group in groupby(messages[first:], lambda m: m["role"] == "assistant"):
        if assistant:
            [turn] = group  # each turn is answered before the next
            part = [*encode_prompt(tokenizer, turn["content"]), tokenizer.eos_token_id]
        else:
            part = observation_ids(tokenizer, opening, list(group), tools, tokenizer.eos_token_id)
        ids += part
        mask += [int(assistant)] * len(part)
    return ids, mask


def episode_accuracy(
    engine: InferenceScheduler,
    records: Sequence[dict[str, str]],
    session: Any,
    limits: EpisodeLimits = EPISODE_LIMITS,
    max_tokens: int = TURN_TOKENS,
) -> EvalResult:
    """Greedy (T=0) episodes of the engine's current weights, one per record, against
    `session` (an `EnvironmentSession` of the calculator): `mean_reward` is the share answered
    right, `rollout` holds the episodes."""
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    # the environment scores the episodes: `exact_match` stands in for the unused reward
    return evaluate(engine, records, exact_match, greedy, episodes=(session, limits))


def warm_up(
    model: CausalLM,
    tokenizer: Any,
    seed: int,
    target_accuracy: float,
    max_steps: int,
    settings: WarmupSettings,
    log: Callable[[str], None] | None = None,
) -> WarmupResult:
    """Supervised steps on the worked conversations until greedy held-out episode accuracy
    (every `settings.eval_every` steps) first reaches the target, or `max_steps` are done."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, betas=(0.9, settings.beta2), weight_decay=0.0
    )
    heldout = heldout_records(settings.eval_count)
    rows = problem_stream(seed, {r["input"] for r in heldout})
    tools = Calculator().tools
    engine = eval_engine(model, tokenizer, settings.eval_count)
    start, step, accuracy, loss = time.perf_counter(), 0, 0.0, float("nan")
    with EnvironmentSession(ENVIRONMENT) as session:
        while accuracy < target_accuracy and step < max_steps:
            examples = [
                training_example(tokenizer, conversation(next(rows)), tools)
                for _ in range(settings.batch_size)
            ]
            batch = supervised_batch(examples, tokenizer.pad_token_id)
            loss = supervised_step(model, optimizer, *batch)
            step += 1
            if step % settings.eval_every == 0 or step == max_steps:
                engine.update_weights(canonical_weights(model), step)
                accuracy = episode_accuracy(engine, heldout, session).mean_reward
                if log:
                    log(f"warm-up step {step}: loss {loss:.3f}, held-out accuracy {accuracy:.3f}")
    return WarmupResult(seed, step, loss, accuracy, round(time.perf_counter() - start, 1))


def build_calculator_policy(
    path: str | Path,
    seed: int = TRAIN_SEED,
    target_accuracy: float = TARGET_ACCURACY,
    max_steps: int = MAX_WARMUP_STEPS,
    settings: WarmupSettings | None = None,
    tokenizer_rows: int = 2000,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Train the tokenizer on `tokenizer_rows` problems, warm the policy up until greedy
    held-out episode accuracy first reaches `target_accuracy` (or `max_steps` are done) and
    save it to `path`, with `calculator_policy.json`. Reuses an existing checkpoint there."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    settings = settings or WarmupSettings()
    heldout = {r["input"] for r in heldout_records(settings.eval_count)}
    stream = problem_stream(seed, heldout)
    tokenizer = calculator_tokenizer([next(stream) for _ in range(tokenizer_rows)])
    config = chat_config(tokenizer, CONTEXT)
    model = initial_model(config, seed)
    result = warm_up(model, tokenizer, seed, target_accuracy, max_steps, settings, log)
    builder = "core_engine.policies.calculator.build_calculator_policy"
    info = build_record(
        result,
        target_accuracy,
        settings,
        builder,
        model,
        heldout={
            "seed": HELDOUT_SEED,
            "prompts": settings.eval_count,
            "metric": "greedy episodes",
            "environment": ENVIRONMENT,
            "max_turns": MAX_TURNS,
            "max_tokens": TURN_TOKENS,
            "max_episode_tokens": CONTEXT,
        },
        tokenizer={"rows": tokenizer_rows, "vocab_size": len(tokenizer)},
        parameters=sum(p.numel() for p in model.parameters()),
    )
    return save_policy(path, model.eval(), config, tokenizer, (INFO_FILE, info))


def main(argv: Sequence[str] | None = None) -> None:
    """Rebuild the calculator policy (by default the shipped one, replaced)."""
    rebuild_main(main.__doc__, CALCULATOR_POLICY, build_calculator_policy, INFO_FILE, argv)


if __name__ == "__main__":
    main()
