"""A train job's data files are checked at submission: a saved dataset directory is allowed
like a file, and a bad file, a missing column, an empty set or a held-out fraction that
leaves nothing to train on is refused naming the file and the column."""

import datasets
import pandas as pd
import pytest

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
    with pytest.raises(SpecError, match=r"train\.csv row 1: no column 'question_text'"):
        check_data_records({**config, "prompt_column": "question_text"})
    with pytest.raises(SpecError, match=r"train\.csv row 1: no column 'score'"):
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
