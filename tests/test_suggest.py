"""Suggestions: what is never suggested, what is, why, and how fast."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from siamese.labelgraph import LabelGraph
from siamese.suggest import Suggester, Suggestion, is_evaluation_image, thumbnail_vectors
from siamese.train import LabeledPair

REPO = Path(__file__).resolve().parent.parent


def digests(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha256(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def unit_rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=1, keepdim=True)


def open_pool(n: int, salt: str = "") -> list[str]:
    """``n`` digests outside the evaluation reserve (so every image can be suggested)."""
    found, i = [], 0
    while len(found) < n:
        d = hashlib.sha256(f"{salt}{i}".encode()).hexdigest()
        if not is_evaluation_image(d):
            found.append(d)
        i += 1
    return found


def test_the_evaluation_reserve_is_about_ten_percent_and_never_suggested():
    pool = digests(4000)
    reserved = {d for d in pool if is_evaluation_image(d)}
    assert 0.08 < len(reserved) / len(pool) < 0.12  # binomial(4000, 0.1): ±5 standard deviations
    assert reserved == {d for d in pool if is_evaluation_image(d)}  # a pure function of the digest
    small = pool[:200]
    suggester = Suggester(seed=1)
    emb, ref = unit_rows(200, 16), unit_rows(200, 12, seed=1)
    chosen = suggester.suggest_batch(150, small, emb, 0.0, set(), Counter(), ref)
    assert len(chosen) == 150
    assert not {d for s in chosen for d in (s.image_a, s.image_b)} & reserved
    assert {s.kind for s in chosen} == {"uncertain", "hard_positive", "hard_negative", "random"}


def test_labeled_and_recent_pairs_are_never_suggested_again():
    pool = open_pool(6)  # 15 pairs
    labeled = {frozenset(pool[:2]), frozenset(pool[2:4])}
    suggester = Suggester(seed=0, recent=64)
    chosen = [suggester.suggest(pool, unit_rows(6, 8), 0.0, labeled, Counter()) for _ in range(13)]
    pairs = [frozenset((s.image_a, s.image_b)) for s in chosen]
    assert len(set(pairs)) == 13 and not set(pairs) & labeled and all(s.image_a != s.image_b for s in chosen)
    assert suggester.suggest(pool, unit_rows(6, 8), 0.0, labeled, Counter()) is None  # all 15 used up


def test_uncertain_pick_is_the_pair_nearest_the_threshold():
    """With every image an anchor and a candidate, the pick is the brute-force argmin |similarity - t|."""
    pool = open_pool(40)
    emb = unit_rows(40, 8, seed=3)
    threshold = 0.31
    suggester = Suggester(seed=0, random_share=0.0, anchors=40, candidates=40)
    found = suggester.suggest(pool, emb, threshold, set(), Counter())
    sims = (emb @ emb.T).numpy().astype(np.float64)
    gap = np.abs(sims - threshold) + np.eye(40) * 10
    i, j = np.unravel_index(np.argmin(gap), gap.shape)
    assert {found.image_a, found.image_b} == {pool[i], pool[j]}
    assert found.kind == "uncertain"
    assert found.similarity == np.float32(sims[i, j]) or abs(found.similarity - sims[i, j]) < 1e-5
    assert found.reason == f"uncertain: similarity {sims[i, j]:.2f} is near the threshold 0.31"


def test_hard_positive_and_negative_come_from_the_disagreement_with_the_reference_view():
    pool = open_pool(60)
    emb = unit_rows(60, 16, seed=4)
    ref = unit_rows(60, 16, seed=5)
    # Images 0 and 1 look identical, but the model finds them opposite: the hard positive.
    ref[1] = ref[0]
    emb[1] = -emb[0]
    # Images 2 and 3 look opposite, but the model finds them identical: the hard negative.
    ref[3] = -ref[2]
    emb[3] = emb[2]
    kinds: dict[str, Suggestion] = {}
    suggester = Suggester(seed=0, random_share=0.0, anchors=60, candidates=60)
    for _ in range(12):
        s = suggester.suggest(pool, emb, 0.0, set(), Counter(), ref)
        kinds.setdefault(s.kind, s)
    hard_positive, hard_negative = kinds["hard_positive"], kinds["hard_negative"]
    assert {hard_positive.image_a, hard_positive.image_b} == {pool[0], pool[1]}
    assert hard_positive.similarity < -0.99 and "look alike" in hard_positive.reason
    assert "it calls them different" in hard_positive.reason
    assert {hard_negative.image_a, hard_negative.image_b} == {pool[2], pool[3]}
    assert hard_negative.similarity > 0.99 and "look different" in hard_negative.reason
    assert "it calls them same" in hard_negative.reason


def test_an_uncalibrated_threshold_asks_for_likely_same_pairs_instead():
    pool = open_pool(30)
    emb = unit_rows(30, 8, seed=6)
    ref = unit_rows(30, 8, seed=7)
    suggester = Suggester(seed=0, random_share=0.0)
    chosen = [suggester.suggest(pool, emb, 5.0, set(), Counter(), ref) for _ in range(9)]  # splits nothing
    assert {s.kind for s in chosen} <= {"hard_positive", "hard_negative"} and "hard_positive" in {
        s.kind for s in chosen
    }


def test_random_share_is_respected():
    pool = open_pool(300)
    suggester = Suggester(seed=2, random_share=0.2, anchors=32, candidates=64)
    chosen = suggester.suggest_batch(400, pool, unit_rows(300, 8), 0.0, set(), Counter(), unit_rows(300, 8, 1))
    share = sum(s.kind == "random" for s in chosen) / len(chosen)
    assert 0.14 < share < 0.26  # binomial(400, 0.2): ±3 standard deviations
    assert all(s.reason == "random: keeps the data unbiased" for s in chosen if s.kind == "random")


def _hub_pool(n: int = 50, dim: int = 64, threshold: float = 0.5):
    """Image 0 is exactly ``threshold`` away from every other image; other pairs sit near 0.25."""
    rng = np.random.default_rng(0)
    u = np.zeros(dim)
    u[0] = 1.0
    others = rng.standard_normal((n - 1, dim))
    others[:, 0] = 0
    others /= np.linalg.norm(others, axis=1, keepdims=True)
    sin = np.sqrt(1 - threshold**2)
    emb = np.vstack([u, threshold * u + sin * others])
    return open_pool(n), torch.from_numpy(emb.astype(np.float32))


def test_a_heavily_used_image_is_avoided():
    pool, emb = _hub_pool()
    fresh = Suggester(seed=0, random_share=0.0, anchors=50, candidates=50)
    assert all(pool[0] in (s.image_a, s.image_b) for s in [fresh.suggest(pool, emb, 0.5, set(), Counter())])
    used = Suggester(seed=0, random_share=0.0, anchors=50, candidates=50)
    chosen = [used.suggest(pool, emb, 0.5, set(), Counter({pool[0]: 100})) for _ in range(10)]
    assert all(pool[0] not in (s.image_a, s.image_b) for s in chosen)


def test_a_batch_spreads_over_the_pool():
    pool, emb = _hub_pool()
    chosen = Suggester(seed=0, random_share=0.0, anchors=50, candidates=50).suggest_batch(
        20, pool, emb, 0.5, set(), Counter()
    )
    with_hub = sum(pool[0] in (s.image_a, s.image_b) for s in chosen)
    assert 1 <= with_hub <= 5  # the best partner of everyone, yet not in every pair
    counts = Counter(d for s in chosen for d in (s.image_a, s.image_b))
    assert max(counts.values()) <= 5


def test_same_seed_same_suggestions():
    pool, emb, ref = open_pool(100), unit_rows(100, 8), unit_rows(100, 8, 1)
    runs = [Suggester(seed=5).suggest_batch(10, pool, emb, 0.1, set(), Counter(), ref) for _ in range(2)]
    assert runs[0] == runs[1]


def test_ten_thousand_images_in_well_under_a_second():
    pool, emb, ref = digests(10_000), unit_rows(10_000, 128), unit_rows(10_000, 192, 1)
    suggester = Suggester(seed=0, random_share=0.0)
    suggester.suggest(pool, emb, 0.2, set(), Counter(), ref)  # warm-up (the reserve is memoized)
    started = time.perf_counter()
    for _ in range(5):
        assert suggester.suggest(pool, emb, 0.2, set(), Counter(), ref) is not None
    assert (time.perf_counter() - started) / 5 < 0.5


def test_thumbnails_ignore_brightness_and_tell_shapes_apart():
    left = np.zeros((32, 32), np.uint8)
    left[:, :16] = 200
    right = left[:, ::-1].copy()
    images = [Image.fromarray(left), Image.fromarray(left // 2 + 40), Image.fromarray(right)]
    v = thumbnail_vectors(images)
    assert v.shape == (3, 192)
    torch.testing.assert_close(v.norm(dim=1), torch.ones(3))
    assert float(v[0] @ v[1]) > 0.99  # same shape, dimmer and brighter background
    assert float(v[0] @ v[2]) < -0.9  # mirrored halves
    assert thumbnail_vectors([]).shape == (0, 192)


class LookupOnly:
    """A container and mapping that can only be looked up: iterating or copying it fails the test."""

    def __init__(self, items):
        self._items = dict(items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def get(self, key, default=None):
        return self._items.get(key, default)

    def __iter__(self):
        raise AssertionError("the suggester iterated (or copied) what it should only look up")

    def __len__(self) -> int:
        return len(self._items)


def test_labeled_pairs_and_usage_are_only_looked_up():
    """So a live view of a 100,000-label graph costs nothing per suggestion."""
    pool, emb = _hub_pool()
    labeled = LookupOnly({frozenset((pool[0], p)): 1 for p in pool[1:]})  # every pair with the hub is labeled
    usage = LookupOnly({pool[0]: 49, **{p: 1 for p in pool[1:]}})
    suggester = Suggester(seed=0, random_share=0.5, anchors=50, candidates=50)
    chosen = [suggester.suggest(pool, emb, 0.5, labeled, usage, unit_rows(50, 8, seed=9)) for _ in range(20)]
    assert all(s is not None and pool[0] not in (s.image_a, s.image_b) for s in chosen)
    kinds = {s.kind for s in chosen}
    assert "random" in kinds and kinds - {"random"}  # both the random and the model's paths looked up only


# -- join: placing an unplaced image against the labeled groups


def _grouped_pool(n: int = 40, dim: int = 16):
    """Pool images 0-2 are labeled one group, 3-4 another; 0 and 3 apart. The rest is unplaced."""
    pool, emb = open_pool(n), unit_rows(n, dim, seed=11)
    graph = LabelGraph.from_pairs(
        [
            LabeledPair("p0", pool[0], pool[1], True),
            LabeledPair("p1", pool[1], pool[2], True),
            LabeledPair("p2", pool[3], pool[4], True),
            LabeledPair("p3", pool[0], pool[3], False),
        ]
    )
    return pool, emb, graph


def _join(suggester: Suggester, pool, emb, threshold, graph) -> Suggestion:
    return suggester.suggest(pool, emb, threshold, graph.labeled(), graph.usage(), None, graph)


def test_join_pairs_an_unplaced_image_with_the_nearest_member_of_its_most_similar_group():
    pool, emb, graph = _grouped_pool()
    members = [0, 1, 2, 3, 4]
    sims = (emb @ emb.T).numpy()
    suggester = Suggester(seed=0, random_share=0.0, join_share=1.0)
    threshold = -1.0  # every group is similar enough: each pick is a member
    suggested = set()  # recent suggestions are not repeated: an anchor drawn again gets its next member
    for _ in range(15):
        s = _join(suggester, pool, emb, threshold, graph)
        assert s.kind == "join"
        anchor = pool.index(s.image_a)
        assert anchor not in members  # not placed by any "same" label
        open_members = [m for m in members if frozenset((anchor, m)) not in suggested]
        best = max(open_members, key=lambda m: sims[anchor, m])  # brute force: the most similar member
        suggested.add(frozenset((anchor, best)))
        assert s.image_b == pool[best]
        assert abs(s.similarity - sims[anchor, best]) < 1e-5
        size = 3 if best <= 2 else 2
        assert f"labeled group of {size}" in s.reason and f"apart from all {size}" in s.reason


def test_join_passes_over_a_group_the_labels_already_set_apart():
    pool, emb, graph = _grouped_pool()
    emb[10] = emb[1]  # the model finds image 10 identical to group {0, 1, 2} …
    emb[11] = emb[10]
    graph.add(LabeledPair("p4", pool[10], pool[2], False))  # … but it is labeled different from it
    suggester = Suggester(seed=0, random_share=0.0, join_share=1.0)
    chosen = [_join(suggester, pool, emb, -1.0, graph) for _ in range(60)]
    with_10 = [s for s in chosen if s.image_a == pool[10]]
    assert with_10, "image 10 was never an anchor"
    for s in with_10:
        # not group {0,1,2} (said different, by a label or implied); group {3,4} if better than unplaced images
        assert s.image_b not in pool[:3]
        assert graph.relation(s.image_a, s.image_b) is None


def test_join_seeds_a_new_group_when_every_group_is_unlike():
    pool, emb, graph = _grouped_pool()
    sims = (emb @ emb.T).numpy()
    suggester = Suggester(seed=0, random_share=0.0, join_share=1.0)
    suggested = set()
    for _ in range(10):
        s = _join(suggester, pool, emb, 1.01, graph)  # above every similarity: no group is similar enough
        a, b = pool.index(s.image_a), pool.index(s.image_b)
        assert s.kind == "join" and a >= 5 and b >= 5  # two unplaced images
        assert "may start a new group" in s.reason
        unplaced = [i for i in range(5, len(pool)) if i != a and frozenset((a, i)) not in suggested]
        assert sims[a, b] >= max(sims[a, i] for i in unplaced) - 1e-6  # its most similar unplaced image
        suggested.add(frozenset((a, b)))


def test_join_needs_a_group_and_never_uses_reserved_images():
    pool, emb = open_pool(30), unit_rows(30, 8, seed=2)
    alone = LabelGraph.from_pairs([LabeledPair("p0", pool[0], pool[1], False)])  # no group of two
    suggester = Suggester(seed=0, random_share=0.0, join_share=1.0)
    chosen = [_join(suggester, pool, emb, 0.0, alone) for _ in range(6)]
    assert all(s.kind == "uncertain" for s in chosen)  # no reference view: uncertain pairs instead
    reserved = next(d for d in digests(500, "r") if is_evaluation_image(d))
    mixed = [*pool, reserved]
    emb_mixed = torch.cat([emb, emb[:1]])  # the reserved image looks exactly like image 0
    graph = LabelGraph.from_pairs(
        [LabeledPair("p0", reserved, pool[0], True), LabeledPair("p1", pool[0], pool[1], True)]
    )
    for _ in range(10):
        s = _join(suggester, mixed, emb_mixed, -1.0, graph)
        assert reserved not in (s.image_a, s.image_b)


def test_join_share_is_respected():
    pool, emb, graph = _grouped_pool(200)
    suggester = Suggester(seed=3, random_share=0.2, join_share=0.5, anchors=32, candidates=64)
    kinds = Counter(_join(suggester, pool, emb, 0.0, graph).kind for _ in range(400))
    assert 0.32 < kinds["join"] / 400 < 0.48  # binomial(400, 0.4): ±3 standard deviations
    assert 0.14 < kinds["random"] / 400 < 0.26
    with pytest.raises(ValueError, match="join_share"):
        Suggester(join_share=1.5)


def test_merge_offers_the_closest_members_of_the_two_most_alike_groups_not_yet_set_apart():
    pool, emb = open_pool(30), unit_rows(30, 16, seed=12)
    # Groups {0,1}, {2,3}, {4,5}: the centres of the first two are identical, the third is far off.
    for a, b in ((1, 0), (2, 0), (3, 2), (5, 4)):
        emb[a] = emb[b]
    emb[4] = -emb[0]
    emb[5] = -emb[0]
    pairs = [LabeledPair(f"s{i}", pool[a], pool[b], True) for i, (a, b) in enumerate(((0, 1), (2, 3), (4, 5)))]
    graph = LabelGraph.from_pairs(pairs)
    suggester = Suggester(seed=0, random_share=0.0, join_share=1.0)
    merges = [s for s in (_join(suggester, pool, emb, 0.5, graph) for _ in range(20)) if s.kind == "merge"]
    assert 4 <= len(merges) <= 16  # about half the join draws
    first = merges[0]
    assert {pool.index(first.image_a), pool.index(first.image_b)} in ({0, 2}, {0, 3}, {1, 2}, {1, 3})
    assert first.similarity > 0.999 and "2 and 2 images" in first.reason and "implies 3 more pairs" in first.reason
    # Once those two are labeled different, no merge is offered: {4,5} is unlike both (below the threshold).
    graph.add(LabeledPair("d", first.image_a, first.image_b, False))
    later = [_join(suggester, pool, emb, 0.5, graph) for _ in range(20)]
    assert all(s.kind == "join" for s in later)


@pytest.mark.slow  # two fresh interpreters importing torch
def test_same_seed_same_join_suggestions_in_another_process():
    """Groups are sets, whose order depends on the process's string hashing: suggestions must not."""
    script = """
import hashlib, torch
from siamese.labelgraph import LabelGraph
from siamese.suggest import Suggester
from siamese.train import LabeledPair
pool = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(300)]
emb = torch.nn.functional.normalize(torch.randn(300, 8, generator=torch.Generator().manual_seed(0)), dim=1)
graph = LabelGraph.from_pairs(LabeledPair(f"p{i}", pool[i], pool[i + 1], i % 5 != 4) for i in range(0, 120))
s = Suggester(seed=0, random_share=0.0, join_share=1.0, candidates=16)
for _ in range(12):
    x = s.suggest(pool, emb, 0.2, graph.labeled(), graph.usage(), None, graph)
    print(x.kind, x.image_a[:8], x.image_b[:8])
"""
    runs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout)
    assert runs[0] == runs[1] and "merge" in runs[0] and "join" in runs[0]


class _Stated:
    """Groups that know only the stated labels (no implication): each answer is exactly what was said."""

    def __init__(self):
        self.answers: dict[frozenset[str], bool] = {}

    def group_members(self):
        return {}

    def relation(self, image_a, image_b):
        return self.answers.get(frozenset((image_a, image_b)))


def _label_with(suggester, pool, emb, ref, threshold, answer, n):
    """``n`` suggestions, each answered by ``answer(suggestion, model_said_same)``; the log of (kind, wrong)."""
    stated, log = _Stated(), []
    for _ in range(n):
        s = suggester.suggest(pool, emb, threshold, stated.answers.keys(), Counter(), ref, stated)
        said_same = s.similarity >= threshold
        same = answer(s, said_same)
        stated.answers[frozenset((s.image_a, s.image_b))] = same
        log.append((s, same != said_same))
    return log


def test_the_kinds_that_find_the_model_wrong_get_more_of_its_share():
    pool, emb, ref = open_pool(300), unit_rows(300, 16, seed=20), unit_rows(300, 16, seed=21)
    suggester = Suggester(seed=0, random_share=0.0, join_share=0.0, anchors=64, candidates=256)
    # An annotator who contradicts the model on uncertain pairs and agrees with it on hard ones.
    log = _label_with(suggester, pool, emb, ref, 0.0, lambda s, said: not said if s.kind == "uncertain" else said, 240)
    answered = log[:-1]  # the last answer is learned at the next call
    record = suggester.kind_record()
    rates = {}
    for kind in ("uncertain", "hard_positive", "hard_negative"):
        last = [wrong for s, wrong in answered if s.kind == kind][-30:]
        assert record[kind][:2] == (sum(last), len(last))
        rates[kind] = (sum(last) + 1) / (len(last) + 2)
    assert record["uncertain"][:2] == (30, 30) and record["hard_negative"][0] == 0
    for kind, rate in rates.items():
        assert record[kind][2] == pytest.approx(0.05 + 0.85 * rate / sum(rates.values()))
    late = Counter(s.kind for s, _ in log[-100:])
    assert late["uncertain"] >= 70  # its share is 0.05 + 0.85·(31/32)/(33/32) ≈ 0.85; thirds at the start
    assert Counter(s.kind for s, _ in log[:30])["uncertain"] <= 20
    uncertain = next(s for s, _ in reversed(log) if s.kind == "uncertain")
    assert "this kind found the model wrong in 30 of its last 30 answered picks" in uncertain.reason


def test_answers_under_an_uncalibrated_threshold_or_without_groups_do_not_count():
    pool, emb, ref = open_pool(100), unit_rows(100, 8, seed=22), unit_rows(100, 8, seed=23)
    suggester = Suggester(seed=0, random_share=0.0, join_share=0.0)
    _label_with(suggester, pool, emb, ref, 5.0, lambda s, said: not said, 40)  # the threshold splits nothing
    assert all(record[:2] == (0, 0) for record in suggester.kind_record().values())
    stated = _Stated()
    for _ in range(10):  # a threshold that splits the pairs, but one the caller says nobody calibrated
        s = suggester.suggest(pool, emb, 0.0, stated.answers.keys(), Counter(), ref, stated, calibrated=False)
        stated.answers[frozenset((s.image_a, s.image_b))] = False
    assert all(record[:2] == (0, 0) for record in suggester.kind_record().values())
    suggester.suggest_batch(20, pool, emb, 0.0, set(), Counter(), ref)  # no groups: no answers to learn from
    assert all(record[:2] == (0, 0) for record in suggester.kind_record().values())
    assert all(record[2] == pytest.approx(1 / 3) for record in suggester.kind_record().values())
