"""Named draft trees (`tree: {preset: NAME}`): the published lists parse to the right shapes,
the dynamic ones keep their limits, bad names get one message naming the field."""
from collections import Counter

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.scenario import ScenarioError, load_text
from attnbench.workload.tree_presets import EAGLE_MC_SIM_7B_63, MEDUSA_MC_SIM_7B_63, PRESETS, eagle_like_tree
from attnbench.workload.trees import TreeError, depths, from_choices, parse_tree


def shape(parents):
    kids = Counter(parents[1:])
    return len(parents), max(depths(parents)), max(kids.values())


def test_static_presets_have_the_published_sizes():
    # Medusa: 63 paths, longest 4 ranks, root with 10 children; EAGLE-1: 25 paths, longest 5, 4 at the root
    assert len(MEDUSA_MC_SIM_7B_63) == 63 and len(EAGLE_MC_SIM_7B_63) == 25
    assert shape(parse_tree({"preset": "medusa-mc_sim_7b_63"})) == (64, 4, 10)
    assert shape(parse_tree({"preset": "eagle-mc_sim_7b_63"})) == (26, 5, 4)
    # the preset is exactly the choices spelling of the list
    assert parse_tree({"preset": "eagle-mc_sim_7b_63"}) == from_choices(EAGLE_MC_SIM_7B_63)
    levels = Counter(depths(parse_tree({"preset": "eagle-mc_sim_7b_63"})))
    assert [levels[d] for d in range(6)] == [1, 4, 8, 8, 3, 2]


@pytest.mark.parametrize("depth", [5, 7, 8])
@pytest.mark.parametrize("seed", [0, 1, 17])
def test_dynamic_presets_keep_their_limits(depth, seed):
    parents = parse_tree({"preset": {"name": f"eagle-dynamic-d{depth}", "seed": seed}})
    nodes, d, widest = shape(parents)
    assert nodes == 61 and d == depth and widest <= 10  # grown from the likeliest path, so it reaches the depth
    assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)
    assert depths(parents) == sorted(depths(parents))  # level order


def test_dynamic_presets_are_seeded():
    a = parse_tree({"preset": "eagle-dynamic-d7"})
    assert a == parse_tree({"preset": {"name": "eagle-dynamic-d7", "seed": 0}})
    assert a != parse_tree({"preset": {"name": "eagle-dynamic-d7", "seed": 1}})
    assert eagle_like_tree(61, 7, 10, 3) == eagle_like_tree(61, 7, 10, 3)


@pytest.mark.parametrize(
    "value, needle",
    [
        ("medusa", "unknown preset 'medusa'; presets: medusa-mc_sim_7b_63"),
        ({"name": "medusa-mc_sim_7b_63", "seed": 2}, "is a fixed tree"),
        ({"name": "eagle-dynamic-d5", "seed": -1}, "tree.preset.seed: expected an integer >= 0"),
        (7, "expected a preset name"),
    ],
)
def test_bad_presets(value, needle):
    with pytest.raises(TreeError, match="^tree.preset") as e:
        parse_tree({"preset": value})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_preset_in_a_scenario_and_its_error():
    head = "model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16}\nbatch:\n"
    sf = load_text(head + "  - {kind: tree, count: 2, context: 9, tree: {preset: eagle-mc_sim_7b_63}}\n", "s.yaml")
    assert [r.query for r in sf.scenario.batch_spec().requests] == [26, 26]
    with pytest.raises(ScenarioError) as e:
        load_text(head + "  - {kind: tree, context: 9, tree: {preset: eagle}}\n", "s.yaml")
    assert str(e.value).startswith("s.yaml: batch.0: tree.preset: unknown preset 'eagle'")


def test_trees_command_lists_every_preset():
    r = CliRunner().invoke(app, ["trees"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    for name in PRESETS:
        assert name in r.output
    line = next(x for x in r.output.splitlines() if "medusa-mc_sim_7b_63" in x)
    assert line.split()[1:4] == ["64", "4", "10"]
