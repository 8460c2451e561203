import pytest
import torch

from attnbench.workload.trees import (
    TreeError,
    ancestor_mask,
    chain,
    depths,
    from_branching,
    from_choices,
    from_parents,
    full,
    is_chain,
    parse_tree,
    random_tree,
)


def test_worked_example_from_semantics():
    parents = from_choices([[0], [1], [0, 0], [0, 1], [1, 0]])
    assert parents == [-1, 0, 0, 1, 1, 2]
    assert depths(parents) == [0, 1, 1, 2, 2, 2]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(ancestor_mask(parents), expected)


def test_choices_order_does_not_matter():
    a = from_choices([[1, 0], [0, 1], [0], [1], [0, 0]])
    assert a == [-1, 0, 0, 1, 1, 2]


def test_chain_full_branching():
    assert chain(3) == [-1, 0, 1, 2]
    assert is_chain(chain(5))
    t = full({"depth": 3, "branching": 3})
    assert len(t) == 40  # the tree of attnbench/scenarios/tree-verify-llama3-8b.yaml
    assert depths(t).count(3) == 27
    b = from_branching([2, 3])
    assert len(b) == 1 + 2 + 6 and b[:3] == [-1, 0, 0]
    assert b[3:6] == [1, 1, 1] and b[6:] == [2, 2, 2]


def test_random_tree_is_reproducible_and_bounded():
    spec = {"nodes": 30, "max_depth": 4, "max_children": 3, "seed": 7}
    a, b = random_tree(spec), random_tree(spec)
    assert a == b and len(a) == 30
    d = depths(a)
    assert max(d) <= 4
    assert d == sorted(d)  # level order
    for i, p in enumerate(a[1:], 1):
        assert 0 <= p < i
    assert max(a[1:].count(p) for p in set(a[1:])) <= 3
    assert random_tree({**spec, "seed": 8}) != a


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({"choices": [[0, 0]]}, "has no parent path [0]"),
        ({"choices": [[0], [0]]}, "appears twice"),
        ({"choices": [[-1]]}, "tree.choices[0][0]"),
        ({"parents": [0, 0]}, "root's parent must be -1"),
        ({"parents": [-1, 2, 0]}, "tree.parents[1]"),
        ({"chain": -1}, "tree.chain"),
        ({"full": {"depth": 2}}, "tree.full"),
        ({"random": {"nodes": 100, "max_depth": 2, "max_children": 2}}, "do not fit"),
        ({"chain": 2, "parents": [-1]}, "exactly one of"),
        ({"choices": "abc"}, "expected a list"),
        ({"branching": [100, 100]}, "at most"),
    ],
)
def test_bad_trees_name_the_field(spec, needle):
    with pytest.raises(TreeError) as e:
        parse_tree(spec)
    assert needle in str(e.value)


def test_parents_pass_through():
    assert from_parents([-1, 0, 0, 1]) == [-1, 0, 0, 1]
