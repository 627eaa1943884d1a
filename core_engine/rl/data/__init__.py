"""Prompt records: loading, mapping to chat messages, and the collate contract.

A record is `{"instruction", "input", "output"}` (input and output optional) or
`{"messages": [...]}`. For generation only the system/user part is used: `output` is the
reference answer handed to the reward and shown in the UI, never part of the prompt.
Roles (`instruction_to_messages`): with an `input`, instruction -> system and input -> user;
an `instruction` alone is the user turn (the Alpaca convention). A `messages` record keeps
its system and user turns; its trailing assistant turn is the reference.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from core_engine.prompts import encode_prompt
from core_engine.rl.template_sandbox import render_prompts

Batch = dict[str, list[str]]
MAX_RECORDS = 1_000_000  # rows of a prompt set, in any format


def too_many_rows(path: str | Path) -> DataError:
    return DataError(f"{path}: more than {MAX_RECORDS:,} rows (the limit of a prompt set)")


class DataError(ValueError):
    """Records that cannot be used, with the place they came from."""


def instruction_to_messages(instruction: str, input: str = "", output: str = "") -> list[dict]:
    """instruction -> system and input -> user, or an instruction without input -> user (the
    Alpaca convention); output -> assistant. Empty fields are left out."""
    messages = []
    if instruction and input:
        messages.append({"role": "system", "content": instruction})
    if instruction or input:
        messages.append({"role": "user", "content": input or instruction})
    if output:
        messages.append({"role": "assistant", "content": output})
    return messages


def longest_prompt(
    tokenizer: Any,
    records: Iterable[Mapping[str, str]],
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Tokens of the longest prompt among `records`, each rendered with the tokenizer's chat
    template as the engine is given it, in the bounded child of
    `core_engine.rl.template_sandbox` (`TemplateBoundError` past a bound, `RenderCancelled`
    once ``cancelled()``)."""
    prompts = (instruction_to_messages(*_prompt_fields(r)) for r in records)
    texts = render_prompts(tokenizer, prompts, cancelled)
    return max(len(encode_prompt(tokenizer, text)) for text in texts)


def longest_records(records: Iterable[Mapping[str, str]], count: int) -> list[Mapping[str, str]]:
    """The `count` records of the most prompt characters (instruction and input): where the
    longest prompt in tokens is looked for without rendering every record."""
    return heapq.nlargest(count, records, key=lambda r: sum(map(len, _prompt_fields(r))))


def _prompt_fields(record: Mapping[str, str]) -> tuple[str, str]:
    return record.get("instruction", ""), record.get("input", "")


def prompt_messages(messages: Sequence[Mapping[str, str]]) -> list[dict]:
    """The generation prompt: the conversation up to (not including) the last assistant turn."""
    cut = len(messages)
    while cut and messages[cut - 1]["role"] == "assistant":
        cut -= 1
    return [dict(m) for m in messages[:cut]]


def reference_answer(messages: Sequence[Mapping[str, str]]) -> str:
    """The trailing assistant turn(s) of a conversation: what the reward compares with."""
    tail = []
    for m in reversed(messages):
        if m["role"] != "assistant":
            break
        tail.append(m["content"])
    return "".join(reversed(tail))


def normalize_record(record: Mapping[str, Any], where: str = "record") -> dict[str, str]:
    """A record as the three collate fields `instruction`, `input`, `output` (strings)."""
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not all(
            isinstance(m, Mapping) and {"role", "content"} <= set(m) for m in messages
        ):
            raise DataError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        system = "".join(m["content"] for m in messages if m["role"] == "system")
        user = "".join(m["content"] for m in prompt_messages(messages) if m["role"] == "user")
        return {"instruction": system, "input": user, "output": reference_answer(messages)}
    if "instruction" not in record:
        raise DataError(
            f"{where}: needs 'instruction' (with optional 'input'/'output') or 'messages'"
        )
    fields = {k: record.get(k, "") for k in ("instruction", "input", "output")}
    for key, value in fields.items():
        if not isinstance(value, str):
            raise DataError(f"{where}: '{key}' must be a string, got {type(value).__name__}")
    if not fields["instruction"] and not fields["input"]:
        raise DataError(f"{where}: the prompt is empty (no instruction and no input)")
    return fields


def collate(records: Iterable[Mapping[str, str]]) -> Batch:
    """Records -> a dict of parallel lists of strings (the batch contract)."""
    batch: Batch = {"instruction": [], "input": [], "output": []}
    for record in records:
        for key in batch:
            batch[key].append(record.get(key, ""))
    return batch


def batch_rows(batch: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """The rows of a collated batch; lists of unequal length are an error naming them."""
    lengths = {key: len(values) for key, values in batch.items()}
    if len(set(lengths.values())) > 1:
        raise DataError(f"batch fields have unequal lengths: {lengths}")
    keys = list(batch)
    return [dict(zip(keys, values, strict=True)) for values in zip(*batch.values(), strict=True)]
