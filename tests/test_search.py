"""Pool search: results against a brute-force numpy sort, incremental updates, and speed."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from siamese.labelgraph import LabelGraph
from siamese.search import PoolIndex, describe
from siamese.train import LabeledPair


def unit_rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=1, keepdim=True)


def names(n: int) -> list[str]:
    return [f"{i:064x}" for i in range(n)]


def brute_force(matrix: np.ndarray, digests: list[str], query: np.ndarray, k: int, exclude=()) -> list[str]:
    scores = matrix.astype(np.float64) @ query.astype(np.float64)
    order = [i for i in np.argsort(-scores, kind="stable") if digests[i] not in set(exclude)]
    return [digests[i] for i in order[:k]]


def test_search_matches_a_brute_force_sort():
    emb, digests = unit_rows(500, 32), names(500)
    index = PoolIndex("v1")
    index.add(digests, emb)
    for q in range(5):
        query = unit_rows(1, 32, seed=100 + q)[0]
        hits = index.search(query, k=10)
        assert [d for d, _ in hits] == brute_force(emb.numpy(), digests, query.numpy(), 10)
        expected = (emb.numpy().astype(np.float64) @ query.numpy().astype(np.float64))[[int(d, 16) for d, _ in hits]]
        np.testing.assert_allclose([s for _, s in hits], expected, atol=1e-5)
        assert all(a[1] >= b[1] for a, b in itertools.pairwise(hits))


def test_exclude_and_k_larger_than_the_pool():
    emb, digests = unit_rows(6, 8), names(6)
    index = PoolIndex("v1")
    index.add(digests, emb)
    hits = index.search(emb[2], k=3, exclude=[digests[2]])
    assert digests[2] not in [d for d, _ in hits]
    assert [d for d, _ in hits] == brute_force(emb.numpy(), digests, emb[2].numpy(), 3, exclude=[digests[2]])
    assert len(index.search(emb[0], k=100, exclude=digests[:2])) == 4
    assert index.search(emb[0], k=1)[0] == (digests[0], pytest.approx(1.0, abs=1e-5))
    assert PoolIndex("empty").search(emb[0], k=3) == []


def test_update_embeds_only_new_images_and_grows_in_place():
    emb, digests = unit_rows(3000, 16), names(3000)
    calls: list[list[str]] = []

    def embed_fn(batch: list[str]) -> torch.Tensor:
        calls.append(batch)
        return emb[[int(d, 16) for d in batch]]

    index = PoolIndex("v1", initial_capacity=4)
    assert index.update(digests[:10], embed_fn) == 10
    assert index.update(digests[:10], embed_fn) == 0  # nothing new: no call
    assert sum(len(c) for c in calls) == 10
    assert index.update(digests[5:3000] + digests[5:7], embed_fn) == 2990  # duplicates once, in chunks
    assert sum(len(c) for c in calls) == 3000 and max(len(c) for c in calls) <= 256
    assert len(index) == 3000 and index.digests == digests
    torch.testing.assert_close(index.matrix(), emb)  # earlier rows survived every growth
    torch.testing.assert_close(index.rows([digests[7], digests[2999]]), emb[[7, 2999]])
    assert digests[3] in index and "missing" not in index
    listed, rows = index.snapshot()
    assert listed == digests and rows.shape == (3000, 16)


def test_update_limit_embeds_part_now_and_the_rest_later():
    emb, digests = unit_rows(50, 4), names(50)
    index = PoolIndex("v1")
    assert index.update(digests, lambda batch: emb[[int(d, 16) for d in batch]], limit=20) == 20
    assert index.digests == digests[:20]
    assert index.update(digests, lambda batch: emb[[int(d, 16) for d in batch]]) == 30
    torch.testing.assert_close(index.matrix(), emb)


def test_bad_inputs_say_what_is_wrong():
    index = PoolIndex("v1")
    index.add(names(2), unit_rows(2, 8))
    with pytest.raises(ValueError, match="one PoolIndex per model version"):
        index.add(["x" * 64], unit_rows(1, 4))
    with pytest.raises(ValueError, match="one \\(D,\\) row per digest"):
        index.add(names(3), unit_rows(2, 8))
    with pytest.raises(ValueError, match="query is 4-D"):
        index.search(unit_rows(1, 4)[0], k=2)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        index.search(unit_rows(1, 8)[0], k=0)
    with pytest.raises(KeyError, match="update it first"):
        index.rows(["f" * 64])


def test_describe_adds_label_hints():
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    graph = LabelGraph.from_pairs([LabeledPair("p1", a, b, True), LabeledPair("p2", a, c, False)])
    rows = describe([(a, 0.9), ("d" * 64, 0.5)], graph.hint)
    assert rows == [
        {"image_id": a, "similarity": 0.9, "label_hint": "labeled same as 1 image, different from 1"},
        {"image_id": "d" * 64, "similarity": 0.5, "label_hint": None},
    ]


def test_query_of_100k_by_128_is_fast():
    index = PoolIndex("v1")
    emb = unit_rows(100_000, 128)
    index.add([f"{i:064x}" for i in range(100_000)], emb)
    query = unit_rows(1, 128, seed=9)[0]
    index.search(query, k=8)  # warm-up
    timings = []
    for _ in range(10):
        started = time.perf_counter()
        hits = index.search(query, k=8)
        timings.append(time.perf_counter() - started)
    assert len(hits) == 8
    assert hits[0][0] == f"{int(torch.argmax(emb @ query)):064x}"
    assert float(np.median(timings)) < 0.1, f"median query {np.median(timings) * 1000:.1f} ms"
