"""Sweeps: case ids made of the swept values, and what a ``--set`` on a swept key does."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from attnbench.workload.units import format_int, short_repr


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
