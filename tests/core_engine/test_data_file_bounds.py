"""Issue 32, item 4: data files are bounded by what they decode to. Hostile files built here (a
Parquet file whose metadata claims too much, one whose dictionary decodes far past the bound,
one holding a value the reader has no memory for) are refused with the numbers by a child
process that the caller outlives, at no memory cost to the caller; the columns used are read as
written, and only a GSM8K-shaped answer is cut to its number."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core_engine.rl.data import MAX_RECORDS, DataError, files
from core_engine.rl.data.files import load_records, record_count
from core_engine.rl.rewards import resolve_reward, score

MIB = 2**20


def dictionary_bomb(path: Path, rows: int, value_bytes: int, store_schema: bool = True) -> Path:
    """A Parquet file of ``rows`` questions whose answers are one ``value_bytes`` value,
    dictionary-encoded: a few KiB on disk, ``rows * value_bytes`` decoded. Without the stored
    Arrow schema pyarrow reads the answers as plain text, each row a copy."""
    index = pa.repeat(pa.scalar(0, pa.int32()), rows)
    answers = pa.DictionaryArray.from_arrays(index, pa.array(["7" * value_bytes]))
    table = pa.table({"question": pa.repeat(pa.scalar("q"), rows), "answer": answers})
    pq.write_table(table, path, compression="zstd", store_schema=store_schema)
    return path


def _read_in_a_fresh_process(path: Path) -> tuple[str, int]:
    """(what `load_records` says of ``path``, the peak resident KiB of a fresh process calling
    it: VmHWM, which counts neither its children, the file's reader among them, nor the test
    process it was forked from, as ``ru_maxrss`` would)."""
    code = (
        "import sys\n"
        "from core_engine.rl.data import DataError\n"
        "from core_engine.rl.data.files import load_records\n"
        "try:\n"
        "    print(len(load_records(sys.argv[1])))\n"
        "except DataError as exc:\n"
        "    print(exc)\n"
        "print(next(line for line in open('/proc/self/status') if line.startswith('VmHWM')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    message, peak = run.stdout.strip().rsplit("\n", 1)
    return message, int(peak.split()[1])


def test_a_parquet_file_decoding_past_the_bound_is_refused_and_its_caller_stays_small(tmp_path):
    bomb = dictionary_bomb(tmp_path / "bomb.parquet", 100_000, 4096)  # 391 MiB decoded
    assert bomb.stat().st_size < 64 * 1024
    message, peak_kib = _read_in_a_fresh_process(bomb)
    assert message.startswith(
        f"{bomb}: its columns 'question', 'answer' decode to more than 256.0 MiB (the limit "
        "of a prompt set) by row "
    )
    assert peak_kib < 128 * 1024  # reading it here took the 391 MiB and more


def test_parquet_metadata_claiming_too_much_is_refused_before_any_row_is_decoded(tmp_path):
    many = dictionary_bomb(tmp_path / "many.parquet", MAX_RECORDS + 1, 1)
    with pytest.raises(DataError, match=r"^\S+many\.parquet: 1,000,001 rows \(its Parquet meta"):
        load_records(many)
    large = tmp_path / "large.parquet"  # 72 row groups of 4 MiB of answers, each compressed
    group = pa.table(
        {
            "question": pa.repeat(pa.scalar("q"), 1024),
            "answer": pa.repeat(pa.scalar("7" * 4096), 1024),
        }
    )
    with pq.ParquetWriter(large, group.schema, compression="zstd", use_dictionary=False) as out:
        for _ in range(72):
            out.write_table(group)
    assert large.stat().st_size < 2 * MIB
    claimed = sum(pq.ParquetFile(large).metadata.row_group(n).total_byte_size for n in range(72))
    with pytest.raises(DataError) as refused:
        load_records(large)
    assert str(refused.value) == (
        f"{large}: its columns 'question', 'answer' take {claimed / MIB:,.1f} MiB uncompressed "
        "(its Parquet metadata), over the 256.0 MiB limit"
    )


def test_a_value_needing_more_memory_than_the_reader_has_ends_only_the_reader(
    tmp_path, monkeypatch
):
    # no Arrow schema: the answers decode to plain text, 1 GiB in the first batch
    huge = dictionary_bomb(tmp_path / "huge.parquet", 1024, MIB, store_schema=False)
    monkeypatch.setattr(files, "PARSE_MEMORY_BYTES", 768 * MIB)
    with pytest.raises(DataError) as refused:
        load_records(huge)
    assert str(refused.value) == f"{huge}: parsing it needed more than 768 MiB of memory"


def test_answers_are_read_as_written_so_exact_match_holds(tmp_path):
    sums = tmp_path / "sums.csv"
    sums.write_text("question,answer\n1+2?,3\nhalf of 5?,2.50\n7-0?,007\n")
    pd.DataFrame(
        {"question": ["1+2?", "2+10?"], "answer": [3, 12], "score": [3.0, 2.5]}
    ).to_parquet(tmp_path / "sums.parquet")
    (tmp_path / "sums.json").write_text(
        '[{"question": "1+2?", "answer": 3}, {"question": "x", "answer": 2.50}]'
    )
    for path, columns, expected in (
        (sums, files.Columns(), ["3", "2.50", "007"]),  # pandas: 3.0, 2.5, 7.0
        (tmp_path / "sums.parquet", files.Columns(), ["3", "12"]),
        (tmp_path / "sums.parquet", files.Columns(answer="score"), ["3", "2.5"]),  # pyarrow's
        (tmp_path / "sums.json", files.Columns(), ["3", "2.50"]),
    ):
        references = [record["output"] for record in load_records(path, columns)]
        assert references == expected, path
        reward = resolve_reward("exact_match")
        assert score(reward, expected, references, [""] * len(expected)) == [1.0] * len(expected)


def test_only_a_gsm8k_shaped_answer_is_cut_to_its_number(tmp_path):
    markdown = "## Plan\n#### Step 1\nAdd 2 and 3.\n#### Step 2\nSay 5."
    pd.DataFrame({"question": ["2+3?", "How?"], "answer": ["2 + 3 = 5\n#### 5", markdown]}).to_csv(
        tmp_path / "mixed.csv", index=False
    )
    assert [r["output"] for r in load_records(tmp_path / "mixed.csv")] == ["5", markdown]


@pytest.mark.slow
def test_a_jsonl_file_of_more_rows_than_a_prompt_set_holds_is_refused(tmp_path):
    """JSONL is bounded by rows too, not only by its bytes: a million tiny records decode to
    far more than the file's 31 MiB (a dict and strings per row)."""
    many = tmp_path / "many.jsonl"
    many.write_text('{"instruction":"q","output":"1"}\n' * (MAX_RECORDS + 1))
    limit = r"^\S+many\.jsonl: more than 1,000,000 rows \(the limit of a prompt set\)$"
    with pytest.raises(DataError, match=limit):
        load_records(many)
    with pytest.raises(DataError, match=limit):
        record_count(many)
    many.write_text('{"instruction":"q","output":"1"}\n' * MAX_RECORDS)
    assert len(load_records(many)) == MAX_RECORDS


def list_of_empty_objects(path: Path, size: int) -> Path:
    """A JSONL file of one line, ``size`` bytes of ``[{},{},...]``: ~24 bytes of Python objects
    for each 3 bytes of the line (issue 45: 64 MiB took its reader to 1.8 GB)."""
    path.write_text("[" + "{}," * (size // 3) + "{}]\n")
    return path


# Issue 45, item 1: JSONL is parsed in the reading child too, never by the caller.
def test_a_jsonl_line_decoding_to_hundreds_of_mib_costs_its_caller_nothing(tmp_path):
    bomb = list_of_empty_objects(tmp_path / "bomb.jsonl", 16 * MIB)  # ~400 MiB decoded
    message, peak_kib = _read_in_a_fresh_process(bomb)
    assert message == f"malformed records:\n{bomb}:1: expected an object, got list"
    assert peak_kib < 128 * 1024  # parsing it here took ~450 MiB


def test_a_jsonl_line_needing_more_memory_than_the_reader_has_is_refused_by_its_line(
    tmp_path, monkeypatch
):
    bomb = tmp_path / "bomb.jsonl"
    bomb.write_text('{"instruction": "q"}\n' + list_of_empty_objects(bomb, 16 * MIB).read_text())
    monkeypatch.setattr(files, "PARSE_MEMORY_BYTES", 256 * MIB)
    for read in (files.load_records, files.record_count):
        with pytest.raises(DataError) as refused:
            read(bomb)
        assert str(refused.value) == f"{bomb}:2: parsing it needed more than 256 MiB of memory"


def test_a_reader_past_its_deadline_is_stopped_and_named(tmp_path, monkeypatch):
    """A reader that never answers (a file whose parse would not end) is killed at the
    deadline: the caller gets a `DataError` naming the file and the limit."""
    path = tmp_path / "slow.jsonl"
    path.write_text('{"question": "q", "answer": "7"}\n')
    monkeypatch.setattr(files, "READ_DEADLINE_S", 1.0)
    monkeypatch.setattr(files, "READER", [sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(DataError, match=r"slow.jsonl: its reader was stopped after 1 s"):
        load_records(path)
