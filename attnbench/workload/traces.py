"""Engine step traces -> a scenario (``attnbench import``): time the batches an engine ran.

The format read (``attnbench-steps``, JSON Lines, one object per engine step):

    {"step": 0, "requests": [{"query_len": 1, "context_len": 812},
                             {"query_len": 64, "context_len": 0},
                             {"query_len": 5, "context_len": 300, "spec_tokens": 4}]}

* ``query_len``: the tokens of this request attended this step (1 for a decode, the chunk for
  a prefill, 1 + ``spec_tokens`` for a speculative verify);
* ``context_len``: the tokens already in the request's KV cache before the step;
* ``spec_tokens`` (optional, default 0): draft tokens verified this step, as a chain (the
  request becomes ``kind: tree`` with ``tree: {chain: spec_tokens}``);
* ``tree`` (optional): the draft tree verified this step, in any spelling a scenario's
  ``tree:`` takes (``{"preset": "eagle-mc_sim_7b_63"}``, ``{"parents": [-1, 0, 0, 1]}``, ...;
  ``attnbench trees``); ``query_len`` is its node count, root included (the request becomes
  ``kind: tree`` with that tree);
* ``step`` and any other key are ignored; blank lines and lines starting with ``#`` too; a key
  given twice in one object, and a line over 4 MiB, are refused.

A step's shape is its requests grouped by (kind, query, context, draft length), contexts
rounded up to a multiple of ``round_context`` (1: exact). Each distinct shape becomes one case
(a value of the scenario's ``sweep.batch``), most frequent first, its step count in a comment
and in ``weights.batch`` (workload/weights.py: what ``attnbench decide`` weighs each case by);
shapes beyond ``max_cases`` are left out and counted.
"""
from __future__ import annotations

import codecs
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from attnbench.workload.units import format_int

Group = tuple[str, int, int, str]  # kind, query, context, the tree's YAML ("" unless a tree)
Shape = tuple[tuple[Group, int], ...]  # (group, count), sorted


class TraceError(ValueError):
    """A line of the trace that cannot be read: the message names the file, line and field."""


@dataclass
class Imported:
    shapes: list[tuple[Shape, int]]  # (shape, steps), most frequent first, at most max_cases
    steps: int  # steps read
    dropped_steps: int  # steps of the shapes left out


def _int_field(req: dict, name: str, where: str, least: int, default: Optional[int] = None) -> int:
    v = req.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise TraceError(f"{where}: {name} must be an integer >= {least}, got {v!r}")
    return v


def _tree_text(req: dict, q: int, spec: int, where: str) -> str:
    """The verified tree's YAML (flow style): ``tree`` as given, else a chain of ``spec``."""
    if "tree" not in req:
        if spec and q != spec + 1:
            raise TraceError(f"{where}: query_len {q} with spec_tokens {spec}: a verify step attends "
                             f"spec_tokens + 1 = {spec + 1} tokens")
        return f"{{chain: {spec}}}" if spec else ""
    from attnbench.workload.trees import TreeError, parse_tree

    try:
        nodes = len(parse_tree(req["tree"], "tree"))
    except TreeError as e:
        raise TraceError(f"{where}: {e}") from None
    if q != nodes or (spec and spec != nodes - 1):
        raise TraceError(f"{where}: query_len {q}" + (f" and spec_tokens {spec}" if spec else "")
                         + f" for a tree of {nodes} nodes: query_len is the node count, root included"
                         + f" ({nodes}), spec_tokens the drafts ({nodes - 1})")
    return json.dumps(req["tree"], separators=(", ", ": "), sort_keys=True)


def request_group(req, where: str, round_context: int) -> Group:
    """One request of a step as (kind, query, context, the verified tree's YAML)."""
    if not isinstance(req, dict):
        raise TraceError(f"{where}: a request must be an object with query_len and context_len, got {req!r}"[:200])
    q = _int_field(req, "query_len", where, 1)
    ctx = _int_field(req, "context_len", where, 0)
    spec = _int_field(req, "spec_tokens", where, 0, 0)
    ctx = -(-ctx // round_context) * round_context  # integers only: a huge context cannot overflow a float
    tree = _tree_text(req, q, spec, where)
    if tree:
        return ("tree", q, ctx, tree)
    return ("decode", 1, ctx, "") if q == 1 else ("prefill", q, ctx, "")


def step_shape(obj, where: str, round_context: int) -> Shape:
    if not isinstance(obj, dict) or not isinstance(obj.get("requests"), list) or not obj["requests"]:
        raise TraceError(f"{where}: a step is an object with a non-empty list `requests` "
                         '(e.g. {"requests": [{"query_len": 1, "context_len": 100}]})')
    groups = Counter(request_group(r, f"{where}: requests[{i}]", round_context) for i, r in enumerate(obj["requests"]))
    order = {"decode": 0, "prefill": 1, "tree": 2}
    return tuple(sorted(groups.items(), key=lambda gc: (order[gc[0][0]], gc[0][1:])))


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                         "save the trace as UTF-8") from None


#: the longest line read: a step of thousands of requests or a tree of thousands of nodes is a few
#: hundred KiB; a longer line is refused before it is read whole (a 1 GB line took 3.2 GB)
MAX_LINE_BYTES = 4 << 20


def _unique_keys(pairs: list) -> dict:
    """A JSON object's members as a dict; a key given twice is refused, as in a scenario's YAML."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise TraceError(f"key {key!r} appears twice in one object; keep one")
        out[key] = value
    return out


def _parse(line: str, where: str):
    try:
        return json.loads(line, object_pairs_hook=_unique_keys)
    except TraceError as e:
        raise TraceError(f"{where}: {e}") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply to be a step (a step is an object with a list "
                         "`requests` of objects)") from None
    except ValueError as e:
        raise TraceError(f"{where}: not JSON ({e})") from None


def read_trace(path: Path, round_context: int = 1, max_cases: int = 32) -> Imported:
    """Every step of a trace file, grouped into distinct shapes."""
    if round_context < 1 or max_cases < 1:
        raise TraceError("--round-context and --max-cases must be at least 1")
    counts: Counter = Counter()
    first_seen: dict[Shape, int] = {}
    with open(path, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise TraceError(f"{path}:{n}: a line longer than {MAX_LINE_BYTES} bytes ({MAX_LINE_BYTES >> 20} MiB); "
                                 "a step is one JSON object per line (is this a trace in JSON Lines?)")
            line = _decode(raw[3:] if n == 1 and raw.startswith(codecs.BOM_UTF8) else raw, f"{path}:{n}")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            shape = step_shape(_parse(line, f"{path}:{n}"), f"{path}:{n}", round_context)
            counts[shape] += 1
            first_seen.setdefault(shape, n)
    if not counts:
        raise TraceError(f"{path}: no steps (one JSON object per line with a `requests` list)")
    ranked = sorted(counts.items(), key=lambda sc: (-sc[1], first_seen[sc[0]]))
    kept = ranked[:max_cases]
    return Imported(kept, sum(counts.values()), sum(c for _, c in ranked[max_cases:]))


def group_fields(g: Group, count: int) -> dict:
    """One group of a step as the scenario's batch entry (the tree as data, read back from its text)."""
    kind, q, ctx, tree = g
    if kind == "decode":
        return {"kind": "decode", "count": count, "context": ctx}
    if kind == "prefill":
        return {"kind": "prefill", "count": count, "query": q, "context": ctx}
    return {"kind": "tree", "count": count, "context": ctx, "tree": yaml.safe_load(tree)}


def _tree_word(tree: str, q: int) -> str:
    """The verified tree as the run's tables spell it (``chain3``, ``tree(26)``)."""
    from attnbench.workload.spec import tree_word
    from attnbench.workload.trees import TreeError, parse_tree

    try:
        parents = parse_tree(yaml.safe_load(tree), "tree")
    except (TreeError, yaml.YAMLError):
        parents = None
    return tree_word(parents, q)


def describe(shape: Shape) -> str:
    parts = []
    for (kind, q, ctx, tree), n in shape:
        at = f"@{format_int(ctx)}"  # as the run's batch text (spec.describe) writes it
        parts.append(f"{n} decode{at}" if kind == "decode" else f"{n} prefill {q}" + (at if ctx else "")
                     if kind == "prefill" else f"{n} {_tree_word(tree, q)}{at}")
    return " + ".join(parts)


class _Dumper(yaml.SafeDumper):
    """Strings holding a line break or anything unprintable are written double-quoted, escaped
    (one line, never a multi-line scalar a reader could take for several keys)."""


def _represent_str(dumper: yaml.SafeDumper, value: str):
    style = '"' if not (value.isascii() and value.isprintable()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _flow(value) -> str:
    """One value as YAML on one line, through the serializer: a name like ``yes``, ``123`` or
    ``2026-01-01`` comes back quoted (a string), a newline as an escape."""
    text = yaml.dump([value], Dumper=_Dumper, default_flow_style=True, width=float("inf"), sort_keys=False)
    return text.strip()[1:-1]  # the one-item list's brackets off: the value, never an open-ended scalar


def _comment(text: str) -> str:
    """Text for a comment line: every line break and non-ASCII character escaped (YAML also ends a
    line at U+0085, U+2028 and U+2029), so nothing after it is read as YAML."""
    return json.dumps(text, ensure_ascii=True)[1:-1]


def scenario_doc(imp: Imported, source: str, name: str, model: dict, page_size: int) -> dict:
    """The scenario as data: one case per shape (``sweep.batch``), its steps in ``weights.batch``."""
    batches = [[group_fields(g, c) for g, c in shape] for shape, _ in imp.shapes]
    return {"name": name, "description": f"batches replayed from {Path(source).name} ({imp.steps} steps)",
            "seed": 0, "device": "auto", "model": dict(model),
            "kv_cache": {"page_size": page_size, "layout": "shuffled"},
            "batch": batches[0], "sweep": {"batch": batches}, "weights": {"batch": [steps for _, steps in imp.shapes]},
            "timing": {"warmup_ms": 5, "measure_ms": 40}}


def scenario_yaml(imp: Imported, source: str, name: str, model: dict, page_size: int, round_context: int) -> str:
    """The scenario text: one case per shape (``sweep.batch``), counts in comments and in
    ``weights.batch``. Every value is written by the YAML serializer (never formatted into the
    text), and the text is read back and compared with the data it was made from: a path, name,
    dtype or tree can add no key."""
    doc = scenario_doc(imp, source, name, model, page_size)
    lines = [f"# Imported by `attnbench import` from {_comment(source)}: {imp.steps} steps, {len(imp.shapes)} "
             f"distinct shape(s) kept" + (f", {imp.dropped_steps} step(s) of rarer shapes left out" if imp.dropped_steps else "")
             + (f"; contexts rounded up to a multiple of {round_context}" if round_context > 1 else "") + ".",
             "# One case per shape (a value of sweep.batch), most frequent first; each says how many steps had it."]
    lines += [f"{key}: {_flow(doc[key])}" for key in ("name", "description", "seed", "device", "model", "kv_cache", "batch")]
    lines += ["sweep:", "  batch:"]
    for i, ((shape, steps), batch) in enumerate(zip(imp.shapes, doc["sweep"]["batch"])):
        lines.append(f"    # shape {i}: {steps} of {imp.steps} steps: {describe(shape)}")
        lines.append(f"    - {_flow(batch)}")
    lines += ["# attnbench decide: the steps each shape stands for, one per value of sweep.batch", "weights:",
              f"  batch: {_flow(doc['weights']['batch'])}", f"timing: {_flow(doc['timing'])}"]
    text = "\n".join(lines) + "\n"
    if yaml.safe_load(text) != doc:  # a guard, not a path users reach: the serializer wrote every value
        raise AssertionError("attnbench import: the scenario text does not read back as the data it was made from")
    return text
