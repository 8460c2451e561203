"""The house rules of the package layout, read off the source (no imports executed).

Layers, lowest first: ``workload`` < ``backend`` (the plugin contract) and ``measure`` < ``kernels``
(attnbench's own Triton and Gluon kernels) < the built-in ``backends`` < ``store`` < ``execute`` and
``analyze`` < ``cli``. A module imports its own layer's package or lower ones, never upward or sideways;
no import cycle; no ``_private`` name imported from another module; no module over 400 lines and no
function over 60 lines but the device code of a ``@triton.jit`` or ``@gluon.jit`` kernel.

``scripts/`` is covered too: each script lives in the folder of its purpose (``SCRIPT_FOLDERS``);
scripts call the package and the package never imports a script; no script takes a ``_private``
name of the package; report scripts read run folders through ``attnbench.store`` (never by
parsing rows.jsonl, results.csv or manifest.json themselves).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANK = {"workload": 0, "backend": 1, "measure": 1, "kernels": 1.25, "backends": 1.5, "store": 2, "execute": 3,
        "analyze": 3, "cli": 4}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
JIT_DECORATORS = {"jit"}  # @triton.jit, @gluon.jit: device code, whose length is the kernel's


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_no_private_name_imported_across_modules():
    bad = [
        f"{mod}:{line} imports {n} from {target}"
        for mod in MODULES
        for target, names, line in _imports(mod)
        for n in names
        if n.startswith("_") and not n.startswith("__") and target != mod
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
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


def _jitted(node: ast.FunctionDef) -> bool:
    """Whether ``node`` is a kernel's device code (``@triton.jit``, ``@gluon.jit``, with or without arguments)."""
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and d.attr in JIT_DECORATORS:
            return True
    return False


def test_kernels_sit_below_the_backends():
    """attnbench/kernels/ imports no backend adapter (nor anything above): the adapters plan and run through it."""
    bad = [f"{mod}:{line} imports {target}" for mod in MODULES if _layer(mod) == "kernels"
           for target, _, line in _imports(mod) if _layer(target) not in (None, "kernels", "workload")]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_and_function_sizes(mod):
    path = MODULES[mod]
    text = path.read_text()
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_MODULE_LINES})"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _jitted(node)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


# ---------------------------------------------------------------------------- scripts/
SCRIPT_FOLDERS = {
    "gpu": "runs on the GPU machine: setup, validation, benchmarks, their checks",
    "report": "turns run folders into docs and summaries (reads them through attnbench.store)",
    "dev": "developer tools: the triton plan's timing table, the synthetic serving trace",
    "ci": "the CI gate",
}
SCRIPT_SHIMS: set = set()  # scripts kept outside a purpose folder (none)
RUN_FILES = ("rows.jsonl", "results.csv", "manifest.json")


def _script_files() -> list[Path]:
    return sorted(p for p in (ROOT / "scripts").rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _scripts_py() -> list[Path]:
    return [p for p in _script_files() if p.suffix == ".py"]


def _top_imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names taken from it, line) for every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append((node.module or "", [a.name for a in node.names], node.lineno))
    return out


def test_every_script_lives_in_the_folder_of_its_purpose():
    loose = [str(p.relative_to(ROOT)) for p in _script_files()
             if str(p.relative_to(ROOT)) not in SCRIPT_SHIMS and p.relative_to(ROOT / "scripts").parts[0] not in SCRIPT_FOLDERS]
    folders = "; ".join(f"scripts/{k}/: {v}" for k, v in SCRIPT_FOLDERS.items())
    assert not loose, f"scripts outside a purpose folder: {', '.join(loose)}; move each into one ({folders})"


@pytest.mark.slow
def test_the_package_never_imports_a_script():
    bad = [f"{mod}:{line} imports {target}" for mod, f in MODULES.items() for target, _, line in _top_imports(f)
           if target.split(".")[0] == "scripts"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _scripts_py(), ids=lambda p: str(p.relative_to(ROOT)))
def test_scripts_call_the_package_by_public_names(path):
    bad = []
    for target, names, line in _top_imports(path):
        if target.split(".")[0] == "scripts":
            bad.append(f"line {line}: imports {target}; a script calls the package, not another script's code")
        if not target.startswith("attnbench"):
            continue
        if target not in MODULES:
            bad.append(f"line {line}: imports {target}, which is not a module of attnbench")
        bad += [f"line {line}: imports {n} from {target}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


def _string_constants(path: Path) -> list[tuple[str, int]]:
    """String literals of ``path`` outside docstrings."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.value, n.lineno) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


@pytest.mark.parametrize("path", [p for p in _scripts_py() if p.parent.name == "report"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_report_scripts_read_run_folders_through_the_store(path):
    imports = _top_imports(path)
    assert any(t.startswith("attnbench.store") for t, _, _ in imports), \
        f"{path.relative_to(ROOT)}: reads no run folder through attnbench.store (RunFolder.load, read_rows)"
    parsed = [f"line {line}: {text!r}" for text, line in _string_constants(path) if any(f in text for f in RUN_FILES)]
    parsed += [f"line {line}: import csv" for t, _, line in imports if t == "csv"]
    assert not parsed, (f"{path.relative_to(ROOT)} opens a run folder's files itself ({'; '.join(parsed)}); "
                        "read them with attnbench.store.runfolder.RunFolder.load")
