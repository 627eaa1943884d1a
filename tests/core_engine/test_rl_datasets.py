"""Prompt sets as people keep them (JSONL, JSON, CSV, Parquet, a `save_to_disk` directory),
each written by pandas or `datasets` itself, load the same records; GSM8K answers give their
number; bad files, missing columns and empty sets are refused naming the file and column; the
job's system prompt reaches the checkpoint's own chat template; the word-problem generator
reproduces its shipped sample."""

import json
import os
from pathlib import Path

import datasets
import pandas as pd
import pytest
import transformers

from core_engine.prompts import render_prompt
from core_engine.rl.data import DataError
from core_engine.rl.data.files import Columns, gsm8k_answer, load_records, split_heldout
from core_engine.rl.data.tasks import BUILTIN_TASKS, default_reward, prompt_records
from core_engine.rl.data.word_problems import gsm8k_records, word_problem_records
from core_engine.rl.rewards import resolve_reward, score
from core_engine.rl.rollout import RolloutGenerator

SAMPLE = Path(__file__).parents[1] / "data" / "word_problems_sample.jsonl"
ROWS = [
    {"q": "Tom has 3 apples and buys 2. How many?", "sol": "3 + 2 = 5\n#### 5", "n": 1},
    {"q": "A farm sells 1,200 eggs twice.", "sol": "1,200 x 2 = 2,400\n#### 2,400", "n": 2},
    {"q": "Just say 7.", "sol": "7", "n": 3},
]
EXPECTED = [
    {"instruction": "", "input": ROWS[0]["q"], "output": "5"},
    {"instruction": "", "input": ROWS[1]["q"], "output": "2400"},
    {"instruction": "", "input": ROWS[2]["q"], "output": "7"},
]
MAPPED = Columns(prompt="q", answer="sol")


def write_all(frame: pd.DataFrame, folder: Path) -> list[Path]:
    frame.to_json(folder / "set.jsonl", orient="records", lines=True)
    frame.to_json(folder / "set.json", orient="records")
    frame.to_csv(folder / "set.csv", index=False)
    frame.to_parquet(folder / "set.parquet")
    datasets.Dataset.from_pandas(frame).save_to_disk(str(folder / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame)}).save_to_disk(
        str(folder / "split")
    )
    return [folder / name for name in ("set.jsonl", "set.json", "set.csv", "set.parquet")] + [
        folder / "saved",
        folder / "split",
    ]


def test_every_format_loads_the_same_records(tmp_path):
    for path in write_all(pd.DataFrame(ROWS), tmp_path):
        assert load_records(path, MAPPED) == EXPECTED, path
        assert prompt_records(None, str(path), columns=MAPPED) == EXPECTED


def test_default_columns_and_the_instruction_form(tmp_path):
    gsm = pd.DataFrame({"question": ["1+1?"], "answer": ["1+1=2\n#### 2"]})
    gsm.to_parquet(tmp_path / "gsm.parquet")
    assert load_records(tmp_path / "gsm.parquet") == [
        {"instruction": "", "input": "1+1?", "output": "2"}
    ]
    alpaca = pd.DataFrame({"instruction": ["Add."], "input": ["2+2"], "output": ["4"]})
    alpaca.to_csv(tmp_path / "alpaca.csv", index=False)
    assert load_records(tmp_path / "alpaca.csv") == [
        {"instruction": "Add.", "input": "2+2", "output": "4"}
    ]


@pytest.mark.parametrize(
    ("text", "reference"),
    [("so 5\n#### 5", "5"), ("#### 1,234", "1234"), ("a\n#### -3.5 \n", "-3.5"), ("7", "7")]
    + [
        (text, text) for text in ("a #### b #### -3", "## Plan\n#### Step 1\nAdd 2.", "#### 4 cats")
    ],
)
def test_gsm8k_answers_give_the_number_after_the_marks(text, reference):
    """Only an answer whose last line is ``#### <number>`` is GSM8K's: any other is kept."""
    assert gsm8k_answer(text) == reference


def test_a_missing_column_is_named_with_the_file(tmp_path):
    for path in write_all(pd.DataFrame(ROWS), tmp_path):
        with pytest.raises(DataError, match=rf"{path}.*no column 'prompt_text'"):
            load_records(path, Columns(prompt="prompt_text", answer="sol"))
        with pytest.raises(DataError, match=rf"{path}.*no column 'question' or 'prompt'"):
            load_records(path)


def test_empty_and_bad_files_are_refused_naming_the_file(tmp_path):
    empty = pd.DataFrame({"q": pd.Series([], dtype=str), "sol": pd.Series([], dtype=str)})
    for path in write_all(empty, tmp_path):
        with pytest.raises(DataError, match=rf"{path}: no (usable )?record"):
            load_records(path, MAPPED)
    for name, content in (("bad.parquet", b"not parquet"), ("bad.json", b"{oops")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=rf"{tmp_path / name}: not a readable dataset"):
            load_records(tmp_path / name)
    (tmp_path / "set.txt").write_text("hello")
    with pytest.raises(DataError, match="unknown format"):
        load_records(tmp_path / "set.txt")
    with pytest.raises(DataError, match="does not exist"):
        load_records(tmp_path / "missing.csv")
    datasets.DatasetDict({"test": datasets.Dataset.from_pandas(pd.DataFrame(ROWS))}).save_to_disk(
        str(tmp_path / "test_only")
    )
    with pytest.raises(DataError, match="no 'train' split"):
        load_records(tmp_path / "test_only", MAPPED)


def test_system_prompt_reaches_the_checkpoints_chat_template(tmp_path):
    from core_engine.toy import save_tiny_checkpoint

    model = save_tiny_checkpoint(tmp_path / "tiny")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    pd.DataFrame(ROWS).to_csv(tmp_path / "set.csv", index=False)
    records = load_records(tmp_path / "set.csv", Columns("q", "sol", system="Be brief."))
    messages = RolloutGenerator._instruction_to_messages(
        records[0]["instruction"], records[0]["input"]
    )
    rendered = render_prompt(tokenizer, messages)
    assert rendered == tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ROWS[0]["q"]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "Be brief." in rendered and ROWS[0]["q"] in rendered
    own = {"instruction": "Own system.", "input": "x", "output": "y"}
    (tmp_path / "own.jsonl").write_text(json.dumps(own) + "\n")
    assert load_records(tmp_path / "own.jsonl", Columns(system="Be brief.")) == [own]


@pytest.mark.parametrize("task", sorted(BUILTIN_TASKS))
def test_a_built_in_tasks_prompts_get_the_jobs_system_prompt(task):
    plain = prompt_records(task, None, count=4, seed=3)
    records = prompt_records(task, None, count=4, seed=3, columns=Columns(system="Be brief."))
    for record, original in zip(records, plain, strict=True):
        messages = RolloutGenerator._instruction_to_messages(record["instruction"], record["input"])
        assert messages == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": original["input"]},
        ]
        assert record["output"] == original["output"]


def test_heldout_split_is_seeded_and_refuses_an_empty_training_set():
    records = [{"instruction": "", "input": str(i), "output": "7"} for i in range(10)]
    train, held = split_heldout(records, 0.3, seed=1)
    assert len(held) == 3 and sorted(train + held, key=lambda r: int(r["input"])) == records
    assert split_heldout(records, 0.3, seed=1) == (train, held)
    with pytest.raises(DataError, match="leaves no training prompt"):
        split_heldout(records[:1], 0.5, seed=0)


def test_word_problems_reproduce_the_shipped_sample():
    shipped = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert shipped == gsm8k_records(50, 0)
    loaded = load_records(SAMPLE)
    assert loaded == word_problem_records(50, 0) == prompt_records("word_problems", None, 50, 0)
    for row, record in zip(shipped, loaded, strict=True):
        steps = [line for line in row["answer"].splitlines() if "<<" in line]
        assert 2 <= len(steps) <= 4 and int(record["output"]) >= 0
        assert row["answer"].endswith(f"#### {record['output']}")
    assert BUILTIN_TASKS["word_problems"].reward == default_reward("word_problems")
    assert default_reward("word_problems") == "math"  # so a demo can add `format`
    reward = resolve_reward("math")  # the worked answer's final `#### N`, not its first number
    try:
        answers = [row["answer"] for row in shipped[:8]]
        references = [record["output"] for record in loaded[:8]]
        assert score(reward, answers, references, [""] * 8) == [1.0] * 8
    finally:
        reward.close()


def test_a_saved_dataset_directory_is_checked_before_it_is_read(tmp_path):
    datasets.Dataset.from_pandas(pd.DataFrame(ROWS)).save_to_disk(str(tmp_path / "saved"))
    os.mkfifo(tmp_path / "saved" / "extra.arrow")
    with pytest.raises(DataError, match=r"extra\.arrow is a FIFO"):
        load_records(tmp_path / "saved", MAPPED)
