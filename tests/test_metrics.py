"""Pair metrics checked against scikit-learn and against brute force on random data."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from siamese.metrics import (
    accuracy_at,
    best_threshold,
    distance_histograms,
    equal_error_rate,
    evaluate_pairs,
    roc_auc,
    roc_curve,
    tar_at_far,
)


def _random_pairs(seed: int, n: int = 300, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.random(n) < 0.4
    scores = np.clip(rng.normal(0.1, 0.4, n) + 0.5 * labels, -1, 1)
    if ties:
        scores = np.round(scores, 1)  # many exact ties, across classes
    return scores, labels


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("ties", [False, True])
def test_auc_matches_sklearn(seed, ties):
    scores, labels = _random_pairs(seed, ties=ties)
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_roc_curve_matches_sklearn(ties):
    scores, labels = _random_pairs(3, ties=ties)
    far, tar, thresholds = roc_curve(scores, labels)
    sk_far, sk_tar, sk_thresholds = sk_roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(far, sk_far)
    np.testing.assert_allclose(tar, sk_tar)
    np.testing.assert_allclose(thresholds[1:], sk_thresholds[1:])


@pytest.mark.parametrize("seed", range(5))
def test_best_threshold_is_best_by_brute_force(seed):
    scores, labels = _random_pairs(seed, n=120, ties=seed % 2 == 1)
    threshold, accuracy = best_threshold(scores, labels)
    # Every possible decision is some "accept the scores >= s"; try each and nothing.
    candidates = np.r_[scores, np.inf]
    brute = max(np.mean((scores >= c) == labels) for c in candidates)
    assert accuracy == pytest.approx(brute)
    assert accuracy_at(scores, labels, threshold) == pytest.approx(accuracy)


def test_best_threshold_separable_lies_between_classes():
    scores = np.array([0.9, 0.8, 0.7, 0.2, 0.1])
    labels = np.array([1, 1, 1, 0, 0])
    threshold, accuracy = best_threshold(scores, labels)
    assert accuracy == 1.0
    assert 0.2 < threshold < 0.7


def test_accuracy_uses_greater_or_equal():
    assert accuracy_at([0.5, 0.4], [1, 0], threshold=0.5) == 1.0
    assert accuracy_at([0.5, 0.4], [1, 0], threshold=0.5000001) == 0.5


@pytest.mark.parametrize("seed", range(6))
def test_eer_where_far_equals_frr_on_sklearn_curve(seed):
    scores, labels = _random_pairs(seed)
    sk_far, sk_tar, _ = sk_roc_curve(labels, scores, drop_intermediate=False)
    frr = 1 - sk_tar
    eer = equal_error_rate(scores, labels)
    # The crossing lies on the first segment of sklearn's curve where FAR overtakes FRR.
    i = next(k for k in range(len(sk_far)) if sk_far[k] >= frr[k])
    lo, hi = sorted([sk_far[i - 1], sk_far[i]])
    assert lo - 1e-12 <= eer <= hi + 1e-12
    lo, hi = sorted([frr[i - 1], frr[i]])
    assert lo - 1e-12 <= eer <= hi + 1e-12


def test_eer_perfect_and_inverted():
    assert equal_error_rate([0.9, 0.8, 0.1, 0.0], [1, 1, 0, 0]) == 0.0
    assert equal_error_rate([0.1, 0.0, 0.9, 0.8], [1, 1, 0, 0]) == 1.0


@pytest.mark.parametrize("seed", range(4))
def test_tar_at_far_matches_sklearn(seed):
    scores, labels = _random_pairs(seed, n=1000)
    sk_far, sk_tar, _ = sk_roc_curve(labels, scores, drop_intermediate=False)
    expected = sk_tar[sk_far <= 1e-2].max()
    assert tar_at_far(scores, labels, 1e-2) == pytest.approx(expected)


def test_tar_at_far_needs_enough_negatives():
    scores, labels = _random_pairs(0, n=100)  # about 60 negatives
    assert (~labels).sum() < 100
    assert tar_at_far(scores, labels, 1e-2) is None


def test_distance_histograms_count_each_pair_once():
    scores = np.array([1.0, 0.0, -1.0, 0.5, 0.99])
    labels = np.array([1, 0, 0, 1, 1])
    hist = distance_histograms(scores, labels, bins=4)
    assert hist["bin_edges"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    # distances: 0, 1.414, 2, 1, 0.141 -> same in bins 0, 2, 0; different in bins 2, 3
    assert hist["same"] == [2, 0, 1, 0]
    assert hist["different"] == [0, 0, 1, 1]


def test_evaluate_pairs_fields_and_values():
    scores, labels = _random_pairs(1, n=400)
    metrics = evaluate_pairs(scores, labels)
    assert metrics["auc"] == pytest.approx(roc_auc_score(labels, scores), abs=1e-6)
    assert metrics["n_pairs"] == 400
    assert metrics["n_same"] + metrics["n_different"] == 400
    assert metrics["threshold_calibrated"] is True
    assert metrics["tar_at_far_1e-2"] is not None
    assert sum(metrics["histograms"]["same"]) == labels.sum()
    fixed = evaluate_pairs(scores, labels, threshold=0.3)
    assert fixed["threshold"] == 0.3 and fixed["threshold_calibrated"] is False
    assert fixed["accuracy"] == pytest.approx(np.mean((scores >= 0.3) == labels), abs=1e-6)


def test_one_class_gives_none_not_a_crash():
    metrics = evaluate_pairs([0.9, 0.5, 0.7], [1, 1, 1])
    assert metrics["auc"] is None and metrics["eer"] is None and metrics["tar_at_far_1e-2"] is None
    assert metrics["accuracy"] == 1.0
    assert roc_auc([0.1, 0.2], [0, 0]) is None


def test_empty_and_malformed_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="no pairs"):
        evaluate_pairs([], [])
    with pytest.raises(ValueError, match="one label per similarity"):
        evaluate_pairs([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="finite"):
        evaluate_pairs([0.1, float("nan")], [1, 0])
    with pytest.raises(ValueError, match="labels must be"):
        evaluate_pairs([0.1, 0.2], [1, 2])
    with pytest.raises(ValueError, match="both same and different"):
        roc_curve([0.1, 0.2], [1, 1])
