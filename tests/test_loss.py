"""The contrastive loss, checked against plain-Python loops and cases worked by hand."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from siamese.loss import ContrastiveLoss


def reference_loss(emb_a: list[list[float]], emb_b: list[list[float]], labels: list[int], margin: float) -> float:
    """L = 1/(2N) Σ [ y·D² + (1−y)·max(0, m−D)² ], written out with loops."""
    total = 0.0
    for a, b, y in zip(emb_a, emb_b, labels, strict=True):
        d = math.sqrt(sum((x - z) ** 2 for x, z in zip(a, b, strict=True)))
        total += y * d**2 + (1 - y) * max(0.0, margin - d) ** 2
    return total / (2 * len(labels))


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=generator, dtype=torch.float64), dim=1)


@pytest.mark.parametrize("margin", [0.5, 1.0, 1.7, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_plain_python_on_random_pairs(margin, seed):
    a, b = unit_rows(9, 5, seed), unit_rows(9, 5, seed + 100)
    b[:3] = a[:3] + 0.01 * unit_rows(3, 5, seed + 200)  # some close pairs, so both hinge branches occur
    labels = [random.Random(seed).randint(0, 1) for _ in range(9)]
    labels[0], labels[1] = 0, 1
    expected = reference_loss(a.tolist(), b.tolist(), labels, margin)
    got = ContrastiveLoss(margin)(a, b, torch.tensor(labels))
    assert got.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_per_pair_values_before_averaging():
    a, b = unit_rows(4, 3, 7), unit_rows(4, 3, 8)
    labels = [1, 0, 1, 0]
    per_pair = ContrastiveLoss(1.2).per_pair(a, b, torch.tensor(labels))
    for i, y in enumerate(labels):
        assert per_pair[i].item() == pytest.approx(2 * reference_loss([a[i].tolist()], [b[i].tolist()], [y], 1.2))


def test_identical_embeddings():
    e = unit_rows(1, 4, 3)
    loss = ContrastiveLoss(margin=0.8)
    assert loss(e, e.clone(), torch.tensor([1])).item() == 0.0  # same and at distance 0: nothing to learn
    assert loss(e, e.clone(), torch.tensor([0])).item() == pytest.approx(0.8**2 / 2)  # different: m²/2


def test_orthogonal_unit_vectors_are_sqrt2_apart():
    a = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    assert ContrastiveLoss().per_pair(a, b, torch.tensor([1])).item() == pytest.approx(2.0)  # D² = 2
    # Different at D = √2 with m = 1.5: (1.5 − √2)² in the hinge; with m = 1 the hinge is inactive.
    assert ContrastiveLoss(1.5).per_pair(a, b, torch.tensor([0])).item() == pytest.approx((1.5 - math.sqrt(2)) ** 2)
    assert ContrastiveLoss(1.0).per_pair(a, b, torch.tensor([0])).item() == 0.0


def test_default_margin_is_one():
    assert ContrastiveLoss().margin == 1.0


@pytest.mark.parametrize("margin", [0, 0.0, -0.5, 2.5, float("nan")])
def test_margin_outside_0_2_is_refused(margin):
    with pytest.raises(ValueError, match="margin"):
        ContrastiveLoss(margin)


def test_margin_2_is_allowed():
    assert ContrastiveLoss(2.0).margin == 2.0


@pytest.mark.parametrize("label", [0, 1])
def test_gradient_is_finite_at_distance_zero(label):
    a = F.normalize(torch.randn(3, 4), dim=1)
    a_param = a.clone().requires_grad_(True)
    b_param = a.clone().requires_grad_(True)
    ContrastiveLoss()(a_param, b_param, torch.full((3,), label)).backward()
    assert torch.isfinite(a_param.grad).all() and torch.isfinite(b_param.grad).all()


def test_gradient_pulls_same_pairs_together_and_pushes_different_apart():
    a = torch.tensor([[1.0, 0.0]], requires_grad=True)
    b = torch.tensor([[0.6, 0.8]])
    ContrastiveLoss(margin=2.0)(a, b, torch.tensor([1])).backward()
    same_step = -a.grad.clone()  # gradient descent direction
    a.grad = None
    ContrastiveLoss(margin=2.0)(a, b, torch.tensor([0])).backward()
    different_step = -a.grad
    toward_b = b - a.detach()
    assert (same_step * toward_b).sum() > 0
    assert (different_step * toward_b).sum() < 0


def test_bool_and_float_labels_are_accepted():
    a, b = unit_rows(3, 4, 5), unit_rows(3, 4, 6)
    expected = ContrastiveLoss()(a, b, torch.tensor([1, 0, 1]))
    assert ContrastiveLoss()(a, b, torch.tensor([True, False, True])).item() == pytest.approx(expected.item())
    assert ContrastiveLoss()(a, b, torch.tensor([1.0, 0.0, 1.0])).item() == pytest.approx(expected.item())


@pytest.mark.parametrize(
    ("emb_a", "emb_b", "labels", "message"),
    [
        (torch.zeros(3, 4), torch.zeros(3, 5), torch.zeros(3), "same shape"),
        (torch.zeros(3, 4), torch.zeros(2, 4), torch.zeros(3), "same shape"),
        (torch.zeros(4), torch.zeros(4), torch.zeros(1), r"\(N, D\)"),
        (torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(2), r"labels must be \(3,\)"),
        (torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(3, 1), r"labels must be \(3,\)"),
        (torch.zeros(2, 4), torch.zeros(2, 4), torch.tensor([1, 2]), "1 \\(same\\) or 0 \\(different\\)"),
        (torch.zeros(2, 4), torch.zeros(2, 4), torch.tensor([1.0, 0.5]), "1 \\(same\\) or 0"),
        (torch.zeros(2, 4), torch.zeros(2, 4), torch.tensor([-1, 1]), "1 \\(same\\) or 0"),
        (torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0), "at least one pair"),
    ],
)
def test_bad_inputs_get_clear_errors(emb_a, emb_b, labels, message):
    with pytest.raises(ValueError, match=message):
        ContrastiveLoss()(emb_a, emb_b, labels)


def test_gradient_matches_finite_differences():
    a = unit_rows(4, 3, 11).requires_grad_(True)
    b = unit_rows(4, 3, 12).requires_grad_(True)
    labels = torch.tensor([1, 0, 1, 0])
    assert torch.autograd.gradcheck(lambda x, y: ContrastiveLoss(1.9)(x, y, labels), (a, b))


@pytest.mark.parametrize("gap", [1e-20, 1e-30])
def test_gradient_is_finite_just_above_distance_zero(gap):
    a = torch.tensor([[1.0, 0.0]], requires_grad=True)
    b = torch.tensor([[1.0, gap]])
    ContrastiveLoss()(a, b, torch.tensor([0])).backward()
    assert torch.isfinite(a.grad).all()
