"""vLLM's compact batch grammar: ``"2q1k_32q1s4k"`` = 2 prefills of 1024 tokens + 32 decodes
over 4096-token contexts. A group is ``[<count>]q<query>[s<kv_len>]``; ``k`` = x1024; ``_``
joins groups. ``s`` gives the total KV length (context + query); without it the group has no
context. A group with query 1 is a decode, any other a (possibly chunked) prefill.
"""
from __future__ import annotations

import re

from attnbench.workload.units import parse_int, short_repr

_NUM = r"[0-9]{1,12}[kKmM]?"
_GROUP = re.compile(rf"^({_NUM})?q({_NUM})(?:s({_NUM}))?$")
MAX_GROUPS = 4096


def parse_batch_string(text: str) -> list[dict]:
    """-> the list-of-groups form of a scenario's ``batch`` (``kind``, ``count``, ``query``, ``context``)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected a batch string such as '2q1k_32q1s4k'")
    parts = text.strip().split("_")
    if len(parts) > MAX_GROUPS:
        raise ValueError(f"{len(parts)} groups is more than {MAX_GROUPS}; merge equal groups with a count, e.g. '32q1s4k'")
    groups = []
    for part in parts:
        m = _GROUP.match(part)
        if not m:
            raise ValueError(
                f"group {short_repr(part)} is not <count>q<query>[s<kv_len>] (e.g. '32q1s4k': 32 decodes over 4096 tokens)"
            )
        count = parse_int(m.group(1)) if m.group(1) else 1
        query = parse_int(m.group(2))
        kv_len = parse_int(m.group(3)) if m.group(3) else query
        if count < 1 or query < 1:
            raise ValueError(f"group {short_repr(part)}: count and query must be at least 1")
        if kv_len < query:
            raise ValueError(f"group {short_repr(part)}: kv_len s{kv_len} is shorter than query q{query}")
        kind = "decode" if query == 1 else "prefill"
        groups.append({"kind": kind, "count": count, "query": query, "context": kv_len - query})
    return groups
