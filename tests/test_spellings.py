"""One spelling for one thing (issue 58 item 5): a chain of drafts reads the same in the case id,
the run's batch text and an imported scenario's comments; the YAML's spelling of a value picks
its cases with -k; the docs' batch-string example says what the run prints."""
from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.spec import BatchSpec, Request, describe

ROOT = Path(__file__).resolve().parents[1]
cli = CliRunner()


def _spec(*requests):
    return BatchSpec(num_q_heads=4, num_kv_heads=2, head_dim=16, dtype="float32", page_size=16,
                     layout="contiguous", requests=tuple(requests))


def test_a_chain_reads_as_its_yaml_says_and_other_trees_by_node_count():
    chain = Request("tree", 4, 192, (-1, 0, 1, 2))
    branchy = Request("tree", 4, 192, (-1, 0, 0, 1))
    assert describe(_spec(chain, branchy)) == "1 chain3@192 + 1 tree(4)@192"


def test_an_imported_chain_is_spelled_alike_in_id_comment_and_batch(tmp_path):
    trace = ROOT / "attnbench" / "scenarios" / "traces" / "synthetic-serving.jsonl"
    out = tmp_path / "t.yaml"
    r = cli.invoke(app, ["import", str(trace), "-o", str(out), "--round-context", "64", "--max-cases", "6"])
    assert r.exit_code == 0, r.output
    comments = [ln.split(" steps: ", 1)[1] for ln in out.read_text().splitlines() if ln.strip().startswith("# shape")]
    r = cli.invoke(app, ["run", str(out), "--list", "--format", "json"])
    cases = json.loads(r.stdout)
    assert [c["batch"] for c in cases] == comments
    for c in cases:  # the id writes each chain as the batch text does, "@" as "-at" (file-name safe)
        chains = [g.replace(" ", "").replace("@", "-at") for g in c["batch"].split(" + ") if "chain" in g]
        assert chains == [g for g in c["case_id"].removeprefix("batch=").split("+") if "chain" in g]
    assert any("chain3" in c for c in comments) and not any("verify" in c for c in comments)


def test_plugins_doc_batch_string_says_what_the_run_prints():
    text = (ROOT / "docs" / "plugins.md").read_text()
    m = re.search(r"`(\d+q1s\d+)`: ([^(]*)\(", text.replace("\n", " "))
    assert m, "docs/plugins.md lost its batch-string example"
    from attnbench.workload.batchstr import parse_batch_string

    (group,) = parse_batch_string(m.group(1))
    assert f"{group['context']} cached tokens" in m.group(2), m.group(2)
