"""Embedding map: PCA against scikit-learn, Procrustes against a known rotation, groups and the picture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from siamese.embedmap import (
    NO_GROUP,
    UNLABELED,
    EmbeddingMap,
    align,
    build_map,
    pca,
    procrustes,
    render,
    sample_points,
)
from siamese.labelgraph import LabelGraph
from siamese.train import LabeledPair


def embeddings(n: int = 200, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * np.linspace(3.0, 0.2, d)  # distinct variances: well-defined axes
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_pca_matches_scikit_learn_up_to_sign():
    sklearn_decomposition = pytest.importorskip("sklearn.decomposition")
    x = embeddings()
    points, components, explained = pca(x, 2)
    reference = sklearn_decomposition.PCA(n_components=2, svd_solver="full").fit(x)
    signs = np.sign((components * reference.components_).sum(axis=1))
    np.testing.assert_allclose(components, reference.components_ * signs[:, None], atol=1e-8)
    np.testing.assert_allclose(points, reference.transform(x) * signs, atol=1e-8)
    np.testing.assert_allclose(explained, reference.explained_variance_ratio_, atol=1e-10)


def test_pca_sign_is_deterministic():
    x = embeddings(seed=1)
    points, components, _ = pca(x, 2)
    for axis in components:
        assert axis[np.abs(axis).argmax()] > 0  # the largest loading points the positive way
    # SVD may return either sign for -x; the convention picks the same axes, so the points mirror exactly.
    mirrored_points, mirrored_components, _ = pca(-x, 2)
    np.testing.assert_allclose(mirrored_components, components, atol=1e-10)
    np.testing.assert_allclose(mirrored_points, -points, atol=1e-10)
    np.testing.assert_array_equal(pca(x, 2)[0], points)


def test_procrustes_recovers_a_rotation_with_reflection():
    rng = np.random.default_rng(2)
    source = rng.standard_normal((50, 2))
    angle = 0.7
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]) @ np.diag([1, -1])
    target = source @ rotation + np.array([3.0, -1.0])
    found = procrustes(source, target)
    np.testing.assert_allclose(found, rotation, atol=1e-10)


def test_align_turns_the_previous_map_onto_the_new_one():
    x = embeddings(seed=3)
    names = [f"{i:064x}" for i in range(len(x))]
    current = build_map("v2", names, x)
    angle = 2.1
    turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    previous = EmbeddingMap("v1", current.digests[::-1], current.points[::-1] @ turn * 0.5, current.groups, (0, 0))
    aligned = align(previous, current)
    assert aligned.version == "v1" and aligned.digests == previous.digests
    np.testing.assert_allclose(aligned.points[::-1], current.points, atol=1e-9)
    few = EmbeddingMap("v0", current.digests[:2], current.points[:2], current.groups[:2], (0, 0))
    assert align(few, current) is few  # fewer than three shared images: nothing to fit


def test_groups_colour_labeled_images_by_their_same_group():
    names = [c * 64 for c in "abcdefg"]
    a, b, c, d, e, f, _ = names
    graph = LabelGraph.from_pairs(
        [
            LabeledPair("1", a, b, True),
            LabeledPair("2", b, c, True),
            LabeledPair("3", d, e, True),
            LabeledPair("4", c, f, False),
        ]
    )
    emb_map = build_map("v1", names, torch.from_numpy(embeddings(7, 4)), graph)
    assert emb_map.groups == ("group 1", "group 1", "group 1", "group 2", "group 2", NO_GROUP, UNLABELED)
    columns = emb_map.columns()
    assert set(columns) == {"x", "y", "group", "digest"} and all(len(v) == 7 for v in columns.values())
    assert columns["digest"] == names and columns["group"][0] == "group 1"
    np.testing.assert_allclose(columns["x"], emb_map.points[:, 0])
    assert emb_map.records()[3] == {"x": columns["x"][3], "y": columns["y"][3], "group": "group 2", "digest": d}
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(columns)
    assert list(frame.columns) == ["x", "y", "group", "digest"] and len(frame) == 7


def test_max_points_keeps_every_labeled_image():
    names = [f"{i:064x}" for i in range(300)]
    graph = LabelGraph.from_pairs([LabeledPair("p", names[250], names[299], False)])
    emb_map = build_map("v1", names, embeddings(300, 8), graph, max_points=40)
    assert len(emb_map.digests) == 40
    assert {names[250], names[299]} <= set(emb_map.digests)
    full = build_map("v1", names, embeddings(300, 8), graph)
    where = {d: i for i, d in enumerate(full.digests)}
    np.testing.assert_allclose(emb_map.points, full.points[[where[d] for d in emb_map.digests]])  # same PCA


def test_render_draws_each_map_side_by_side():
    names = [f"{i:064x}" for i in range(30)]
    graph = LabelGraph.from_pairs([LabeledPair("p", names[0], names[1], True)])
    first = build_map("v1", names, embeddings(30, 8, seed=4), graph)
    second = build_map("v2", names, embeddings(30, 8, seed=5), graph)
    picture = render([align(first, second), second], size=200, titles=["v1 (before)", "v2 (active)"])
    assert picture.size == (400, 242)  # two 200-pixel panels, a title line above, a colour key below
    pixels = np.asarray(picture).reshape(-1, 3)
    assert (pixels == (31, 119, 180)).all(axis=1).any()  # group 1's colour is drawn
    assert (pixels == (200, 200, 200)).all(axis=1).any()  # and the unlabeled grey
    assert render(second, size=200).size == (200, 242)
    with pytest.raises(ValueError, match="at least one map"):
        render([])
    with pytest.raises(ValueError, match="one title per map"):
        render([first, second], titles=["only one"])


def _drawn_extent(picture: Image.Image, left: int, size: int = 200, title: int = 22) -> tuple[int, int]:
    """Columns of the first and last non-white, non-frame pixel inside one panel's plot area."""
    area = np.asarray(picture)[title + 2 : title + size - 4, left + 4 : left + size - 4]
    ink = np.flatnonzero(((area != 255).any(axis=2) & (area != 220).any(axis=2)).any(axis=0))
    return int(ink.min()), int(ink.max())


def test_render_puts_every_panel_on_one_scale():
    names = [f"{i:064x}" for i in range(20)]
    points = embeddings(20, 2, seed=6) * 3
    wide = EmbeddingMap("v2", tuple(names), points, (UNLABELED,) * 20, (0.5, 0.5))
    narrow = EmbeddingMap("v1", tuple(names), points / 2 - points.mean(axis=0) / 2, wide.groups, (0.5, 0.5))
    picture = render([narrow, wide], size=200)
    low, high = _drawn_extent(picture, 200)
    narrow_low, narrow_high = _drawn_extent(picture, 0)
    # the half-size map covers about half the width the full one does (each alone would fill its panel)
    assert 0.4 < (narrow_high - narrow_low) / (high - low) < 0.6
    alone_low, alone_high = _drawn_extent(render(narrow, size=200), 0)
    assert (alone_high - alone_low) > 0.9 * (high - low)


def test_sample_points_keeps_labeled_images_first():
    groups = [UNLABELED] * 50 + ["group 1"] * 5 + [NO_GROUP] * 3
    keep = sample_points(groups, 20, seed=1)
    assert len(keep) == 20 and list(keep) == sorted(keep)
    assert set(range(50, 58)) <= set(keep.tolist())  # every labeled image
    np.testing.assert_array_equal(keep, sample_points(groups, 20, seed=1))  # seeded
    assert sample_points(groups, None).tolist() == list(range(58))
    crowded = sample_points(["group 1"] * 30 + [UNLABELED] * 10, 12)
    assert len(crowded) == 12 and max(crowded) < 30  # more labeled images than room: a sample of them


def test_the_colour_key_wraps_to_fit_one_panel():
    names = [f"{i:064x}" for i in range(40)]
    pairs = [LabeledPair(f"p{i}", names[2 * i], names[2 * i + 1], True) for i in range(12)]  # 12 groups of two
    emb_map = build_map("v1", names, embeddings(40, 8, seed=7), LabelGraph.from_pairs(pairs))
    picture = render(emb_map, size=200)
    assert picture.width == 200 and picture.height > 242  # the key took more than one line
    key = np.asarray(picture)[222:].reshape(-1, 3)
    for colour in [(23, 190, 207), (127, 127, 127), (200, 200, 200)]:  # group 9, the smaller groups, unlabeled
        assert (key == colour).all(axis=1).any()
