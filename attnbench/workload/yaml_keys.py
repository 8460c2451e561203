"""Scenario YAML as ``yaml.safe_load`` reads it, except that a key written twice in one
mapping is an error (PyYAML keeps the last one silently: ``batch:`` twice ran the second and
``validate`` said ✓)."""
from __future__ import annotations

from typing import Any

import yaml

from attnbench.workload.units import short_repr


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key written twice in one mapping (PyYAML keeps the last
    one silently: `batch:` twice would run the second and `validate` would say ✓)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            try:
                key = self.construct_object(key_node, deep=True)
                hash(key)
            except (TypeError, yaml.YAMLError, RecursionError):
                continue  # the base class reports unhashable keys
            if key in seen and key_node.tag != "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {short_repr(key)} appears twice in one mapping (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str) -> Any:
    """``yaml.safe_load`` with ``_UniqueKeyLoader`` (a SafeLoader: no Python objects)."""
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
