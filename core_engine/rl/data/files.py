"""Prompt sets as people keep them: JSONL, JSON, CSV and Parquet files, and directories saved
with `datasets.Dataset.save_to_disk`, mapped to records (`core_engine.rl.data`) by `Columns`.
Every format is read by a child process whose address space is limited to
`PARSE_MEMORY_BYTES`: JSONL line by line, each malformed line named (up to `MAX_PROBLEMS`), a
line decoding past the limit named by its number; the others by
`core_engine.rl.data.tables` (the column names first, then only the columns used, values as
written, rows and decoded bytes bounded). The child maps the rows and sends back the records,
or only their count (`record_count`), so a hostile file can only end that child, and its
failure is a `DataError`; a child still reading after `READ_DEADLINE_S` is killed. A GSM8K
answer (its last line ``#### N``) gives N, commas dropped, as the reference; any other answer
is kept whole. Every path is checked first
(`core_engine.user_files`: regular, bounded). A bad file, a missing column, an empty cell the
job needs or an empty set is a `DataError` naming the file, the column and the row.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import threading
from collections.abc import Collection, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core_engine.rl.data import MAX_RECORDS, DataError, normalize_record, too_many_rows
from core_engine.rl.data.tables import column_list, table_rows
from core_engine.user_files import (
    GIB,
    MAX_DATA_BYTES,
    MIB,
    UnsafeFileError,
    dataset_dir,
    open_regular,
    regular_file,
)

FORMATS = (".jsonl", ".json", ".csv", ".parquet")
PROMPT_COLUMNS = ("question", "prompt", "problem")  # tried in order when none is named
ANSWER_COLUMNS = ("answer", "output", "solution")
RECORD_FIELDS = ("instruction", "input", "output", "messages")  # the record form's columns
RECORD_KEYS = ("instruction", "input", "output")
MAX_COLUMN_NAME = 256
MAX_SYSTEM_PROMPT = 32_768  # characters
PARSE_MEMORY_BYTES = 2 * GIB  # the reading child's address space (Python and pyarrow: ~0.3 GiB)
MAX_ERROR_CHARS = 300  # of a crashed child's last words
MAX_PROBLEMS = 20  # malformed JSONL lines reported; reading stops at the last
READ_DEADLINE_S = 600.0  # the reading child's wall-clock limit
READER = [sys.executable, "-m", __name__]  # the reading child (`_serve`)
_GSM8K_LAST_LINE = re.compile(r"####[ \t]*(-?\d[\d,]*(?:\.\d+)?)")


@dataclass(frozen=True)
class Columns:
    """Which columns hold the prompt and the reference answer (None: records in the
    instruction/messages form, else the first of `PROMPT_COLUMNS` / `ANSWER_COLUMNS`), a
    system prompt given to every record ("" for none), and whether the job needs a reference
    answer (`needs_answer`; else no answer column is required and an empty cell gives "")."""

    prompt: str | None = None
    answer: str | None = None
    system: str = ""
    needs_answer: bool = True

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

    def picked(self, names: Collection[str], where: str) -> tuple[str | None, str | None] | None:
        """(the prompt column, the answer column or None) of a row or a file with the columns
        ``names``; None for the instruction/messages form; `DataError` naming a missing one
        (an answer column is required when named or needed)."""
        if self.prompt is None and ("messages" in names or "instruction" in names):
            return None
        form = "" if self.prompt else ", nor 'instruction' or 'messages' (the record form)"
        prompt = _pick(names, self.prompt, PROMPT_COLUMNS, where, required=True, nor=form)
        needed = self.needs_answer or self.answer is not None
        return prompt, _pick(names, self.answer, ANSWER_COLUMNS, where, required=needed)


def _pick(
    names: Collection[str],
    name: str | None,
    choices: tuple[str, ...],
    where: str,
    required: bool,
    nor: str = "",
) -> str | None:
    """The column of ``names`` that is ``name``, else the first of ``choices``; `DataError`
    naming the candidates (and ``nor``, what else would have done) when none is there."""
    candidates = (name,) if name else choices
    found = next((candidate for candidate in candidates if candidate in names), None)
    if found is None and required:
        shown = " or ".join(repr(n) for n in candidates)
        raise DataError(f"{where}: no column {shown}{nor} (columns: {column_list(names)})")
    return found


def gsm8k_answer(text: str) -> str:
    """The reference of an answer: N when its last line is GSM8K's ``#### N`` (commas
    dropped), else the answer as it is (a Markdown ``####`` heading is kept)."""
    found = _GSM8K_LAST_LINE.fullmatch(text.rstrip().rpartition("\n")[2].strip())
    return found.group(1).replace(",", "") if found else text


def with_system(record: dict[str, str], system: str) -> dict[str, str]:
    """``record`` with the job's system prompt, unless the record has its own."""
    if not system or (record["instruction"] and record["input"]):
        return record
    return {**record, "instruction": system, "input": record["input"] or record["instruction"]}


def map_row(row: Mapping[str, Any], columns: Columns, where: str) -> dict[str, str]:
    """One row as a record: the instruction/messages form as is, else the mapped columns."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    picked = columns.picked(row, where)
    if picked is None:
        record = normalize_record(row, where)
    else:
        prompt = row[picked[0]]
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{where}: the prompt column {picked[0]!r} holds no text")
        answer = _answer(row, picked[1], columns.needs_answer, where)
        record = {"instruction": "", "input": prompt, "output": answer}
    return with_system({**record, "output": gsm8k_answer(record["output"])}, columns.system)


def _answer(row: Mapping[str, Any], column: str | None, needed: bool, where: str) -> str:
    """The answer cell as text; an empty one is "" unless the job needs it (`DataError`)."""
    answer = None if column is None else row[column]
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        if needed:
            raise DataError(f"{where}: the answer column {column!r} is empty")
        return ""
    return str(answer)


def load_records(path: str | Path, columns: Columns = Columns()) -> list[dict[str, str]]:
    """The records of a prompt set in any supported format (see the module docstring)."""
    return _records(Path(path), columns, keep=True)[0]


def record_count(path: str | Path, columns: Columns = Columns()) -> int:
    """How many records `load_records` returns, checked the same way; the records never reach
    this process."""
    return _records(Path(path), columns, keep=False)[1]


def _records(path: Path, columns: Columns, keep: bool) -> tuple[list[dict[str, str]], int]:
    try:
        if path.is_dir():
            dataset_dir(path, MAX_DATA_BYTES)
        else:
            regular_file(path, MAX_DATA_BYTES)
    except UnsafeFileError as exc:
        raise DataError(str(exc)) from None
    if not path.is_dir() and path.suffix.lower() not in FORMATS:
        raise DataError(f"{path}: unknown format (use {', '.join(FORMATS)} or a saved dataset)")
    records, count = _read_in_child(path, columns, keep)
    if not count:
        raise DataError(f"{path}: no usable record (an empty file or split)")
    return records, count


def _read_in_child(path: Path, columns: Columns, keep: bool) -> tuple[list[dict[str, str]], int]:
    """(the records if ``keep``, their count), read by ``python -m`` this module (`_serve`)."""
    request = json.dumps({"path": str(path), "columns": asdict(columns), "keep": keep})
    command = [*READER, str(PARSE_MEMORY_BYTES)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    records: list[dict[str, str]] = []
    result: dict[str, Any] | None = None
    with tempfile.TemporaryFile() as errors:
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        with subprocess.Popen(command, stderr=errors, env=env, **pipes) as child:
            expired = threading.Event()
            deadline = threading.Timer(READ_DEADLINE_S, lambda: (expired.set(), child.kill()))
            deadline.start()
            try:
                child.stdin.write(request.encode())
                child.stdin.close()
            except OSError:
                pass  # it ended before reading: its status says why
            try:
                for line in child.stdout:
                    answer = json.loads(line)
                    if isinstance(answer, list):
                        records.append(dict(zip(RECORD_KEYS, answer, strict=True)))
                    else:
                        result = answer
            finally:
                deadline.cancel()
        errors.seek(0)
        last_words = errors.read().decode(errors="replace").strip().rpartition("\n")[2]
    limit = f"{PARSE_MEMORY_BYTES // MIB:,} MiB"
    if result is None and expired.is_set():
        raise DataError(f"{path}: its reader was stopped after {READ_DEADLINE_S:g} s")
    if result is None:
        status = child.returncode
        how = f"signal {-status}" if status < 0 else f"exit code {status}"
        raise DataError(
            f"{path}: its reader crashed ({how}: {last_words[-MAX_ERROR_CHARS:]}); parsing it "
            f"may need more than {limit} of memory"
        )
    if "memory" in result:
        raise DataError(f"{result['memory']}: parsing it needed more than {limit} of memory")
    if "error" in result:
        raise DataError(result["error"])
    return records, result["count"]


class _LineOutOfMemory(MemoryError):
    """A JSONL line that decodes to more than the child may hold, with where it is."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def _jsonl_records(path: Path, columns: Columns) -> Iterator[dict[str, str]]:
    """The records of a JSONL file (in the child), each line parsed once; `DataError` naming
    the malformed lines once reading ends, which it does at the `MAX_PROBLEMS`-th, and past
    `MAX_RECORDS` records."""
    problems, count = [], 0
    try:
        file = open_regular(path, MAX_DATA_BYTES)
    except UnsafeFileError as exc:
        raise DataError(str(exc)) from None
    with file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = map_row(json.loads(line), columns, where)
            except UnicodeDecodeError:
                problems.append(f"{where}: not UTF-8 text")
            except json.JSONDecodeError as exc:
                problems.append(f"{where}: not valid JSON ({exc.msg})")
            except RecursionError:
                problems.append(f"{where}: nested too deeply")
            except DataError as exc:
                problems.append(str(exc))
            except MemoryError:
                raise _LineOutOfMemory(where) from None
            else:
                count += 1
                if count > MAX_RECORDS:
                    raise too_many_rows(path)
                yield record
            if len(problems) >= MAX_PROBLEMS:
                break
    if problems:
        raise DataError("malformed records:\n" + "\n".join(problems))


def _table_records(path: Path, columns: Columns) -> Iterator[dict[str, str]]:
    """The records of a file or saved dataset other than JSONL (in the child)."""

    def used(names: list[str]) -> list[str]:
        picked = columns.picked(names, str(path))
        if picked is None:
            return [name for name in RECORD_FIELDS if name in names]
        return [name for name in picked if name is not None]

    for number, row in enumerate(table_rows(path, used), start=1):
        yield map_row(row, columns, f"{path} row {number}")


def _serve(memory_bytes: int) -> None:
    """The child: ``memory_bytes`` of address space, the request on stdin; once every row is
    read, one JSON line per record kept, then ``{"count": N}``; or only ``{"error": message}``
    or ``{"memory": where}`` (the file, or its line), so a refused file's records never reach
    the caller."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    request = json.loads(sys.stdin.read())
    path, columns = Path(request["path"]), Columns(**request["columns"])
    lines: list[str] = []
    count = 0
    jsonl = not path.is_dir() and path.suffix.lower() == ".jsonl"
    try:
        for record in (_jsonl_records if jsonl else _table_records)(path, columns):
            count += 1
            if request["keep"]:
                lines.append(json.dumps([record[key] for key in RECORD_KEYS]))
        result: dict[str, Any] = {"count": count}
        sys.stdout.writelines(line + "\n" for line in lines)
    except DataError as exc:
        result = {"error": str(exc)}
    except _LineOutOfMemory as exc:
        result = {"memory": exc.where}
    except MemoryError:
        result = {"memory": str(path)}
    except Exception as exc:  # any reader failure is the file's fault
        cause = exc.__cause__ or exc
        result = {"error": f"{path}: not a readable dataset ({type(cause).__name__}: {cause})"}
    sys.stdout.write(json.dumps(result) + "\n")


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


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
