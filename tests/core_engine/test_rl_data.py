"""Records, role mapping, the collate contract and JSONL loading."""

import json

import pytest

from core_engine.rl.data import (
    DataError,
    batch_rows,
    collate,
    instruction_to_messages,
    normalize_record,
)
from core_engine.rl.data.files import load_records
from core_engine.rl.rollout import RolloutGenerator
from core_engine.toy import char_tokenizer


def test_three_field_role_mapping_is_pinned():
    assert instruction_to_messages("Be terse.", "2+2?", "4") == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert RolloutGenerator._instruction_to_messages("", "2+2?") == [
        {"role": "user", "content": "2+2?"}
    ]


def test_an_instruction_without_input_is_the_user_turn():
    """The Alpaca convention: the instruction is the task itself when there is no input."""
    assert RolloutGenerator._instruction_to_messages("What is 2+2?", "", "4") == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    gen = RolloutGenerator(_Engine(), params=None, group_size=1)
    batch = collate([normalize_record({"instruction": "What is 2+2?", "output": "4"})])
    ((messages, text, reference),) = gen._prepare_prompts(batch)
    assert messages == [{"role": "user", "content": "What is 2+2?"}]
    assert text == "<|user|>What is 2+2?<|end|><|assistant|>" and reference == "4"


class _Engine:
    tokenizer = char_tokenizer()


def test_reference_output_never_appears_in_the_prompt():
    gen = RolloutGenerator(_Engine(), params=None, group_size=1)
    batch = {"instruction": ["Be terse."], "input": ["2+2?"], "output": ["SECRET ANSWER"]}
    ((messages, text, reference),) = gen._prepare_prompts(batch)
    assert text == "<|system|>Be terse.<|end|><|user|>2+2?<|end|><|assistant|>"
    assert "SECRET" not in text and all(m["role"] != "assistant" for m in messages)
    assert reference == "SECRET ANSWER"


def test_unequal_batch_fields_are_an_error_naming_them():
    with pytest.raises(DataError, match=r"'instruction': 2, 'input': 1"):
        batch_rows({"instruction": ["a", "b"], "input": ["x"], "output": ["1", "2"]})
    rows = batch_rows(collate([{"instruction": "a", "input": "b", "output": "c"}]))
    assert rows == [{"instruction": "a", "input": "b", "output": "c"}]


def test_messages_records_split_prompt_and_reference():
    record = normalize_record(
        {
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"},
            ]
        }
    )
    assert record == {"instruction": "S", "input": "U", "output": "A"}


def test_jsonl_reports_malformed_lines_with_numbers(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(
        json.dumps({"instruction": "ok", "output": "1"})
        + "\n{not json\n"
        + json.dumps({"input": 3})
        + "\n\n"
        + json.dumps({"instruction": "", "input": ""})
        + "\n"
    )
    with pytest.raises(DataError) as info:
        load_records(path)
    message = str(info.value)
    assert "data.jsonl:2: not valid JSON" in message
    assert "data.jsonl:3:" in message and "data.jsonl:5: the prompt is empty" in message


def test_jsonl_without_usable_records_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DataError, match="no usable record"):
        load_records(path)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"instruction": "i", "input": "x", "output": "y"}) + "\n")
    assert load_records(good) == [{"instruction": "i", "input": "x", "output": "y"}]
