"""The house rules of the package layout, read off the source (no imports executed).

Layers, lowest first: ``workload`` < ``backend`` (the plugin contract) and ``measure`` < the built-in
``backends`` < ``store`` < ``execute`` and ``analyze`` < ``cli``. A module imports
its own layer's package or lower ones, never upward or sideways; no import cycle; no
``_private`` name imported from another module; no module over 400 lines and no function
over 60 lines outside the Triton kernels.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANK = {"workload": 0, "backend": 1, "measure": 1, "backends": 1.5, "store": 2, "execute": 3, "analyze": 3, "cli": 4}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
KERNEL_FILES = {"attnbench/backends/triton_kernels.py", "attnbench/backends/triton_mla_kernels.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted((ROOT / "attnbench").rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        out[".".join(p for p in parts if p != "__init__")] = f
    return out


MODULES = _modules()


def _layer(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".")
    if not MODULES[mod].name == "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every attnbench import in ``mod``."""
    tree = ast.parse(MODULES[mod].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("attnbench")]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(mod, node)
            if not target.startswith("attnbench"):
                continue
            names = []
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in MODULES:
                    out.append((sub, [], node.lineno))
                else:
                    names.append(a.name)
            if names:
                out.append((target, names, node.lineno))
    return out


def test_no_upward_or_sideways_import():
    bad = []
    for mod in MODULES:
        src = _layer(mod)
        if src is None:
            continue
        for target, _, line in _imports(mod):
            dst = _layer(target)
            if dst is None or dst == src:
                continue
            if RANK[dst] >= RANK[src]:
                bad.append(f"{mod}:{line} imports {target} ({dst} is not below {src})")
    assert not bad, "\n".join(bad)


def test_no_private_name_imported_across_modules():
    bad = [
        f"{mod}:{line} imports {n} from {target}"
        for mod in MODULES
        for target, names, line in _imports(mod)
        for n in names
        if n.startswith("_") and not n.startswith("__") and target != mod
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    graph = {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_and_function_sizes(mod):
    path = MODULES[mod]
    text = path.read_text()
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_MODULE_LINES})"
    if str(path.relative_to(ROOT)) in KERNEL_FILES:
        return
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
