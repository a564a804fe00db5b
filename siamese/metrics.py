"""Pair metrics: pure functions over numpy arrays of similarities and labels.

``similarities`` are cosine similarities of two unit embeddings (higher = more alike); ``labels`` are
1/True for "same" and 0/False for "different". A pair is predicted "same" when
``similarity >= threshold``. scikit-learn is the reference these are tested against (``roc_auc_score``,
``roc_curve``); none of them needs it at run time.
"""

from __future__ import annotations

import math

import numpy as np

# TAR at FAR = 1e-2 means "at most 1 false accept in 100"; with fewer negatives it cannot be measured.
MIN_NEGATIVES_FOR_TAR = 100
# Distance histograms: 20 fixed bins over the whole range of Euclidean distances of unit vectors.
HISTOGRAM_BINS = 20
DISTANCE_RANGE = (0.0, 2.0)


def _as_arrays(similarities, labels) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 scores and bool labels of the same length."""
    scores = np.asarray(similarities, dtype=np.float64).reshape(-1)
    truth = np.asarray(labels).reshape(-1)
    if scores.shape != truth.shape:
        raise ValueError(f"need one label per similarity; got {scores.size} similarities and {truth.size} labels")
    if not np.isfinite(scores).all():
        raise ValueError("similarities must be finite numbers (found NaN or inf)")
    if truth.dtype != np.bool_:
        if truth.size and not np.isin(truth, (0, 1)).all():
            raise ValueError("labels must be 1/True (same) or 0/False (different)")
        truth = truth.astype(bool)
    return scores, truth


def roc_curve(similarities, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """False and true accept rates at every distinct threshold, highest threshold first.

    Returns ``(far, tar, thresholds)``; the first point is (0, 0) with threshold +inf, as in
    scikit-learn's ``roc_curve(..., drop_intermediate=False)``. Needs both classes.
    """
    scores, truth = _as_arrays(similarities, labels)
    n_pos, n_neg = int(truth.sum()), int((~truth).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"a ROC curve needs both same and different pairs; got {n_pos} same and {n_neg} different")
    order = np.argsort(-scores, kind="mergesort")
    scores, truth = scores[order], truth[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]  # ties move together
    true_accepts = np.cumsum(truth)[last_of_tie]
    false_accepts = (last_of_tie + 1) - true_accepts
    far = np.r_[0.0, false_accepts / n_neg]
    tar = np.r_[0.0, true_accepts / n_pos]
    return far, tar, np.r_[np.inf, scores[last_of_tie]]


def roc_auc(similarities, labels) -> float | None:
    """Area under the ROC curve (ties count one half, as in scikit-learn); None with one class only."""
    scores, truth = _as_arrays(similarities, labels)
    if truth.all() or not truth.any():
        return None
    far, tar, _ = roc_curve(scores, truth)
    return float(np.sum(np.diff(far) * (tar[1:] + tar[:-1])) / 2)  # trapezoids


def accuracy_at(similarities, labels, threshold: float) -> float:
    """The fraction of pairs decided right by ``similarity >= threshold``."""
    scores, truth = _as_arrays(similarities, labels)
    if scores.size == 0:
        raise ValueError("accuracy needs at least one pair")
    return float(np.mean((scores >= threshold) == truth))


def best_threshold(similarities, labels) -> tuple[float, float]:
    """The threshold that decides the most pairs right, and that accuracy.

    Candidates are midway between consecutive distinct similarities (plus one below the lowest and
    one above the highest), so the decision does not hang on one pair's exact score. Ties in accuracy
    go to the threshold nearest the middle of the best run.
    """
    scores, truth = _as_arrays(similarities, labels)
    if scores.size == 0:
        raise ValueError("calibrating a threshold needs at least one pair")
    order = np.argsort(-scores, kind="mergesort")
    scores, truth = scores[order], truth[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]
    true_accepts = np.r_[0, np.cumsum(truth)[last_of_tie]]  # accepting the top k distinct values
    accepted = np.r_[0, last_of_tie + 1]
    n_neg = int((~truth).sum())
    correct = true_accepts + (n_neg - (accepted - true_accepts))  # true accepts + true rejects
    distinct = scores[last_of_tie]  # descending
    margin = 1e-6
    # Threshold k accepts the top k distinct values: above distinct[0] for k = 0, below the last for k = n.
    cuts = np.r_[distinct[0] + margin, (distinct[:-1] + distinct[1:]) / 2, distinct[-1] - margin]
    best = np.flatnonzero(correct == correct.max())
    pick = best[len(best) // 2]
    return float(cuts[pick]), float(correct[pick] / scores.size)


def equal_error_rate(similarities, labels) -> float | None:
    """The rate where false accepts equal false rejects (the ROC curve, linearly interpolated, meets
    FAR = 1 - TAR); None with one class only."""
    scores, truth = _as_arrays(similarities, labels)
    if truth.all() or not truth.any():
        return None
    far, tar, _ = roc_curve(scores, truth)
    gap = far + tar - 1.0  # FAR - FRR; rises from -1 at (0, 0) to 1 at (1, 1)
    i = int(np.argmax(gap >= 0))
    if gap[i] == 0 or i == 0:
        return float(far[i])
    t = -gap[i - 1] / (gap[i] - gap[i - 1])
    return float(far[i - 1] + t * (far[i] - far[i - 1]))


def tar_at_far(similarities, labels, far: float = 1e-2, min_negatives: int = MIN_NEGATIVES_FOR_TAR) -> float | None:
    """The highest true accept rate whose false accept rate is at most ``far``.

    None with no same pairs or with fewer than ``min_negatives`` different pairs (too few to measure
    a rate of ``far``).
    """
    scores, truth = _as_arrays(similarities, labels)
    if not truth.any() or int((~truth).sum()) < max(min_negatives, 1):
        return None
    rates_far, rates_tar, _ = roc_curve(scores, truth)
    return float(rates_tar[rates_far <= far].max())


def distances(similarities) -> np.ndarray:
    """Euclidean distances of unit vectors from their cosine similarities: sqrt(2 - 2 cos), in [0, 2]."""
    cos = np.clip(np.asarray(similarities, dtype=np.float64), -1.0, 1.0)
    return np.sqrt(2.0 - 2.0 * cos)


def distance_histograms(similarities, labels, bins: int = HISTOGRAM_BINS) -> dict:
    """Counts of same and different pairs per distance bin (fixed edges over [0, 2])."""
    scores, truth = _as_arrays(similarities, labels)
    dist = distances(scores)
    edges = np.linspace(*DISTANCE_RANGE, bins + 1)
    same, _ = np.histogram(dist[truth], bins=edges)
    different, _ = np.histogram(dist[~truth], bins=edges)
    return {
        "bin_edges": [round(float(e), 6) for e in edges],
        "same": same.astype(int).tolist(),
        "different": different.astype(int).tolist(),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 6)


def evaluate_pairs(similarities, labels, threshold: float | None = None) -> dict:
    """Every pair metric in one JSON-ready dict.

    Args:
        similarities: cosine similarity per pair.
        labels: 1/True for same, 0/False for different.
        threshold: the decision threshold; None calibrates the best one on these pairs.

    Returns:
        ``auc``, ``eer``, ``tar_at_far_1e-2`` (None where they cannot be measured), ``accuracy``,
        ``threshold``, ``threshold_calibrated`` (whether it was fitted on these very pairs),
        ``n_pairs``, ``n_same``, ``n_different`` and ``histograms``.
    """
    scores, truth = _as_arrays(similarities, labels)
    if scores.size == 0:
        raise ValueError("no pairs to evaluate: label some pairs first")
    calibrated = threshold is None
    if calibrated:
        threshold, _ = best_threshold(scores, truth)
    return {
        "auc": _rounded(roc_auc(scores, truth)),
        "accuracy": _rounded(accuracy_at(scores, truth, threshold)),
        "threshold": _rounded(threshold),
        "threshold_calibrated": calibrated,
        "eer": _rounded(equal_error_rate(scores, truth)),
        "tar_at_far_1e-2": _rounded(tar_at_far(scores, truth, 1e-2)),
        "n_pairs": int(scores.size),
        "n_same": int(truth.sum()),
        "n_different": int((~truth).sum()),
        "histograms": distance_histograms(scores, truth),
    }
