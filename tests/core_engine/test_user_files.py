"""Files a user names are used only when they are regular files of bounded size: a FIFO or a
huge sparse file is refused from its ``stat``, without being opened or read."""

import json
import os
import re
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from core_engine.rl.data import DataError
from core_engine.rl.data.files import load_records, record_count
from core_engine.user_files import (
    MAX_DATA_BYTES,
    MAX_TEXT_BYTES,
    UnsafeFileError,
    checkpoint_dir,
    open_regular,
    read_text,
    regular_file,
)

FOUR_GIB = 4 * 2**30
T = TypeVar("T")
RECORD = json.dumps({"instruction": "", "input": "3?", "output": "7"}) + "\n"
# A hang guard, not a speed bound: a FIFO that is opened for reading blocks its reader for ever
# (no writer ever comes), and a refusal from a stat takes milliseconds, so this only has to be
# finite, and long enough that a machine busy with other work never reaches it.
HANG_GUARD_S = 60.0


def within(seconds: float, call: Callable[[], T]) -> T:
    """What ``call`` returns (or raises), failing the test if it has not returned after
    ``seconds`` (a hang guard): run in a daemon thread, so a reader blocked on a FIFO cannot
    hang the test run."""
    outcome: list[tuple[T | None, BaseException | None]] = []

    def run() -> None:
        try:
            outcome.append((call(), None))
        except BaseException as exc:
            outcome.append((None, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s (blocked on the file?)"
    result, error = outcome[0]
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def sparse(path: Path, size: int = FOUR_GIB) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.truncate(path, size)  # 4 GiB claimed, no block written
    return path


@pytest.mark.parametrize(
    "read",
    [
        lambda p: regular_file(p, MAX_DATA_BYTES),
        lambda p: open_regular(p, MAX_DATA_BYTES),
        lambda p: read_text(p, MAX_TEXT_BYTES),
        load_records,
        record_count,
    ],
)
def test_a_fifo_is_refused_without_being_opened(tmp_path, read):
    with pytest.raises((UnsafeFileError, DataError), match="is a FIFO, not a regular file"):
        within(HANG_GUARD_S, lambda: read(fifo(tmp_path / "prompts.jsonl")))


@pytest.mark.parametrize(
    "read", [load_records, record_count, lambda p: read_text(p, MAX_TEXT_BYTES)]
)
def test_a_sparse_4_gib_file_is_refused_by_its_size_unread(tmp_path, read):
    path = sparse(tmp_path / "huge.jsonl")
    tracemalloc.start()
    with pytest.raises((UnsafeFileError, DataError), match=r"is 4,096\.0 MiB, over the"):
        within(HANG_GUARD_S, lambda: read(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20  # nothing of it was read (it would cost 4 GiB)


def test_links_are_resolved_and_checked_inside_the_roots(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside.jsonl"
    root.mkdir()
    outside.write_text(RECORD)
    (root / "inside.jsonl").write_text(RECORD)
    (root / "escape.jsonl").symlink_to(outside)
    (root / "alias.jsonl").symlink_to(root / "inside.jsonl")
    assert regular_file(root / "alias.jsonl", MAX_DATA_BYTES, [root]).st_size == len(RECORD)
    with pytest.raises(UnsafeFileError, match="outside the allowed folders"):
        regular_file(root / "escape.jsonl", MAX_DATA_BYTES, [root])
    (root / "pipe-link.jsonl").symlink_to(fifo(root / "pipe"))
    with pytest.raises(UnsafeFileError, match="is a FIFO"):
        within(HANG_GUARD_S, lambda: regular_file(root / "pipe-link.jsonl", MAX_DATA_BYTES, [root]))
    with pytest.raises(UnsafeFileError, match="is a directory"):
        regular_file(root, MAX_DATA_BYTES)
    with pytest.raises(UnsafeFileError, match="does not exist"):
        regular_file(root / "missing.jsonl", MAX_DATA_BYTES)


def checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "runs").mkdir()  # folders are not read
    return folder


def test_a_checkpoint_directory_holds_only_regular_files_of_bounded_size(tmp_path):
    root = tmp_path / "models"
    assert checkpoint_dir(checkpoint(root / "ok"), [root]) == (root / "ok").resolve()
    fifo(checkpoint(root / "pipe") / "tokenizer.json")
    sparse(checkpoint(root / "sparse") / "tokenizer_config.json")
    escaping = checkpoint(root / "escaping")
    (escaping / "vocab.json").symlink_to(sparse(tmp_path / "elsewhere.json", 10))
    refusals = {
        "pipe": "tokenizer.json is a FIFO",
        "sparse": "tokenizer_config.json is 4,096.0 MiB, over the 64.0 MiB limit",
        "escaping": "vocab.json is outside the allowed folders",
    }
    for name, why in refusals.items():
        with pytest.raises(UnsafeFileError, match=re.escape(why)):
            within(HANG_GUARD_S, lambda name=name: checkpoint_dir(root / name, [root]))
    (root / "bare").mkdir()
    with pytest.raises(UnsafeFileError, match=r"has no config\.json"):
        checkpoint_dir(root / "bare", [root])
    sparse(checkpoint(root / "weights") / "model-00001.safetensors")  # weights may be large
    assert checkpoint_dir(root / "weights", [root])


def test_counting_holds_no_record_and_stops_at_the_20th_problem(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(RECORD * 5 + "\n")
    assert record_count(good) == len(load_records(good)) == 5
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n" * 100_000 + RECORD)
    with pytest.raises(DataError) as info:
        record_count(bad)
    # reading stopped at the 20th malformed line: none of the 99,980 after it was reported
    assert str(info.value).count("not valid JSON") == 20 and "bad.jsonl:20:" in str(info.value)
    assert "bad.jsonl:21:" not in str(info.value)
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n")
    with pytest.raises(DataError, match=r"nested too deeply|not valid JSON"):
        load_records(deep)
