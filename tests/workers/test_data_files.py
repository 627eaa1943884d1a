"""A train job's data files are checked at submission: a saved dataset directory is allowed
like a file, and a bad file, a missing column, an empty set or a held-out fraction that
leaves nothing to train on is refused naming the file and the column."""

import json
import os
import re
from pathlib import Path

import datasets
import pandas as pd
import pytest

from core_engine.rl.data import DataError
from core_engine.rl.data.files import load_records
from tests.workers.helpers import train_config
from workers.job_files import check_data_records, check_paths
from workers.specs import SpecError, data_columns, validate


def test_data_records_are_read_with_the_jobs_column_mapping(tiny_model, settings):
    folder = settings.data_dir
    frame = pd.DataFrame({"problem": ["1+1?", "2+2?"], "solution": ["#### 2", "#### 4"]})
    frame.to_csv(folder / "train.csv", index=False)
    datasets.Dataset.from_pandas(frame).save_to_disk(str(folder / "test"))
    config = train_config(tiny_model, task=None, data=str(folder / "train.csv"))
    config |= {"heldout_data": str(folder / "test"), "prompt_column": "problem"}
    config |= {"answer_column": "solution", "system_prompt": "Think."}
    validate("train", config)
    check_paths(config, settings)
    check_data_records(config)
    with pytest.raises(SpecError, match=r"train\.csv: no column 'question_text' \(columns: pro"):
        check_data_records({**config, "prompt_column": "question_text"})
    with pytest.raises(SpecError, match=r"train\.csv: no column 'score'"):
        check_data_records({**config, "answer_column": "score"})
    with pytest.raises(SpecError, match="leaves no training prompt"):
        one = folder / "one.csv"
        frame[:1].to_csv(one, index=False)
        check_data_records(
            {**config, "data": str(one), "heldout_fraction": 0.5} | {"heldout_data": None}
        )
    (folder / "empty.jsonl").write_text("")
    with pytest.raises(SpecError, match=r"empty\.jsonl: no usable record"):
        check_data_records({**config, "data": str(folder / "empty.jsonl")})
    (folder / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(SpecError, match=r"bad\.parquet: not a readable dataset"):
        check_data_records({**config, "heldout_data": str(folder / "bad.parquet")})
    with pytest.raises(SpecError, match=r"heldout_data: .* is not under"):
        check_paths({**config, "heldout_data": "/etc/passwd"}, settings)


def test_column_settings_are_bounded(tiny_model):
    assert data_columns({}).system == ""
    for bad, message in (
        ({"prompt_column": ""}, "prompt_column must be a column name"),
        ({"answer_column": "x" * 257}, "answer_column must be a column name"),
        ({"system_prompt": "x" * 32_769}, "system_prompt must be text of at most 32,768"),
        ({"system_prompt": 3}, "system_prompt must be text"),
    ):
        with pytest.raises(SpecError, match=message):
            validate("train", train_config(tiny_model, **bad))


# Issue 32, item 4: a saved dataset's state.json may name only files inside the dataset.
def test_a_saved_dataset_naming_a_file_outside_itself_is_refused(tiny_model, settings, monkeypatch):
    monkeypatch.setenv("RLWB_MODEL_ROOTS", str(Path(tiny_model).parent))
    secret = settings.data_dir.parent / "outside" / "secret"  # under no allowed root
    datasets.Dataset.from_pandas(
        pd.DataFrame({"question": ["the secret?"], "answer": ["hidden"]})
    ).save_to_disk(str(secret))
    saved = settings.data_dir / "sets" / "saved"
    datasets.Dataset.from_pandas(
        pd.DataFrame({"question": ["1+1?"], "answer": ["2"]})
    ).save_to_disk(str(saved))
    named = os.path.relpath(secret / "data-00000-of-00001.arrow", saved)
    assert named.startswith("../../../outside/")
    state = json.loads((saved / "state.json").read_text())
    (saved / "state.json").write_text(json.dumps({**state, "_data_files": [{"filename": named}]}))
    config = train_config(tiny_model, task=None, data=str(saved))
    check_paths(config, settings)  # the directory itself is allowed
    outside = rf"{re.escape(str(saved / named))} is outside the allowed folders"
    with pytest.raises(SpecError, match=outside):
        check_data_records(config)
    with pytest.raises(DataError, match=outside):
        load_records(saved)


# Issue 32, item 4: an empty answer cell is named as such, and a job whose rewards read no
# reference needs no answer column; an environment job always does (it may read `output`).
def test_an_answer_is_required_only_by_rewards_that_read_it(tiny_model, settings):
    folder = settings.data_dir
    (folder / "open.csv").write_text("question,answer\nName a color.,blue\nName a fruit.,\n")
    (folder / "prompts.csv").write_text("question\nWrite a haiku.\nWrite a limerick.\n")
    config = train_config(tiny_model, task=None, data=str(folder / "open.csv"))
    with pytest.raises(SpecError, match=r"open\.csv row 2: the answer column 'answer' is empty"):
        check_data_records(config)  # exact_match, the default
    length = {"name": "length", "threshold": 2}
    for reward in ("format", [{"name": "format"}, length], "regex:.+"):
        for data in ("open.csv", "prompts.csv"):
            check_data_records({**config, "data": str(folder / data), "reward": reward})
        records = load_records(folder / "open.csv", data_columns({"reward": reward}))
        assert [record["output"] for record in records] == ["blue", ""]
    missing = r"prompts\.csv: no column 'answer' or 'output' or 'solution' \(columns: question\)"
    for reward in ("exact_match", [{"name": "format"}, {"name": "math"}], "registered_name"):
        with pytest.raises(SpecError, match=missing):
            check_data_records({**config, "data": str(folder / "prompts.csv"), "reward": reward})
    assert data_columns({"environment": "guess_number"}).needs_answer
