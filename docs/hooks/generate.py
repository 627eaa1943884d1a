"""MkDocs hook: the generated parts of the site, made from the code and the committed results at
every build, so they cannot drift from them.

- ``<!-- generated: config-reference -->`` becomes the table of every `GRPOConfig` field
  (`config_reference`): its type, default, allowed range and the comments beside and above it
  in ``core_engine/rl/config.py``, read with `ast` and `tokenize` (nothing is imported but the
  torch-free range table, `core_engine.rl.limits.TRAINER_FIELDS`).
- ``<!-- generated: benchmarks -->`` becomes the tables of every ``docs/benchmarks/*.json``
  (`benchmarks.render_docs`), each with when, where and at which commit it was measured.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
CONFIG_SOURCE = ROOT / "core_engine" / "rl" / "config.py"
CONFIG_CLASS = "GRPOConfig"
CONFIG_MARKER = "<!-- generated: config-reference -->"
BENCHMARKS_MARKER = "<!-- generated: benchmarks -->"
REQUIRED = "required"
BENCHMARK_RESULTS = ROOT / "docs" / "benchmarks"


@dataclass(frozen=True)
class ConfigField:
    """One field of the config dataclass as its source writes it."""

    name: str
    annotation: str
    default: str  # the default's source text, or REQUIRED
    comment: str  # the comment lines above the field, then the one beside it


def _comments(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line (without its ``#``)."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def config_fields(path: Path = CONFIG_SOURCE, class_name: str = CONFIG_CLASS) -> list[ConfigField]:
    """Every annotated field of ``class_name`` in ``path``, in order, with its comments: the
    block of comment-only lines right above it and the comment ending its own lines."""
    source = path.read_text()
    lines = source.splitlines()
    comments = _comments(source)
    [cls] = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == class_name
    ]
    fields = []
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        default = REQUIRED if node.value is None else ast.unparse(node.value)
        text = " ".join(above + beside)
        fields.append(ConfigField(node.target.id, ast.unparse(node.annotation), default, text))
    return fields


def _range(name: str) -> str:
    from core_engine.rl.limits import TRAINER_FIELDS

    row = TRAINER_FIELDS.get(name)
    if row is None:
        return ""
    if row.kind is bool:
        return "true / false" + (" / absent" if row.optional else "")
    low = f"{'>' if row.above_low else '>='} {_number(row.low)}"
    return f"{low}, <= {_number(row.high)}" + (" (or absent)" if row.optional else "")


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference(path: Path = CONFIG_SOURCE) -> str:
    """The Markdown table of every field of the config (see the module docstring)."""
    rows = [
        "| field | type | default | range | what it is (from the source) |",
        "|---|---|---|---|---|",
    ]
    for field in config_fields(path):
        rows.append(
            f"| `{field.name}` | `{_cell(field.annotation)}` | `{_cell(field.default)}` | "
            f"{_range(field.name)} | {_cell(field.comment)} |"
        )
    return "\n".join(rows)


def _load(path: Path) -> ModuleType:
    """The module of the file at ``path`` (MkDocs loads hooks by path, outside any package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if BENCHMARKS_MARKER in markdown:
        rendered = _load(ROOT / "benchmarks" / "render_docs.py").render_all(BENCHMARK_RESULTS)
        markdown = markdown.replace(BENCHMARKS_MARKER, rendered)
    return markdown


if str(ROOT) not in sys.path:  # MkDocs loads this file by path: the project's packages
    sys.path.insert(0, str(ROOT))
