"""Label graph: groups, implied pairs and contradictions on hand-built graphs."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from siamese.labelgraph import LabelGraph
from siamese.train import LabeledPair, implied_pairs


@dataclass(frozen=True)
class StorePair:  # the fields of siamese.store.Pair that matter here
    pair_id: str
    image_a: str
    image_b: str
    label: str


def graph(*edges: str) -> LabelGraph:
    """``"A=B"`` / ``"A!B"`` edges; pair ids are the edge strings."""
    pairs = []
    for edge in edges:
        same = "=" in edge
        a, b = edge.split("=" if same else "!")
        pairs.append(LabeledPair(edge, a, b, same))
    return LabelGraph.from_pairs(pairs)


def as_set(pairs) -> set[tuple[frozenset[str], bool]]:
    return {(frozenset((p.image_a, p.image_b)), p.same) for p in pairs}


def test_groups_join_same_labels_only():
    g = graph("A=B", "B=C", "D=E", "C!D", "F!A")
    assert g.groups() == [["A", "B", "C"], ["D", "E"]]
    assert g.groups(min_size=1) == [["A", "B", "C"], ["D", "E"], ["F"]]
    assert g.group_of("C") == g.group_of("A") == "A"
    assert g.group_of("F") == "F"
    assert g.group_of("unknown") is None


def test_implied_pairs_follow_transitivity_and_difference():
    g = graph("A=B", "B=C", "D=E", "C!D")
    expected = {
        (frozenset("AC"), True),  # A=B, B=C
        (frozenset("AD"), False),  # A=C, C≠D
        (frozenset("AE"), False),
        (frozenset("BD"), False),
        (frozenset("BE"), False),
        (frozenset("CE"), False),  # C≠D, D=E
    }
    implied = g.implied(max_count=100)
    assert as_set(implied) == expected
    assert len(implied) == len(expected)


def test_a_contradictory_group_implies_nothing():
    g = graph("A=B", "B=C", "A!C", "C!D")
    assert g.implied(max_count=100) == []


def test_implied_is_sampled_down_to_max_count():
    edges = [f"x{i}=x{i + 1}" for i in range(30)]  # one group of 31: 465 pairs, 30 labeled
    g = graph(*edges)
    everything = as_set(g.implied(max_count=10_000))
    assert len(everything) == 465 - 30
    sample = g.implied(max_count=50, seed=3)
    assert len(sample) == 50
    assert as_set(sample) <= everything
    assert as_set(g.implied(max_count=50, seed=3)) == as_set(sample)  # seeded


def _brute_force_implied(pairs):
    """Closure by repeated set merging, independent of the union-find in LabelGraph."""
    groups = [{image} for image in sorted({i for p in pairs for i in (p.image_a, p.image_b)})]
    for p in pairs:
        if p.same:
            ga = next(g for g in groups if p.image_a in g)
            gb = next(g for g in groups if p.image_b in g)
            if ga is not gb:
                ga |= gb
                groups = [g for g in groups if g is not gb]
    groups = {frozenset(g) for g in groups}
    group_of = {image: g for g in groups for image in g}
    bad = {group_of[p.image_a] for p in pairs if not p.same and group_of[p.image_a] == group_of[p.image_b]}
    labeled = {frozenset((p.image_a, p.image_b)) for p in pairs}
    implied = set()
    for g in groups - bad:
        implied |= {(frozenset((a, b)), True) for a in g for b in g if a < b}
    for p in pairs:
        ga, gb = group_of[p.image_a], group_of[p.image_b]
        if not p.same and ga != gb and ga not in bad and gb not in bad:
            implied |= {(frozenset((a, b)), False) for a in ga for b in gb}
    return {(pair, same) for pair, same in implied if pair not in labeled}


@pytest.mark.parametrize("seed", range(6))
def test_implied_equals_a_brute_force_closure(seed):
    rng = random.Random(seed)
    images = [f"img{i:02d}" for i in range(25)]
    seen, pairs = set(), []
    while len(pairs) < 40:
        a, b = rng.sample(images, 2)
        if frozenset((a, b)) not in seen:
            seen.add(frozenset((a, b)))
            pairs.append(LabeledPair(f"p{len(pairs)}", a, b, rng.random() < 0.45))
    ours = {(frozenset((p.image_a, p.image_b)), p.same) for p in implied_pairs(pairs, max_count=10**6, seed=seed)}
    assert ours == _brute_force_implied(pairs)
    capped = implied_pairs(pairs, max_count=10, seed=seed)
    assert len(capped) == min(10, len(ours))
    assert {(frozenset((p.image_a, p.image_b)), p.same) for p in capped} <= ours


def test_contradiction_reports_the_different_pair_and_the_shortest_same_path():
    g = graph("A=B", "B=C", "C=D", "A=E", "E=D", "A!D", "D!X")
    (found,) = g.contradictions()
    assert found.pair_ids == ("A!D", "A=E", "E=D")  # the two-step path, not A-B-C-D
    assert found.images == ("A", "E", "D")
    assert "A" in found.explanation and "D" in found.explanation and "3 labels" in found.explanation


def test_each_contradiction_is_reported_and_consistent_graphs_have_none():
    g = graph("A=B", "B=C", "A!C", "D=E", "E!D2", "D2=D")
    found = g.contradictions()
    assert [c.pair_ids[0] for c in found] == ["A!C", "E!D2"]
    assert found[0].pair_ids[1:] == ("A=B", "B=C") and found[0].images == ("A", "B", "C")
    assert found[1].images == ("E", "D", "D2")
    assert graph("A=B", "B!C", "C=D").contradictions() == []


def test_hint_says_what_the_labels_say():
    g = graph("A=B", "B=C", "A!D", "A!E")
    assert g.hint("A") == "labeled same as 1 image, different from 2; in a group of 3 same images"
    assert g.hint("D") == "labeled same as 0 images, different from 1"
    assert g.hint("nobody") is None


def test_store_pairs_with_label_strings():
    g = LabelGraph.from_pairs([StorePair("p1", "A", "B", "same"), StorePair("p2", "B", "C", "different")])
    assert g.groups() == [["A", "B"]]
    assert g.usage() == {"A": 1, "B": 2, "C": 1}
    assert g.labeled() == {frozenset("AB"), frozenset("BC")}
    with pytest.raises(ValueError, match="label 'maybe'"):
        LabelGraph.from_pairs([StorePair("p3", "A", "B", "maybe")])


# -- changes: a graph changed label by label equals one built from its labels at once


def state(g: LabelGraph) -> dict:
    """Every answer the graph gives, for comparing two graphs."""
    images = g.images()
    return {
        "edges": {e.pair_id: e for e in g.edges},
        "images": images,
        "groups": g.groups(min_size=1),
        "group_of": {i: g.group_of(i) for i in images},
        "usage": dict(g.usage()),
        "labeled": set(g.labeled()),
        "contradictions": g.contradictions(),
        "hints": {i: g.hint(i) for i in images},
        "implied": g.implied(max_count=10**6),
    }


def _brute_force_groups_and_contradictions(edges):
    """Connected components of the "same" labels by repeated merging, and the "different" labels inside one."""
    groups = [{i} for i in sorted({i for e in edges for i in (e.image_a, e.image_b)})]
    changed = True
    while changed:
        changed = False
        for e in edges:
            ga = next(g for g in groups if e.image_a in g)
            gb = next(g for g in groups if e.image_b in g)
            if e.same and ga is not gb:
                ga |= gb
                groups = [g for g in groups if g is not gb]
                changed = True
    inside = {e.pair_id for e in edges if not e.same and any({e.image_a, e.image_b} <= g for g in groups)}
    return sorted(sorted(g) for g in groups), inside


def _relations(g: LabelGraph, images: list[str]) -> dict[tuple[str, str], bool | None]:
    return {(a, b): g.relation(a, b) for a in images for b in images if a != b}


def _brute_force_relations(edges, groups, images) -> dict[tuple[str, str], bool | None]:
    """Same group: True; a "different" label between the two groups: False; else (or unlabeled) None."""
    group_of = {i: frozenset(gr) for gr in groups for i in gr}
    apart = {frozenset((group_of[e.image_a], group_of[e.image_b])) for e in edges if not e.same}
    out = {}
    for a in images:
        for b in images:
            if a == b:
                continue
            if a not in group_of or b not in group_of:
                out[a, b] = None
            elif group_of[a] == group_of[b]:
                out[a, b] = True
            else:
                out[a, b] = False if frozenset((group_of[a], group_of[b])) in apart else None
    return out


def test_relation_says_what_the_labels_imply():
    g = graph("A=B", "B=C", "C!D", "D=E", "F!G")
    assert g.relation("A", "C") is True  # A=B, B=C
    assert g.relation("A", "E") is False and g.relation("E", "B") is False  # A=C, C≠D, D=E
    assert g.relation("A", "F") is None and g.relation("A", "unlabeled") is None
    assert g.relation("F", "G") is False


@pytest.mark.parametrize("seed", range(4))
def test_random_adds_replacements_and_removals_match_a_rebuild(seed):
    rng = random.Random(seed)
    images = [f"img{i:02d}" for i in range(14)]
    g = LabelGraph()
    current: dict[str, LabeledPair] = {}
    for step in range(400):
        if current and rng.random() < 0.35:
            pair_id = rng.choice(sorted(current))
            assert g.remove(pair_id) is True
            del current[pair_id]
        else:
            a, b = sorted(rng.sample(images, 2))
            pair_id = f"{a}:{b}"  # one id per unordered pair, as in the store: adding again relabels
            current[pair_id] = LabeledPair(pair_id, a, b, rng.random() < 0.55)
            g.add(current[pair_id])
        shuffled = list(current.values())
        rng.shuffle(shuffled)
        assert state(g) == state(LabelGraph.from_pairs(shuffled)), f"step {step}"
        groups, inside = _brute_force_groups_and_contradictions(list(current.values()))
        assert sorted(g.groups(min_size=1)) == groups
        assert set(g.contradicting()) == inside
        if step % 20 == 0:
            assert _relations(g, images) == _brute_force_relations(list(current.values()), groups, images)
            assert {r: set(m) for r, m in g.group_members().items()} == {min(m): set(m) for m in groups}
    assert g.remove("never-added") is False


def test_removing_a_same_label_splits_its_group_and_ends_the_contradiction():
    g = graph("A=B", "B=C", "C=D", "A!D", "D!X")
    assert g.contradicting() == ["A!D"] and g.groups() == [["A", "B", "C", "D"]]
    g.remove("B=C")
    assert g.groups() == [["A", "B"], ["C", "D"]]
    assert g.group_of("D") == "C" and g.group_of("B") == "A"
    assert g.contradicting() == [] and g.contradictions() == []
    g.add(LabeledPair("B=C", "B", "C", True))  # back: the contradiction returns
    assert g.contradicting() == ["A!D"]
    g.add(LabeledPair("B=C", "B", "C", False))  # relabeled "different": the group splits again
    assert g.groups() == [["A", "B"], ["C", "D"]] and g.contradicting() == []
    g.remove("D!X")
    assert "X" not in g.images() and g.group_of("X") is None and g.hint("X") is None


def test_views_follow_the_graph_and_copies_do_not():
    g = graph("A=B")
    usage, labeled, copy = g.usage(), g.labeled(), g.copy()
    g.add(LabeledPair("B!C", "B", "C", False))
    assert usage == {"A": 1, "B": 2, "C": 1} and frozenset("BC") in labeled
    assert copy.usage() == {"A": 1, "B": 1} and frozenset("BC") not in copy.labeled()
    with pytest.raises(TypeError):
        usage["A"] = 5  # read-only
