"""``attnbench import``: step traces -> a scenario with one case per distinct shape, checked
against the trace's own counts; the shipped trace and scenario agree; bad lines are messages."""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.scenario import load

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "attnbench" / "scenarios" / "traces" / "synthetic-serving.jsonl"
SHIPPED = ROOT / "attnbench" / "scenarios" / "trace-synthetic-serving.yaml"
cli = CliRunner()


def _random_trace(path: Path, steps: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    shapes = [[{"query_len": 1, "context_len": rng.randint(0, 90)} for _ in range(rng.randint(1, 3))]
              for _ in range(4)]
    for s in shapes:
        s.append({"query_len": 3, "context_len": 17, "spec_tokens": 2} if rng.random() < 0.5 else
                 {"query_len": 9, "context_len": 5})
    picked = [rng.choice(shapes) for _ in range(steps)]
    lines = ["# a comment line"] + [json.dumps({"step": i, "requests": rng.sample(s, len(s))})
                                    for i, s in enumerate(picked)]
    path.write_text("\n".join(lines) + "\n\n")
    return picked


def _requests_of(case) -> Counter:
    """The case's batch as a multiset of (kind, query, context, drafts)."""
    out = Counter()
    for g in case.scenario.batch:
        drafts = g.tree["chain"] if g.kind == "tree" else 0
        query = {"decode": 1, "prefill": g.query, "tree": 1 + drafts}[g.kind]
        out[(g.kind, query, g.context, drafts)] += g.count
    return out


def _requests_of_step(step: list[dict]) -> Counter:
    out = Counter()
    for r in step:
        spec = r.get("spec_tokens", 0)
        kind = "tree" if spec else ("decode" if r["query_len"] == 1 else "prefill")
        out[(kind, r["query_len"], r["context_len"], spec)] += 1
    return out


def test_one_case_per_distinct_shape_with_its_count(tmp_path):
    trace = tmp_path / "t.jsonl"
    steps = _random_trace(trace, 60, seed=3)
    out = tmp_path / "s.yaml"
    r = cli.invoke(app, ["import", str(trace), "-o", str(out), "--num-q-heads", "4", "--head-dim", "16"])
    assert r.exit_code == 0, r.output
    want = Counter(frozenset(_requests_of_step(s).items()) for s in steps)
    cases = load(out).cases
    got = [frozenset(_requests_of(c).items()) for c in cases]
    assert set(got) == set(want) and len(got) == len(want)
    counts = [int(line.split(":")[1].split(" of ")[0]) for line in out.read_text().splitlines() if "# shape" in line]
    assert counts == [want[g] for g in got] and counts == sorted(counts, reverse=True) and sum(counts) == 60
    assert all(c.scenario.model.num_q_heads == 4 and c.scenario.model.head_dim == 16 for c in cases)


def test_round_context_and_max_cases(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps({"requests": [{"query_len": 1, "context_len": c}]})
                               for c in [1, 60, 64, 65, 65, 200]))
    out = tmp_path / "s.yaml"
    assert cli.invoke(app, ["import", str(trace), "-o", str(out), "--round-context", "64"]).exit_code == 0
    ctx = [c.scenario.batch[0].context for c in load(out).cases]
    assert ctx == [64, 128, 256]  # 3 steps at 64, 2 at 128, 1 at 256
    r = cli.invoke(app, ["import", str(trace), "-o", str(out), "--round-context", "64", "--max-cases", "1"])
    assert r.exit_code == 0 and "3 steps of rarer shapes left out" in r.output
    assert [c.scenario.batch[0].context for c in load(out).cases] == [64]


@pytest.mark.parametrize("line, says", [
    ('{"requests": [{"query_len": 0, "context_len": 3}]}', "query_len must be an integer >= 1"),
    ('{"requests": [{"query_len": 2, "context_len": 3, "spec_tokens": 3}]}', "spec_tokens + 1 = 4"),
    ('{"requests": []}', "non-empty list `requests`"),
    ('{"requests": [{"query_len": 1}]}', "context_len must be an integer"),
    ("{not json", "not JSON"),
])
def test_bad_lines_are_clear_messages(tmp_path, line, says):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"requests": [{"query_len": 1, "context_len": 3}]}\n' + line + "\n")
    r = cli.invoke(app, ["import", str(trace), "-o", str(tmp_path / "s.yaml")])
    assert r.exit_code == 2 and says in r.output and f"{trace}:2" in r.output.replace("\n", ""), r.output
    assert not (tmp_path / "s.yaml").exists()


def test_the_shipped_scenario_is_the_import_of_the_shipped_trace(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "trace-synthetic-serving.yaml"
    r = cli.invoke(app, ["import", str(TRACE.relative_to(ROOT)), "-o", str(out), "--round-context", "64",
                         "--max-cases", "6"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(SHIPPED.read_text())
    assert len(load(SHIPPED).cases) == 6


ONE_STEP = '{"requests": [{"query_len": 1, "context_len": 3}]}\n'


def test_a_folder_name_cannot_plant_keys_in_the_scenario(tmp_path):
    """Issue 37 item 13: the trace's path, --name and --dtype went into the YAML unformatted, so a
    folder name holding newlines planted `check: {rtol: 1}` (every output passes) and `backends:`."""
    folder = tmp_path / "x\ncheck: {rtol: 1}\nbackends: [flex]\n#"
    folder.mkdir()
    (folder / "t.jsonl").write_text(ONE_STEP)
    out = tmp_path / "s.yaml"
    r = cli.invoke(app, ["import", str(folder / "t.jsonl"), "-o", str(out),
                         "--name", "n\ntiming: {rounds: 1}\u2028sweep: {}"])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert set(doc) == {"name", "description", "seed", "device", "model", "kv_cache", "batch", "sweep", "weights", "timing"}
    assert doc["name"] == "n\ntiming: {rounds: 1}\u2028sweep: {}"
    assert doc["timing"] == {"warmup_ms": 5, "measure_ms": 40}
    sc = load(out)
    assert sc.scenario.check.rtol is None and sc.scenario.backends is None
    r = cli.invoke(app, ["import", str(folder / "t.jsonl"), "-o", str(out), "--dtype", "float32\nbackends: [flex]"])
    assert r.exit_code == 2 and "model.dtype" in r.output, r.output


@pytest.mark.slow
@pytest.mark.parametrize("name", ["yes", "123", "2026-01-01", "null", "on", "1e3", "~", "[a]", "#x", "a: b"])
def test_names_yaml_would_read_as_other_types_stay_names(tmp_path, name):
    """Issue 37 item 21: `import -o yes.yaml` made a scenario named True (or failed); 123 and
    2026-01-01 became a number and a date."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(ONE_STEP)
    out = tmp_path / "s.yaml"
    r = cli.invoke(app, ["import", str(trace), "-o", str(out), "--name", name])
    assert r.exit_code == 0, r.output
    assert load(out).scenario.name == name
    (tmp_path / "sub").mkdir()
    stem = tmp_path / "sub" / f"{name.replace('/', '_')}.yaml"
    assert cli.invoke(app, ["import", str(trace), "-o", str(stem)]).exit_code == 0
    assert load(stem).scenario.name == stem.stem


@pytest.mark.parametrize("data, args, says", [
    (b'{"requests": [{"query_len": 1, "context_len": 3\xff}]}\n', [], "t.jsonl:2: not UTF-8 text (byte 0xff at column 48)"),
    (b"[" * 100000 + b"]" * 100000 + b"\n", [], "t.jsonl:2: JSON nested too deeply"),
    (b'{"requests": [{"query_len": 1, "context_len": 1' + b"9" * 400 + b'}]}\n', ["--round-context", "64"],
     "batch.0.context: Input should be less than or equal to"),
], ids=["invalid-utf8", "deep-nesting", "huge-int-rounded"])
def test_unreadable_traces_are_messages_not_tracebacks(tmp_path, data, args, says):
    """Issue 37 item 14: invalid UTF-8 (UnicodeDecodeError), deep nesting (RecursionError) and a huge
    context with --round-context (OverflowError) were tracebacks."""
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(ONE_STEP.encode() + data)
    r = cli.invoke(app, ["import", str(trace), "-o", str(tmp_path / "s.yaml"), *args])
    assert r.exit_code == 2 and says in r.output.replace("\n", ""), r.output[-500:]
    assert "Traceback" not in r.output and not (tmp_path / "s.yaml").exists()


def test_a_utf8_bom_is_accepted(tmp_path):
    """Issue 37 item 14: a trace saved with a UTF-8 BOM (Windows tools) was refused as not JSON."""
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"\xef\xbb\xbf" + ONE_STEP.encode() + ONE_STEP.encode())
    r = cli.invoke(app, ["import", str(trace), "-o", str(tmp_path / "s.yaml")])
    assert r.exit_code == 0, r.output
    assert "1 case(s) from 2 steps" in r.output


@pytest.mark.parametrize("line", [
    '{"requests": [{"query_len": 1, "context_len": 3, "context_len": 900}]}',
    '{"requests": [{"query_len": 1, "context_len": 3}], "requests": [{"query_len": 1, "context_len": 9}]}',
])
def test_a_key_written_twice_in_a_trace_line_is_refused(tmp_path, line):
    """Issue 60 item 17: the last of two equal keys was taken silently; scenario YAML refuses that."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(ONE_STEP + line + "\n")
    r = cli.invoke(app, ["import", str(trace), "-o", str(tmp_path / "s.yaml")])
    assert r.exit_code == 2 and "t.jsonl:2: key" in r.output and "appears twice in one object; keep one" in r.output
    assert not (tmp_path / "s.yaml").exists()
