"""Names are data, never instructions (issue 60, items 7 and 8): a scenario name holding escape
sequences, newlines, HTML and Markdown reaches the terminal and Markdown outputs as text.

``store/safe_text.py`` holds the one sanitiser for terminal text (every console of the CLI
passes its printed text through it) and the one escaping function for Markdown, which `show`,
`check`, `compare`, `run` and `decide` use for every cell, title and note."""
import json
import math
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.row_parts import RowIdentity, RowTiming, RowWorkload
from attnbench.store.rows import Row, Status
from attnbench.store.runfolder import RunFolder
from attnbench.store.safe_text import md_text, term_text
from attnbench.workload.scenario import load_text

cli = CliRunner()

# YAML double-quoted: \e is ESC, \a BEL; a window title, a colour, a fake PASS line, an image, a link
EVIL = r'"evil\e]0;pwned\a\e[31mred\n**PASS** <img src=\"http://e.invalid/x.png\"> [l](http://e.invalid) | x"'


def _no_escapes(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text)


def _no_injection(text: str) -> None:
    """Markdown: no escape sequence, image, link or line of its own."""
    _no_escapes(text)
    assert "<img" not in text and "[l](" not in text, text
    assert not any(line.lstrip("*_ ").startswith("PASS**") or line.startswith("**PASS") for line in text.splitlines())


def test_term_text_shows_controls_as_pictures_and_md_text_escapes_markdown():
    assert term_text("a\x1b[31mb\nc\x07") == "a\u241b[31mb\u2424c\u2407"
    assert term_text("a\nb\tc", keep_lines=True) == "a\nb\tc"
    assert term_text("x\u202ey\x9bz") == "x\ufffdy\ufffdz"  # a bidi override, a C1 CSI
    md = md_text("**PASS**\n<img src=x> [l](u) ![i](u) | `c` ~~s~~ _e_ page_size a&b")
    assert "\n" not in md and "<" not in md and "&lt;img" in md and "a&amp;b" in md
    assert md.count("\\*") == 4 and "\\[l\\](u)" in md and "\\|" in md and "\\`c\\`" in md and "\\~\\~s" in md
    assert "\\_e\\_" in md and "page_size" in md  # emphasis escaped; a word's underscore left as it is


def _run(tmp_path: Path, name: str) -> Path:
    text = textwrap.dedent(f"""\
        name: {name}
        device: cpu
        model: {{num_q_heads: 2, num_kv_heads: 1, head_dim: 16, dtype: float32}}
        batch: [{{kind: decode, count: 1, context: 16}}]
        backends: [sdpa]
        timing: {{warmup_ms: 1, measure_ms: 2, min_runs: 3, rounds: 5}}
        """)
    (tmp_path / "evil.yaml").write_text(text)
    r = cli.invoke(app, ["run", str(tmp_path / "evil.yaml"), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    _no_escapes(r.output)  # the table's title and the progress line
    assert "evil\u241b]0;pwned" in r.output
    assert "[l](http://e.invalid)" in r.output and "red\u2424**PASS**" in r.output  # as written, on one line
    return tmp_path / "run"


@pytest.mark.slow
def test_a_hostile_scenario_name_reaches_terminal_and_markdown_as_text(tmp_path):
    run = _run(tmp_path, EVIL)
    shown = cli.invoke(app, ["show", str(run)]).output
    _no_escapes(shown)
    assert "evil\u241b]0;pwned" in shown  # as pictures
    for args in (["show", str(run), "--format", "markdown"],
                 ["check", str(run), "--baseline", str(run), "--all", "--format", "markdown"],
                 ["compare", "runs", str(run), str(run), "--format", "markdown"]):
        r = cli.invoke(app, args)
        assert r.exit_code in (0, 1), (args, r.output)
        _no_injection(r.output)
    md = cli.invoke(app, ["show", str(run), "--format", "markdown"]).output
    assert "&lt;img" in md and "\\[l\\]" in md and "evil\u241b\\]0;pwned" in md


def _decide_run(tmp_path: Path, name: str) -> Path:
    text = textwrap.dedent(f"""\
        name: {name}
        device: cpu
        model: {{num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}}
        batch: [{{kind: decode, count: 2, context: 16}}]
        sweep:
          batch.0.context: [16, 32]
        weights:
          batch.0.context: [3, 1]
        timing: {{rounds: 8}}
        """)
    rf = RunFolder.create(tmp_path, "w", tmp_path / "run")
    sf = load_text(text)
    rf.start({"scenario": sf.name, "scenario_path": "w.yaml", "scenario_text": text, "overrides": [],
              "environment": {"device": "cpu test"}})
    for case in sf.cases:
        for backend, ms in (("a", 1.0), ("b", 2.0)):
            rounds = [ms * (1 + 0.01 * k) for k in range(8)]
            rf.add(Row(RowIdentity(scenario=sf.name, case_id=case.case_id, backend=backend), status=Status.OK,
                       workload=RowWorkload(params=dict(case.params), batch="<b>x</b>\n**PASS**"),
                       timing=RowTiming(round_medians_ms=rounds, samples_ms=rounds, median_ms=rounds[4], n=8,
                                        timing_method="cpu", plan_ms=math.nan, convert_ms=math.nan)))
    rf.finish(True)
    return tmp_path / "run"


def test_decide_markdown_and_its_export_escape_names_and_shapes(tmp_path):
    run = _decide_run(tmp_path, EVIL)
    r = cli.invoke(app, ["decide", str(run), "--format", "markdown", "--export-markdown", str(tmp_path / "d.md")])
    assert r.exit_code == 0, r.output
    for text in (r.output, (tmp_path / "d.md").read_text()):
        _no_injection(text)
        assert "<b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text
        assert "| dispatch |" in text  # still a table
    r = cli.invoke(app, ["decide", str(run)])
    assert r.exit_code == 0, r.output
    _no_escapes(r.output)
    assert "evil\u241b]0;pwned" in r.output
    doc = json.loads(cli.invoke(app, ["decide", str(run), "--format", "json"]).output)
    assert "\x1b" in doc["scenario"]  # the JSON keeps the name as it is (escaped by JSON itself)
