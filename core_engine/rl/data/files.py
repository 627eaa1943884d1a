"""Prompt sets as people keep them: JSONL, JSON, CSV and Parquet files, and directories saved
with `datasets.Dataset.save_to_disk`, read with the `datasets` library and mapped to records
(`core_engine.rl.data`) by `Columns`. JSONL keeps the line reader of `core_engine.rl.data`:
it names each malformed line, which `datasets` does not; Parquet is read by pyarrow into a
`datasets.Dataset`: the 5.2 Parquet builder fails on a file of zero rows. GSM8K answers
(``... #### 42``) give the number after ``####`` (commas dropped) as the reference. Every
path is checked first (`core_engine.user_files`: regular, bounded). A bad file, a missing
column or an empty set is a `DataError` naming the file and the column.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core_engine.rl.data import DataError, normalize_record, read_jsonl_rows
from core_engine.user_files import (
    MAX_DATA_BYTES,
    MAX_TEXT_BYTES,
    UnsafeFileError,
    dataset_dir,
    read_text,
    regular_file,
)

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
PROMPT_COLUMNS = ("question", "prompt", "problem")  # tried in order when none is named
ANSWER_COLUMNS = ("answer", "output", "solution")
MAX_COLUMN_NAME = 256
MAX_SYSTEM_PROMPT = 32_768  # characters


@dataclass(frozen=True)
class Columns:
    """Which columns hold the prompt and the reference answer (None: records in the
    instruction/messages form, else the first of `PROMPT_COLUMNS` / `ANSWER_COLUMNS`), and a
    system prompt given to every record ("" for none)."""

    prompt: str | None = None
    answer: str | None = None
    system: str = ""

    def problems(self) -> list[str]:
        """What is wrong with the settings themselves (types and lengths)."""
        found = []
        for name, value in (("prompt_column", self.prompt), ("answer_column", self.answer)):
            if value is not None and not (
                isinstance(value, str) and 0 < len(value) <= MAX_COLUMN_NAME
            ):
                found.append(f"{name} must be a column name of 1 to {MAX_COLUMN_NAME} characters")
        if not isinstance(self.system, str) or len(self.system) > MAX_SYSTEM_PROMPT:
            found.append(f"system_prompt must be text of at most {MAX_SYSTEM_PROMPT:,} characters")
        return found


def gsm8k_answer(text: str) -> str:
    """The reference of an answer: after GSM8K's last ``####`` (commas dropped), else as is."""
    if "####" not in text:
        return text
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def with_system(record: dict[str, str], system: str) -> dict[str, str]:
    """``record`` with the job's system prompt, unless the record has its own."""
    if not system or (record["instruction"] and record["input"]):
        return record
    return {**record, "instruction": system, "input": record["input"] or record["instruction"]}


def _column(row: Mapping[str, Any], name: str | None, choices: tuple[str, ...], where: str) -> Any:
    names = (name,) if name else choices
    for candidate in names:
        if row.get(candidate) is not None:
            return row[candidate]
    shown = " or ".join(repr(n) for n in names)
    raise DataError(f"{where}: no column {shown} (columns: {', '.join(map(str, row))})")


def map_row(row: Mapping[str, Any], columns: Columns, where: str) -> dict[str, str]:
    """One row as a record: the instruction/messages form as is, else the mapped columns."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    if columns.prompt is None and ("messages" in row or "instruction" in row):
        record = normalize_record(row, where)
    else:
        prompt = _column(row, columns.prompt, PROMPT_COLUMNS, where)
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{where}: the prompt column holds no text")
        answer = _column(row, columns.answer, ANSWER_COLUMNS, where)
        record = {"instruction": "", "input": prompt, "output": str(answer)}
    return with_system({**record, "output": gsm8k_answer(record["output"])}, columns.system)


def _text(value: Any) -> Any:
    """A number as text (a CSV's ``4`` is read as an int), anything else as it is."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _saved_without_data(path: Path) -> bool:
    """Whether a saved dataset (or its train split) has no data files: `datasets` 5.2 saves
    an empty dataset so and then fails to load it."""
    state = path / "train" / "state.json" if (path / "train").is_dir() else path / "state.json"
    try:
        return json.loads(read_text(state, MAX_TEXT_BYTES)).get("_data_files") == []
    except (UnsafeFileError, ValueError, AttributeError):
        return False  # not a plain saved dataset: `load_from_disk` says what is wrong


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON, CSV or Parquet file or a saved dataset directory, via `datasets`."""
    import datasets

    datasets.disable_progress_bars()
    try:
        with tempfile.TemporaryDirectory() as cache:
            if path.is_dir():
                if _saved_without_data(path):
                    return []
                data = datasets.load_from_disk(str(path), keep_in_memory=True)
                if isinstance(data, datasets.DatasetDict):
                    if "train" not in data:
                        raise DataError(f"{path}: no 'train' split (splits: {', '.join(data)})")
                    data = data["train"]
            elif path.suffix.lower() == ".parquet":  # the builder fails on zero rows
                import pyarrow.parquet

                data = datasets.Dataset(pyarrow.parquet.read_table(path))
            else:
                kind = FORMATS[path.suffix.lower()]
                data = datasets.load_dataset(
                    kind, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True
                )
            return [{k: _text(v) for k, v in row.items()} for row in data.to_list()]
    except DataError:
        raise
    except ValueError as exc:
        if "corresponds to no data" in str(exc):  # how `datasets` says a JSON file is empty
            raise DataError(f"{path}: no records (an empty split)") from None
        raise DataError(f"{path}: not a readable dataset (ValueError: {exc})") from None
    except Exception as exc:  # any reader failure is the file's fault
        cause = exc.__cause__ or exc
        raise DataError(
            f"{path}: not a readable dataset ({type(cause).__name__}: {cause})"
        ) from None


def load_records(path: str | Path, columns: Columns = Columns()) -> list[dict[str, str]]:
    """The records of a prompt set in any supported format (see the module docstring)."""
    path = Path(path)
    try:
        if path.is_dir():
            dataset_dir(path, MAX_DATA_BYTES)
        else:
            regular_file(path, MAX_DATA_BYTES)
    except UnsafeFileError as exc:
        raise DataError(str(exc)) from None
    if not path.is_dir() and path.suffix.lower() not in FORMATS:
        raise DataError(f"{path}: unknown format (use {', '.join(FORMATS)} or a saved dataset)")
    if path.suffix.lower() == ".jsonl":
        return read_jsonl_rows(path, lambda row, where: map_row(row, columns, where))
    rows = _read_rows(path)
    if not rows:
        raise DataError(f"{path}: no records (an empty split)")
    return [map_row(row, columns, f"{path} row {n}") for n, row in enumerate(rows, start=1)]


def split_heldout(
    records: list[dict[str, str]], fraction: float, seed: int
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(training, held-out) records: a seeded ``fraction`` of the distinct prompts is held
    out, every record of a held-out prompt with it, so no held-out prompt is trained on."""
    prompts = list(dict.fromkeys((r["instruction"], r["input"]) for r in records))
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: max(1, round(len(prompts) * fraction))])
    heldout = [r for r in records if (r["instruction"], r["input"]) in held]
    training = [r for r in records if (r["instruction"], r["input"]) not in held]
    if not training:
        raise DataError(f"heldout_fraction {fraction} leaves no training prompt")
    return training, heldout
