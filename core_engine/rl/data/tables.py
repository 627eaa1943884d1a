"""The rows of a CSV, JSON or Parquet file or a `save_to_disk` directory, read as they are
written and bounded by what they decode to. Run in the memory-limited child process of
`core_engine.rl.data.files`; pyarrow is imported there only.

Before any row is decoded the column names are read (a CSV's header line, at most
`MAX_HEADER_CHARS`; Parquet's and Arrow's schema): more than `MAX_COLUMNS` is refused, and
only the columns ``choose`` picks are read. Parquet's metadata must claim at most
`MAX_RECORDS` rows and `MAX_DATA_BYTES` uncompressed for those columns; rows are then decoded
`BATCH_ROWS` at a time, and reading stops once they decode to more than `MAX_DATA_BYTES` (a
dictionary's value counted once per row) or pass `MAX_RECORDS` rows. Values as written: CSV
cells are text (no type inference), JSON numbers keep their digits, Parquet and Arrow numbers,
booleans and dates are pyarrow's rendering (``3`` -> "3"); nested values (``messages``) stay
lists and objects. Each data file a saved dataset's ``state.json`` names must be a regular file
inside the dataset's directory (`core_engine.user_files.open_regular`).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from core_engine.rl.data import MAX_RECORDS, DataError, too_many_rows
from core_engine.user_files import (
    MAX_DATA_BYTES,
    MAX_TEXT_BYTES,
    UnsafeFileError,
    open_regular,
    read_text,
    size_text,
)

MAX_COLUMNS = 10_000
MAX_HEADER_CHARS = 2**20  # a CSV file's first line
BATCH_ROWS = 1024  # rows decoded at once from Parquet
SHOWN_COLUMNS = 20  # column names an error lists

Choose = Callable[[list[str]], list[str]]  # a file's column names -> those read (or DataError)


def table_rows(path: Path, choose: Choose) -> Iterator[dict[str, Any]]:
    """The rows of ``path`` (a ``.csv``, ``.json`` or ``.parquet`` file or a saved dataset
    directory) with the columns ``choose`` picks, as written; `DataError` past a bound (see
    the module docstring)."""
    if path.is_dir():
        rows = _saved_rows(path, choose)
    else:
        readers = {".csv": _csv_rows, ".json": _json_rows, ".parquet": _parquet_rows}
        rows = readers[path.suffix.lower()](path, choose)
    for number, row in enumerate(rows, start=1):
        if number > MAX_RECORDS:
            raise too_many_rows(path)
        yield row


def column_list(names: Iterable[str]) -> str:
    """Column names for a message: the first `SHOWN_COLUMNS`, then how many there are."""
    names = list(names)
    shown = ", ".join(map(str, names[:SHOWN_COLUMNS]))
    return shown if len(names) <= SHOWN_COLUMNS else f"{shown}, ... ({len(names):,} in all)"


def _chosen(path: Path, names: list[str], choose: Choose) -> list[str]:
    if len(names) > MAX_COLUMNS:
        raise DataError(f"{path}: {len(names):,} columns, over the {MAX_COLUMNS:,} limit")
    return choose(names)


def _opened(path: Path, roots: tuple[Path, ...] | None = None) -> BinaryIO:
    try:
        return open_regular(path, MAX_DATA_BYTES, roots)
    except UnsafeFileError as exc:
        raise DataError(str(exc)) from None


def _csv_rows(path: Path, choose: Choose) -> Iterator[dict[str, Any]]:
    csv.field_size_limit(MAX_DATA_BYTES)
    with _opened(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        header = text.readline(MAX_HEADER_CHARS + 1)
        if len(header) > MAX_HEADER_CHARS:
            raise DataError(
                f"{path}: its header line is over {MAX_HEADER_CHARS:,} characters (a prompt "
                f"set has at most {MAX_COLUMNS:,} columns)"
            )
        reader = csv.reader(itertools.chain([header], text))
        names = next(reader, [])
        used = {name: names.index(name) for name in _chosen(path, names, choose)}
        number = 0
        for cells in reader:
            if not cells:
                continue  # a blank line
            number += 1
            if len(cells) > len(names):
                raise DataError(
                    f"{path} row {number}: {len(cells):,} fields, but the header names "
                    f"{len(names):,} columns"
                )
            yield {name: cells[i] if i < len(cells) else None for name, i in used.items()}


def _json_rows(path: Path, choose: Choose) -> Iterator[dict[str, Any]]:
    """A JSON list of objects, or one object a line; numbers keep their digits."""
    try:
        text = read_text(path, MAX_DATA_BYTES)
    except UnsafeFileError as exc:
        raise DataError(str(exc)) from None
    try:
        rows = json.loads(text, parse_int=str, parse_float=str)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise
        lines = (line for line in text.splitlines() if line.strip())
        rows = [json.loads(line, parse_int=str, parse_float=str) for line in lines]
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise DataError(f"{path}: expected a list of JSON objects, or one object a line")
    if not rows:
        return iter(())
    used = _chosen(path, list(dict.fromkeys(key for row in rows for key in row)), choose)
    return ({name: row.get(name) for name in used} for row in rows)


def _parquet_rows(path: Path, choose: Choose) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet

    with _opened(path) as file:
        parquet = pyarrow.parquet.ParquetFile(file)
        meta = parquet.metadata
        used = _chosen(path, parquet.schema_arrow.names, choose)
        if meta.num_rows > MAX_RECORDS:
            raise DataError(
                f"{path}: {meta.num_rows:,} rows (its Parquet metadata), over the "
                f"{MAX_RECORDS:,} limit of a prompt set"
            )
        claimed = sum(
            group.column(i).total_uncompressed_size
            for group in map(meta.row_group, range(meta.num_row_groups))
            for i in range(group.num_columns)
            if group.column(i).path_in_schema.split(".")[0] in used
        )
        if claimed > MAX_DATA_BYTES:
            raise DataError(
                f"{path}: its columns {_quoted(used)} take {size_text(claimed)} uncompressed "
                f"(its Parquet metadata), over the {size_text(MAX_DATA_BYTES)} limit"
            )
        batches = parquet.iter_batches(BATCH_ROWS, columns=used, use_threads=False)
        yield from _batch_rows(path, batches, used)


def _saved_rows(path: Path, choose: Choose) -> Iterator[dict[str, Any]]:
    """The rows of a saved `datasets.Dataset`, or of a saved `DatasetDict`'s ``train``
    split: the Arrow streams its ``state.json`` names, in order."""
    import pyarrow.ipc

    root = path.resolve()
    folder = root
    if (root / "dataset_dict.json").exists():
        splits = _state(path, root / "dataset_dict.json", root).get("splits")
        if not isinstance(splits, list) or "train" not in splits:
            shown = ", ".join(map(str, splits)) if isinstance(splits, list) else "none"
            raise DataError(f"{path}: no 'train' split (splits: {shown})")
        folder = root / "train"
    entries = _state(path, folder / "state.json", root).get("_data_files")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries
    ):
        raise DataError(f"{path}: state.json's _data_files is not a list of {{filename}}")
    used: list[str] = []

    def batches() -> Iterator[Any]:
        for entry in entries:
            with _opened(folder / entry["filename"], (root,)) as file:
                reader = pyarrow.ipc.open_stream(file)
                if not used:
                    used.extend(_chosen(path, reader.schema.names, choose))
                missing = [name for name in used if name not in reader.schema.names]
                if missing:
                    raise DataError(f"{path}: {entry['filename']} has no column {missing[0]!r}")
                for batch in reader:
                    yield batch.select(used)

    return _batch_rows(path, batches(), used)


def _state(path: Path, file: Path, root: Path) -> dict[str, Any]:
    """A saved dataset's JSON file (``state.json``, ``dataset_dict.json``), inside ``root``."""
    try:
        state = json.loads(read_text(file, MAX_TEXT_BYTES, (root,)))
    except (UnsafeFileError, ValueError) as exc:
        raise DataError(f"{path}: not a dataset saved by `save_to_disk` ({exc})") from None
    if not isinstance(state, dict):
        raise DataError(f"{path}: {file.name} is not a JSON object")
    return state


def _batch_rows(path: Path, batches: Iterable[Any], used: list[str]) -> Iterator[dict[str, Any]]:
    """The rows of Arrow record batches, as written; `DataError` once they decode to more
    than `MAX_DATA_BYTES`, before that batch is decoded."""
    decoded, rows = 0, 0
    for batch in batches:
        decoded += sum(_decoded_bytes(column) for column in batch.columns)
        rows += batch.num_rows
        if decoded > MAX_DATA_BYTES:
            raise DataError(
                f"{path}: its columns {_quoted(used)} decode to more than "
                f"{size_text(MAX_DATA_BYTES)} (the limit of a prompt set) by row {rows:,}"
            )
        values = [_as_written(column) for column in batch.columns]
        names = batch.schema.names
        yield from (dict(zip(names, row, strict=True)) for row in zip(*values, strict=True))


def _decoded_bytes(array: Any) -> int:
    """The bytes ``array`` takes decoded: a text dictionary's values once per row using them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_dictionary(kind) and _is_text(kind.value_type):
        lengths = pc.take(pc.binary_length(array.dictionary), array.indices)
        return (pc.sum(lengths).as_py() or 0) + 4 * len(array)
    return array.nbytes


def _as_written(array: Any) -> list[Any]:
    """A column's values: text as it is, lists and objects as they are, anything else as
    pyarrow renders it as text."""
    import pyarrow as pa

    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    if _is_text(kind) or pa.types.is_nested(kind):
        return array.to_pylist()
    return array.cast(pa.string()).to_pylist()


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)


def _quoted(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)
