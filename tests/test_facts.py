"""Each fact is defined once: the request kinds, cache layouts and dtypes in workload.spec (the
scenario schema and the backend contract take them from there), a built-in backend's library,
install hint, device needs and distribution in backend.builtin.BUILTIN_INFO (the class takes them)."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from attnbench.backend import contract, registry
from attnbench.workload import spec
from attnbench.workload.scenario import json_schema


def test_the_scenario_schema_offers_the_spec_choices():
    defs = json_schema()["$defs"]

    def enum(model, field):
        prop = defs[model]["properties"][field]
        return prop.get("enum") or next(a["enum"] for a in prop["anyOf"] if "enum" in a)

    assert enum("Group", "kind") == list(spec.KINDS) and contract.KINDS is spec.KINDS
    assert enum("KVCache", "layout") == list(spec.LAYOUTS)
    assert enum("ModelShape", "dtype") == list(spec.DTYPE_NAMES)
    assert enum("KVCache", "dtype") == list(spec.KV_DTYPES)
    assert enum("KVCache", "scale") == list(spec.KV_SCALES) and enum("KVCache", "order") == list(spec.KV_ORDERS)


@pytest.mark.parametrize("name", sorted(registry.BUILTIN_INFO))
def test_a_builtin_backend_takes_its_facts_from_the_table(name):
    info, cls = registry.BUILTIN_INFO[name], registry.get_backend_class(name)
    assert f"{cls.__module__}:{cls.__qualname__}" == info.target == registry.BUILTIN[name]
    assert {f: getattr(cls, f) for f in registry.BUILTIN_FACTS} == {f: getattr(info, f) for f in registry.BUILTIN_FACTS}
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    restated = [t.id for node in body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name) and t.id in registry.BUILTIN_FACTS]
    assert not restated, f"{cls.__name__} sets {restated} again; they live in backend.builtin.BUILTIN_INFO[{name!r}]"


def test_a_plugin_subclass_keeps_its_own_facts():
    from attnbench.backends.sdpa import SdpaBackend

    class Mine(SdpaBackend):
        name = "sdpa"  # the name of a built-in, but not its class: the table does not apply
        library = "mylib"

    assert Mine.library == "mylib" and SdpaBackend.library is None
