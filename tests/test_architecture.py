"""The map of DESIGN.md holds in the tree: ``ui -> workers -> core_engine``, ``ui -> db``,
``workers -> db``, nothing upward; no import cycle between modules, counting the imports inside
functions too; no module over 350 lines."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core_engine", "db", "workers", "ui")
MAY_IMPORT = {
    "core_engine": {"core_engine"},
    "db": {"db"},
    "workers": {"workers", "core_engine", "db"},
    "ui": {"ui", "workers", "db"},
}
MAX_LINES = 350


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, module: str) -> set[str]:
    """The absolute names ``path`` imports, wherever the import statement is (module level,
    inside a function, under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
            names.add(base)
    return names


def test_no_layer_imports_upward():
    wrong = []
    for module, path in _modules().items():
        layer = module.partition(".")[0]
        for name in _imports(path, module):
            target = name.partition(".")[0]
            if target in PACKAGES and target not in MAY_IMPORT[layer]:
                wrong.append(f"{module} imports {name}")
    assert not wrong


def test_no_import_cycle_between_modules():
    """Not even through a function-level import: a circle that only runs late is still a
    circle (`workers.control` and `workers.submission` exist to break two)."""
    modules = _modules()
    graph = {
        module: {name for name in _imports(path, module) if name in modules} - {module}
        for module, path in modules.items()
    }
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            raise AssertionError("import cycle: " + " -> ".join([*trail, module]))
        if module in done:
            return
        for target in sorted(graph[module]):
            if not module.startswith(target + "."):  # a package's own __init__
                visit(target, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_no_module_is_over_350_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long


# Inside core_engine (DESIGN.md): the model imports nothing else of the project, the KV cache
# at most the model's config; the runtime sits below the scheduler; rl and network are peers.
# The shipped policies' builders (policies) sit above the RL core, which knows a shipped policy
# only by its name, resolved by the assets (which import nothing of the project).
ONLY = {
    "core_engine.model": ("core_engine.model",),
    "core_engine.cache": ("core_engine.cache", "core_engine.model.config"),
    "core_engine.assets": ("core_engine.assets",),
}
NEVER = {
    "core_engine.runtime": ("core_engine.scheduler", "core_engine.serving", "core_engine.rl"),
    "core_engine.rl": ("core_engine.network", "core_engine.policies"),
    "core_engine.network": ("core_engine.rl", "core_engine.policies"),
}


def test_core_engine_layers():
    wrong = []
    for module, path in _modules().items():
        part = ".".join(module.split(".")[:2])
        for name in _imports(path, module):
            if not name.startswith("core_engine"):
                continue
            if part in ONLY and not name.startswith(ONLY[part]):
                wrong.append(f"{module} imports {name}")
            if name.startswith(NEVER.get(part, ("-",))):
                wrong.append(f"{module} imports {name}")
    assert not wrong
