"""Issue 32, item 4, through Launch's upload: a Parquet file decoding far past the bound and CSV
files of a million columns are refused with the numbers and not kept (the caller's memory is
measured in `tests.core_engine.test_data_file_bounds`); a CSV of prompts only is kept, for jobs
whose rewards need no answer."""

from tests.core_engine.test_data_file_bounds import dictionary_bomb
from tests.ui.test_launch import form, isolated
from ui.handlers.launch import JSONL_SOURCE, launch_job, upload_dataset
from ui.render import inert


def _refused(services, upload) -> str:
    _, stored, message = upload_dataset(services, str(upload))
    assert stored is None and message.startswith("**Upload refused:**"), message
    assert not upload.exists() and not list((services.data_dir / "datasets").glob("*"))
    return message


def test_a_parquet_upload_decoding_past_the_bound_is_refused(services, tmp_path):
    mine = isolated(services, tmp_path)
    bomb = dictionary_bomb(tmp_path / "bomb.parquet", 100_000, 4096)  # 391 MiB decoded
    expected = "bomb.parquet: its columns 'question', 'answer' decode to more than 256.0 MiB"
    assert inert(expected) in _refused(mine, bomb)


def test_csv_uploads_of_a_million_columns_are_refused(services, tmp_path):
    mine = isolated(services, tmp_path)
    wide = tmp_path / "wide.csv"  # 9 MiB: a million columns named, a million values
    million = range(1_000_000)
    wide.write_text(",".join(f"c{n}" for n in million) + "\n" + ",".join("1" for _ in million))
    header = "wide.csv: its header line is over 1,048,576 characters"
    assert inert(header) in _refused(mine, wide)
    long = tmp_path / "long.csv"  # two columns named, a row of a million values
    long.write_text("question,answer\n" + ",".join("1" for _ in million) + "\n")
    message = _refused(mine, long)
    assert inert("long.csv row 1: 1,000,000 fields, but the header names 2 columns") in message
    many = tmp_path / "many.csv"  # a header under the bound naming too many columns
    many.write_text(",".join(f"c{n}" for n in range(10_001)) + "\nq\n")
    assert inert("many.csv: 10,001 columns, over the 10,000 limit") in _refused(mine, many)


def test_a_prompt_only_csv_is_kept_for_rewards_that_need_no_answer(services, world, tmp_path):
    upload = tmp_path / "haiku.csv"
    upload.write_text("question\nWrite a haiku.\nWrite a limerick.\n")
    _, stored, message = upload_dataset(services, str(upload))
    assert stored is not None and "Stored 2 records" in message
    launched = launch_job(
        services, **form(source=JSONL_SOURCE, task=None, data=stored, reward="format")
    )
    assert launched.startswith("Job **#"), launched
    assert world["queue"].submitted[-1][1]["reward"] == "format"
