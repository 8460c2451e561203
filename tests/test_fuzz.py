"""Property-based tests: hostile and malformed input never gives a traceback or a hang.

Every scenario document, YAML text, ``--set`` override, tree spelling and batch string
either loads or fails with the loader's own error type (ScenarioError, TreeError,
ValueError) whose message names the field: one line per wrong field, each starting with
the file name. Examples are derandomized so CI is reproducible; set ATTNBENCH_FUZZ=10 to
run ten times as many (random) examples locally.
"""
import math
import os
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.workload.batchstr import parse_batch_string
from attnbench.workload.units import safe_name
from attnbench.workload.scenario import ScenarioError, load_text
from attnbench.workload.trees import SPELLINGS, TreeError, parse_tree

SCALE = float(os.environ.get("ATTNBENCH_FUZZ", "1"))
COUNTS: dict[str, int] = {}


def cfg(n: int):
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=2000,  # ms per example: a hang or a quadratic blow-up fails the test
        derandomize=SCALE == 1,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


def count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


def teardown_module(module):
    print(f"\nfuzz examples: {sum(COUNTS.values())} {COUNTS}")


PATH = "fuzz.yaml"
BASE = {
    "name": "fz",
    "seed": 1,
    "device": "cpu",
    "model": {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 8, "dtype": "float32"},
    "kv_cache": {"page_size": 4, "layout": "shuffled"},
    "batch": [
        {"kind": "decode", "count": 2, "context": 9},
        {"kind": "prefill", "query": 3, "context": 2},
        {"kind": "tree", "context": 5, "tree": {"choices": [[0], [1], [0, 0]]}},
    ],
    "sweep": {"kv_cache.page_size": [4, 8]},
    "timing": {"warmup_ms": 1, "measure_ms": 5},
}
BASE_TEXT = yaml.safe_dump(BASE, sort_keys=False)

# -- value strategies ------------------------------------------------------------------------
big_ints = st.one_of(
    st.integers(-3, 70000), st.integers(), st.sampled_from([2**31, 2**63, 2**64 + 1, 10**30, -(10**30)])
)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1e300, -0.0, 4096.0]))
words = st.sampled_from(
    ["", "4k", "1m", "99999999999999999999k", "decode", "prefill", "tree", "float32", "bfloat16", "auto",
     "cuda:7", "shuffled", "../../etc/passwd", "/abs", "a\x00b", "a\nb", "2q1k_32q1s4k", "q1", "x" * 300, "٣", "²"]
)
scalars = st.one_of(st.none(), st.booleans(), big_ints, floats, words, st.text(max_size=12))
keys = st.one_of(
    st.sampled_from(["model", "batch", "tree", "choices", "chain", "full", "random", "parents", "branching",
                     "depth", "nodes", "count", "query", "context", "kind", "sweep", "timing", "seed", "name"]),
    st.text(max_size=8), st.integers(-2, 5), st.booleans(), st.none(),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=25,
)


def check_error(e: Exception, where: str = PATH) -> None:
    msg = str(e)
    assert msg.strip(), "empty message"
    lines = msg.split("\n")
    for line in lines:
        assert line.startswith(f"{where}: ") or line.startswith("--set "), line
        assert len(line) < 600, line


def load_ok_or_clean_error(text: str, overrides=None, name="docs") -> None:
    count(name)
    try:
        sf = load_text(text, PATH, overrides)
    except ScenarioError as e:  # the one type the CLI turns into a message, exit 2
        check_error(e)
        return
    for case in sf.cases[:5]:
        spec = case.scenario.batch_spec()
        assert spec.num_tokens >= 1
        s = safe_name(case.case_id)
        assert "/" not in s and ".." not in s
    assert "/" not in safe_name(sf.name)


def dump(doc) -> str:
    try:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        return repr(doc)


# -- whole documents -------------------------------------------------------------------------
@pytest.mark.slow
@cfg(150)
@given(junk)
def test_random_documents(doc):
    load_ok_or_clean_error(dump(doc), name="random documents")


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


ALL_PATHS = [p for p in _paths(BASE) if p]


def _put(doc, path, value):
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


@pytest.mark.slow
@cfg(350)
@given(st.lists(st.tuples(st.sampled_from(ALL_PATHS), junk), min_size=1, max_size=4), st.booleans())
def test_mutated_scenarios(mutations, drop):
    import copy

    doc = copy.deepcopy(BASE)
    for path, value in mutations:
        try:
            if drop and isinstance(value, bool):
                node = doc
                for p in path[:-1]:
                    node = node[p]
                del node[path[-1]]
            else:
                _put(doc, path, value)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation replaced the parent
    load_ok_or_clean_error(dump(doc), name="mutated scenarios")


TREE_SPECS = st.one_of(
    st.dictionaries(st.sampled_from(SPELLINGS + ("junk",)), junk, max_size=2),
    st.builds(lambda n, d, c, s: {"random": {"nodes": n, "max_depth": d, "max_children": c, "seed": s}},
              st.integers(-1, 5000), st.integers(-1, 10**6), st.integers(-1, 10**6), big_ints),
    st.builds(lambda d, b: {"full": {"depth": d, "branching": b}}, st.sampled_from([0, 3, 12, 4096, 10**9, 10**18]), st.integers(-1, 40)),
    st.builds(lambda b: {"branching": b}, st.lists(st.integers(-1, 9), max_size=40)),
    st.builds(lambda c: {"chain": c}, st.one_of(big_ints, floats, words)),
    st.builds(lambda p: {"choices": p}, st.lists(st.lists(st.integers(-1, 3), max_size=5), max_size=30)),
    st.builds(lambda p: {"parents": p}, st.lists(st.integers(-2, 30), max_size=30)),
    junk,
)


@pytest.mark.slow
@cfg(300)
@given(TREE_SPECS)
def test_trees(spec):
    count("trees")
    try:
        parents = parse_tree(spec)
    except TreeError as e:
        assert "\n" not in str(e) and str(e).startswith("tree") and len(str(e)) < 400, str(e)
        return
    assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)
    # the same spelling through a whole scenario
    doc = dict(BASE, batch=[{"kind": "tree", "context": 3, "tree": spec}], sweep=None)
    load_ok_or_clean_error(dump(doc), name="trees")


BATCH_CHARS = st.text(alphabet="0123456789qskKmM_ x-", max_size=40)


@cfg(250)
@given(st.one_of(BATCH_CHARS, st.text(max_size=30), st.sampled_from(["q1_" * 5000 + "q1", "9" * 5000 + "q1", "999999999999mq1"])))
def test_batch_strings(text):
    count("batch strings")
    try:
        groups = parse_batch_string(text)
    except ValueError as e:
        assert type(e) is ValueError and "\n" not in str(e) and len(str(e)) < 400, str(e)
        return
    assert groups and all(g["count"] >= 1 and g["query"] >= 1 for g in groups)
    doc = dict(BASE, batch=text, sweep=None)
    load_ok_or_clean_error(dump(doc), name="batch strings")


OVERRIDE_KEYS = st.one_of(
    st.sampled_from([".".join(map(str, p)) for p in ALL_PATHS] + ["", ".", "a..b", "batch.99", "batch.٣", "batch.²",
                                                                  "model.head_dim.x", "sweep", "batch", "x" * 200]),
    st.text(max_size=15),
)
OVERRIDE_VALUES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["[" * 200, "{a: [1, 2", "!!python/object:os.system ls", "&a [*a]", ".nan", "-.inf", "1e999",
                     "9" * 5000, "{kv_cache.page_size: [4, 8, 16]}", "[[0], [1]]", "2001-12-14", "!!binary aGk="]),
    junk.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip() if not isinstance(v, float) or math.isfinite(v) else str(v)),
)


@pytest.mark.slow
@cfg(200)
@given(st.lists(st.one_of(st.tuples(OVERRIDE_KEYS, OVERRIDE_VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"), st.text(max_size=10)), max_size=3))
def test_overrides(overrides):
    load_ok_or_clean_error(BASE_TEXT, overrides, name="overrides")


HOSTILE_TEXTS = [
    "[" * 5000 + "]" * 5000,
    "a: " + "{b: " * 3000 + "1" + "}" * 3000,
    "a: " + "9" * 5000,
    textwrap.dedent("""\
        a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
        b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
        c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
        d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
        e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
        f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
        sweep: {description: [*f, *f, *f, *f, *f, *f, *f, *f, *f]}
        """),
    "!!python/object/apply:os.system ['echo pwned']",
    "model: !!python/name:os.system\n",
    "\x00\x01\x02",
    "- 1\n- 2",
    "? [a, b]\n: 1",
    "{1: 2, null: 3, 2001-12-14: 4, .nan: 5}",
    "x" * (5 << 20),
    BASE_TEXT + "\nseed: 18446744073709551616\n",
    BASE_TEXT.replace("measure_ms: 5", "measure_ms: .inf"),
    BASE_TEXT.replace("warmup_ms: 1", "warmup_ms: .nan"),
    BASE_TEXT + "\nsweep: {description: [2001-12-14, {2001-12-14: 1}], seed: [1, 2]}\n",
    BASE_TEXT.replace("count: 2", "count: 65536") + "\nsweep: {batch.1.count: [65536]}\n",
    BASE_TEXT + "\nsweep: {seed: [" + ", ".join(str(i) for i in range(101)) + "], kv_cache.page_size: [" + ", ".join(str(i) for i in range(1, 101)) + "]}\n",
]


@pytest.mark.slow
@settings(parent=cfg(len(HOSTILE_TEXTS) * 2), deadline=15000)  # deep YAML takes ~1 s to hit the recursion limit
@given(st.one_of(st.sampled_from(HOSTILE_TEXTS), st.text(max_size=200)))
def test_hostile_and_random_text(text):
    load_ok_or_clean_error(text, name="texts")


@pytest.mark.slow
def test_hostile_texts_each_fail_cleanly():
    for text in HOSTILE_TEXTS:
        load_ok_or_clean_error(text, name="hostile texts")
