"""Dotted paths into a scenario document (``--set model.head_dim=64``, ``sweep:`` keys): set a
value at a path, parse a ``KEY=VALUE`` override; the document itself read from YAML text. Errors are :class:`ScenarioError` naming the path."""
from __future__ import annotations

import copy
import io
import os
import re
from typing import Any

import yaml

from attnbench.workload.messages import ScenarioError, check_shape
from attnbench.workload.units import short_repr
from attnbench.workload.yaml_keys import safe_load_unique


def set_path(doc: Any, path: str, value: Any, where: str) -> None:
    parts = path.split(".")
    if not path or any(p == "" for p in parts):
        raise ScenarioError(f"{where}: {short_repr(path)} is not a dotted path such as model.head_dim or batch.0.context")
    node = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not re.fullmatch(r"[0-9]{1,9}", part) or int(part) >= len(node):
                raise ScenarioError(
                    f"{where}: {short_repr(here)}: no item {short_repr(part)} (the list has {len(node)} items, 0..{len(node) - 1})"
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        else:
            raise ScenarioError(f"{where}: {short_repr(here)}: cannot set a key inside a {type(node).__name__}")


def own_path(doc: Any, path: str) -> None:
    """Replace every list and mapping on the way to ``path`` in ``doc`` by a shallow copy of
    itself, so that :func:`set_path` then changes ``doc`` alone, never a container it shares
    with another document (a sweep's cases share everything they do not set: copying the whole
    file per case made loading quadratic in the cases, issue 59). Stops where the path does."""
    node = doc
    for part in path.split(".")[:-1]:
        if isinstance(node, dict):
            key: Any = part
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            key = int(part)
        else:
            return
        child = node[key] if isinstance(node, list) or key in node else None
        if not isinstance(child, (dict, list)):
            return
        node[key] = child = copy.copy(child)
        node = child


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ScenarioError(f"--set {short_repr(text)}: expected KEY=VALUE, e.g. --set model.head_dim=64")
    key, value = text.split("=", 1)
    try:
        parsed = safe_load_unique(value) if value.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):  # not YAML: the text as written
        return key.strip(), value
    check_shape(parsed, f"--set {short_repr(text)}")
    return key.strip(), parsed


def read_file(p: os.PathLike, path: str, max_bytes: int) -> str:
    """A scenario file's text, refused by its size before it is read: at most ``max_bytes + 1``
    bytes are read (a 20 GB file was read whole: MemoryError, or 53 s and 337 MB to refuse 100 MB).
    Decoded and its newlines translated as ``Path.read_text`` does (the scenario hash is of this text)."""
    with open(p, "rb") as f:
        data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            size = os.fstat(f.fileno()).st_size
            big = f"{size} bytes" if size > max_bytes else f"more than {max_bytes} bytes"
            raise ScenarioError(f"{path}: {big}; a scenario file is at most {max_bytes} bytes ({max_bytes >> 20} MiB): "
                                "is this the scenario file? (a long sweep fits in far less)")
    return io.TextIOWrapper(io.BytesIO(data)).read()


def read_mapping(text: str, path: str, max_bytes: int) -> dict:
    """The scenario document in ``text``: a YAML mapping (ScenarioError saying what is wrong
    and where: size, YAML syntax with line and column, emptiness, not a mapping)."""
    if len(text) > max_bytes:
        raise ScenarioError(f"{path}: {len(text)} characters; a scenario file is at most {max_bytes}")
    try:
        raw = safe_load_unique(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [""])[0]
        raise ScenarioError(f"{path}: not valid YAML{at}: {' '.join(str(problem).split())}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise ScenarioError(f"{path}: not valid YAML: {short_repr(str(e), 120)}") from None
    check_shape(raw, path)
    if raw is None:
        raise ScenarioError(f"{path}: the file is empty; it needs at least model: and batch:")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: the file must hold a mapping (model:, batch:, ...), not {type(raw).__name__}")
    return raw
