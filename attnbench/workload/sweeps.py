"""Sweeps: case ids made of the swept values, and what a ``--set`` on a swept key does."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional

from attnbench.workload.units import format_int, parse_int, short_repr


def override_sweep(raw: dict, key: str, value: Any, where: str, error: type = ValueError) -> list[str]:
    """A ``--set`` on a key the scenario sweeps wins over the sweep: that key runs the one
    value given (the case ids and the CSV column keep its name). A ``--set`` of a parent of
    swept keys (``batch.0`` while ``batch.0.context`` is swept) drops those sweeps. A ``--set``
    inside a swept value (``batch.0.context`` while ``batch.0`` is swept) is refused (``error``):
    the sweep would overwrite it. Returns notes saying what changed."""
    sweep = raw.get("sweep")
    if key.split(".")[0] == "sweep" or not isinstance(sweep, dict):
        return []
    notes = []
    for swept in [k for k in sweep if isinstance(k, str)]:
        was = short_repr(sweep[swept], 60)
        if swept == key:
            sweep[swept] = [value]
            notes.append(f"{where}: replaces the scenario's sweep of {swept} ({was}): that key runs only this value")
        elif swept.startswith(key + "."):
            del sweep[swept]
            notes.append(f"{where}: replaces the scenario's sweep of {swept} ({was}), which it contains")
        elif key.startswith(swept + "."):
            raise error(
                f"{where}: the scenario sweeps {swept} ({was}), whose values would overwrite this key; "
                f"--set {swept}=VALUE instead (it replaces the sweep), or --set sweep.{swept}=[...]"
            )
    return notes


SLUG_MAX = 80  # a swept value longer than this is shortened in the case id, with a digest


_PLAIN_GROUP = {"kind", "count", "context", "query", "tree"}


def _group_word(g: Any) -> str | None:
    """A request group in a case id, ``2decode-at192``, ``1prefill64-at64``, ``1chain3-at64``;
    None where the words would leave something out (then the value's JSON names the case)."""
    if not isinstance(g, dict) or not set(g) <= _PLAIN_GROUP or not set(g) >= {"kind", "context"}:
        return None
    count, ctx, kind = g.get("count", 1), g["context"], g["kind"]
    if not all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in (count, ctx)):
        return None
    at = f"-at{_slug(ctx)}"
    if kind == "decode" and set(g) <= {"kind", "count", "context"}:
        return f"{_slug(count)}decode{at}"
    if kind == "prefill" and "tree" not in g and isinstance(g.get("query"), (int, str)):
        return f"{_slug(count)}prefill{_slug(g['query'])}{at}"
    tree = g.get("tree")
    if kind == "tree" and "query" not in g and isinstance(tree, dict) and set(tree) == {"chain"}:
        return f"{_slug(count)}chain{_slug(tree['chain'])}{at}"
    return None


def _batch_words(value: Any) -> str | None:
    """A swept batch (a list of request groups, as ``attnbench import`` writes one per shape)
    in words: ``2decode-at192+1chain3-at64``; None unless every group has its words."""
    if not isinstance(value, list) or not value:
        return None
    words = [_group_word(g) for g in value]
    return "+".join(words) if all(words) else None


def _slug(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return format_int(value)
    words = _batch_words(value)
    if words is not None and len(words) <= SLUG_MAX:
        return words
    try:
        text = json.dumps(value, separators=(",", ":"), default=str) if not isinstance(value, str) else value
    except (TypeError, ValueError, RecursionError):  # e.g. a mapping with date keys
        text = short_repr(value)
    slug = re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"
    if len(slug) <= SLUG_MAX:
        return slug
    # never a bare cut ("head-dim-12" for 128): whole words, then a digest of the whole value
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    head = slug[: SLUG_MAX - 10].rsplit("-", 1)[0]
    return f"{head}-h{digest}"


def case_id_for(params: dict[str, Any]) -> str:
    """A readable, file-name-safe id from the swept values, e.g. ``page_size=16,context=4k``.

    Each key is shortened to its last part unless two swept keys share it."""
    if not params:
        return "default"
    lasts = [k.split(".")[-1] for k in params]
    names = [last if lasts.count(last) == 1 else key for key, last in zip(params, lasts)]
    return ",".join(f"{n}={_slug(v)}" for n, v in zip(names, params.values()))


# -- typed swept values (issue 34) ---------------------------------------------------------
# A swept value is kept as the scenario's validated value: ``context: [1k, 4k]`` is 1024 and
# 4096 in params, rows.jsonl, results.csv and JSON; ``null`` is None. Text is made only when
# rendering (``value_text``), and ``-k`` compares a word with the value, not with its text.

#: swept keys shown by another name than their last part: the cache's dtype is not the
#: results' ``dtype`` column (the model's), so tables and plots call it ``kv_dtype``
DISPLAY_NAMES = {"kv_cache.dtype": "kv_dtype"}


def _validated_at(scenario: Any, key: str) -> Any:
    """The validated scenario's value at a dotted ``key`` (``batch.0.context``); KeyError if none."""
    node = scenario
    for part in key.split("."):
        if isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        elif not isinstance(node, (list, tuple, dict)) and hasattr(node, part):
            node = getattr(node, part)
        else:
            raise KeyError(key)
    return node


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def typed_params(params: dict[str, Any], scenario: Any) -> dict[str, Any]:
    """``params`` with each scalar value replaced by the number the scenario validated it to
    (``"4k"`` -> 4096); other values (text, mappings, lists, null) as written."""
    out = {}
    for key, value in params.items():
        typed = value
        if isinstance(value, (str, float)) and not isinstance(value, bool):
            try:
                validated = _validated_at(scenario, key)
            except KeyError:
                validated = None
            if _is_number(validated):
                typed = validated
        out[key] = typed
    return out


def upgraded_params(params: dict[str, Any]) -> dict[str, Any]:
    """Params of a row written before swept values were typed: ``"4k"`` and ``"4096"`` (the
    only text a number was swept as) become 4096; everything else as it was."""
    out = {}
    for key, value in params.items():
        out[key] = _sized_int(value) if isinstance(value, str) and _sized_int(value) is not None else value
    return out


def _sized_int(text: str) -> Optional[int]:
    """``4k`` -> 4096, ``16`` -> 16; None for text that is no such integer."""
    try:
        return parse_int(text)
    except ValueError:
        return None


def display_name(key: str, keys: Any = ()) -> str:
    """How a table or plot names the swept ``key``: its last part, the full key when another
    of ``keys`` ends the same, ``DISPLAY_NAMES`` where the last part names another column."""
    if key in DISPLAY_NAMES:
        return DISPLAY_NAMES[key]
    last = key.split(".")[-1]
    return key if sum(1 for k in keys if k.split(".")[-1] == last) > 1 else last


def value_text(value: Any) -> str:
    """A swept value for a table, a plot label or a title: 4096 -> ``4k``, None -> ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return format_int(value)
    if isinstance(value, (str, float)):
        return str(value) if isinstance(value, str) else f"{value:g}"
    return short_repr(value, 40)


def value_order(value: Any) -> tuple:
    """A sort key putting null first, then numbers by value, then the rest by text."""
    if value is None:
        return (0, 0.0, "")
    if _is_number(value):
        return (1, float(value), "")
    return (2, 0.0, json.dumps(value, sort_keys=True, default=str))


def key_matches(word_key: str, key: str) -> bool:
    """A ``-k`` word's key (lower case) names the swept ``key``: its full path, its last part
    or its display name (``kv_dtype``)."""
    key = key.lower()
    return word_key in (key, key.split(".")[-1], DISPLAY_NAMES.get(key, key))


def value_matches(value: Any, word_value: str) -> bool:
    """A ``-k`` word's value (lower case) is the swept ``value``: its YAML spelling (``4k``,
    ``4096``, ``fp8_e4m3``, ``null``) or its case-id spelling (``fp8-e4m3``)."""
    if value is None:
        return word_value in ("null", "none", "~")
    if _is_number(value):
        if _sized_int(word_value) is not None:
            return _sized_int(word_value) == value
        try:
            return float(word_value) == float(value)
        except ValueError:
            return False
    if isinstance(value, str) and value.lower() == word_value:
        return True
    return _slug(value).lower() == word_value
