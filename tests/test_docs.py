"""The documentation site (issue 43): the configuration reference generated from
``core_engine/rl/config.py`` lists every `GRPOConfig` field with its default, ``mkdocs build
--strict`` passes (a broken link, a missing page or a removed name in the API reference fails
it), the tests the architecture page names as checking each invariant exist, and every file,
module and name the pages give is in the code (issue 43 item 4)."""

import ast
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from core_engine.lora_settings import LoraSettings
from core_engine.rl.config import GRPOConfig, mode_defaults

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "generate.py"
BUILD_GUARD_S = 600  # the build takes seconds; only a hang waits this long


def _hook():
    spec = importlib.util.spec_from_file_location("docs_generate_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_lists_every_field_with_its_default():
    hook = _hook()
    reference = hook.config_reference()
    rows = {line.split("`")[1]: line for line in reference.splitlines()[2:]}
    for field in dataclasses.fields(GRPOConfig):
        assert field.name in rows, f"{field.name} is missing from the generated reference"
    assert len(rows) == len(dataclasses.fields(GRPOConfig))
    for generated in hook.config_fields():
        field = GRPOConfig.__dataclass_fields__[generated.name]
        if field.default is dataclasses.MISSING:
            assert generated.default == hook.REQUIRED
        else:
            assert ast.literal_eval(generated.default) == field.default, generated.name


def test_the_generator_reads_any_dataclass_with_the_comments_above_and_beside(tmp_path):
    source = tmp_path / "settings.py"
    source.write_text(
        "from dataclasses import dataclass\n\n\n"
        "@dataclass\n"
        "class Settings:\n"
        "    plain: int\n"
        "    # a block above,\n"
        "    # two lines long\n"
        "    commented: str = 'x'  # and one beside\n"
        "    spread: tuple[int, ...] = (\n"
        "        1,\n"
        "        2,  # beside its second line\n"
        "    )\n"
        "    CONSTANT = 3\n"
        "\n"
        "    def method(self) -> None:\n"
        "        local: int = 4  # not a field\n"
    )
    found = _hook().config_fields(source, "Settings")
    assert [(f.name, f.annotation, f.default, f.comment) for f in found] == [
        ("plain", "int", "required", ""),
        ("commented", "str", "'x'", "a block above, two lines long and one beside"),
        ("spread", "tuple[int, ...]", "(1, 2)", "beside its second line"),
    ]


def test_the_site_builds_strictly_with_the_generated_reference(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_GUARD_S,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = (site / "jobs" / "index.html").read_text()
    assert "generated: config-reference" not in jobs
    for field in dataclasses.fields(GRPOConfig):
        assert f"<code>{field.name}</code>" in jobs, field.name
    assert "GRPOTrainer" in (site / "reference" / "training" / "index.html").read_text()


def test_the_architecture_page_names_tests_that_exist():
    page = (ROOT / "docs" / "architecture.md").read_text()
    named, path = [], None
    for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", page):
        path = match.group(1) or path
        if match.group(2):
            named.append((path, match.group(2)))
    assert len(named) >= 30
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.MULTILINE)
    ]
    assert not missing


# The pages whose claims describe the code as it is (benchmarks.md renders committed results;
# design-map-changes.md is a history of what moved).
CURRENT_PAGES = sorted(
    {*(ROOT / "docs").glob("*.md"), ROOT / "README.md"}
    - {ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "design-map-changes.md"}
)
PACKAGES = ("core_engine", "workers", "ui", "db")
CODE_PATH = re.compile(r"`((?:core_engine|workers|ui|db|benchmarks|tests|docs)/[\w./-]*)`")
DOTTED_NAME = re.compile(r"`((?:core_engine|workers|ui|db)(?:\.\w+)+)")
MODULE_RUN = re.compile(r"python -m ((?:core_engine|workers|ui|db)(?:\.\w+)*)")


def _module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _unresolved(name: str, task_names: set[str]) -> bool:
    """A dotted name is its longest prefix that is a module, then an attribute that module
    defines or imports (read from its source: nothing is imported); Celery task names too."""
    if name in task_names:
        return False
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(".".join(parts[:cut]))
        if module is not None:
            rest = parts[cut:]
            return bool(rest) and not re.search(rf"\b{rest[0]}\b", module.read_text())
    return True


def test_every_path_module_and_name_the_pages_give_exists():
    """The pages and the config reference generated into jobs.md."""
    tasks = set(re.findall(r'name="(workers\.\w+)"', (ROOT / "workers" / "tasks.py").read_text()))
    stale, checked = [], 0
    texts = {str(page.relative_to(ROOT)): page.read_text() for page in CURRENT_PAGES}
    texts["the generated config reference"] = _hook().config_reference()
    for where, text in texts.items():
        checked += sum(len(p.findall(text)) for p in (CODE_PATH, DOTTED_NAME, MODULE_RUN))
        for path in CODE_PATH.findall(text):
            if "<" not in path and not (ROOT / path.rstrip("/")).exists():
                stale.append(f"{where}: no file {path}")
        stale += [f"{where}: no {n}" for n in DOTTED_NAME.findall(text) if _unresolved(n, tasks)]
        for module in MODULE_RUN.findall(text):
            main = ROOT.joinpath(*module.split("."))
            if not ((main / "__main__.py").is_file() or main.with_suffix(".py").is_file()):
                stale.append(f"{where}: python -m {module} runs nothing")
    assert checked >= 150
    assert not stale


def test_the_defaults_the_pages_quote_for_config_fields_are_the_configs():
    """A field's default quoted in prose, "`max_turns` (default 4)" or "`keep_every` (25;",
    is `GRPOConfig`'s (a None default: the full-weight `mode_defaults`) or, for the `[lora]`
    table's fields, `LoraSettings`'."""
    fields = [*dataclasses.fields(GRPOConfig), *dataclasses.fields(LoraSettings)]
    defaults = {f.name: f.default for f in fields} | mode_defaults(False)
    quoted = re.compile(r"`(\w+)`\s*\((?:default\s+)?(-?[\d.]+(?:e-?\d+)?)[);,:]")
    wrong, checked = [], 0
    for page in CURRENT_PAGES:
        for name, value in quoted.findall(page.read_text()):
            if defaults.get(name) is None:  # not a field, or one resolved elsewhere
                continue
            checked += 1
            if float(value) != float(defaults[name]):
                wrong.append(f"{page.name}: `{name}` ({value}), the default {defaults[name]}")
    assert checked >= 8
    assert not wrong
