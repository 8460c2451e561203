"""The keys the scenario schema allows at a place, for suggestions: an unknown key or a swept
path that names no field gets the key it most likely meant (``page_sise`` -> ``page_size``)."""
from __future__ import annotations

from attnbench.workload.messages import close_match


def _deref(node: dict, schema: dict) -> dict:
    """Follow $ref, and into the first anyOf/oneOf branch that is an object or a list."""
    for _ in range(8):
        if "$ref" in node:
            node = schema.get("$defs", {}).get(node["$ref"].rsplit("/", 1)[1], {})
        elif "anyOf" in node or "oneOf" in node:
            objs = [b for b in node.get("anyOf", node.get("oneOf")) if "$ref" in b or "properties" in b or "items" in b]
            node = objs[0] if objs else {}
        else:
            break
    return node


def _index(part) -> bool:
    return isinstance(part, int) or (isinstance(part, str) and part.isdigit())


def keys_at(schema: dict, loc: tuple) -> list[str]:
    """The keys allowed beside the last part of ``loc`` (a path into a scenario document)."""
    node = schema
    for part in loc[:-1]:
        node = _deref(node, schema)
        node = node.get("items", {}) if _index(part) else node.get("properties", {}).get(part, {})
    return list(_deref(node, schema).get("properties", {}))


def sweep_key_problems(schema: dict, keys: list[str], where: str) -> list[str]:
    """One message per swept key that names no field of a scenario, with the key meant."""
    out = []
    for key in keys:
        parts = tuple(key.split("."))
        for i, part in enumerate(parts):
            if _index(part):
                continue
            allowed = keys_at(schema, parts[: i + 1])
            if allowed and part not in allowed:
                meant = close_match(part, allowed)
                fix = ".".join(parts[:i] + (meant,) + parts[i + 1:]) if meant else ""
                here = ".".join(parts[:i]) or "a scenario"
                out.append(f"{where}: sweep.{key}: {here} has no key {part!r}"
                           + (f"; did you mean sweep.{fix}?" if fix else f" (keys: {', '.join(allowed)})"))
                break
    return out
