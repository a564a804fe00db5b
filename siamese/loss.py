"""The contrastive loss (Hadsell, Chopra & LeCun, 2006) on L2-normalized embeddings."""

from __future__ import annotations

import torch
from torch import nn


def _check(emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor) -> None:
    if emb_a.ndim != 2 or emb_a.shape != emb_b.shape:
        raise ValueError(
            f"embeddings must both be (N, D) with the same shape; got {tuple(emb_a.shape)} and {tuple(emb_b.shape)}"
        )
    if labels.shape != (emb_a.shape[0],):
        raise ValueError(f"labels must be ({emb_a.shape[0]},) to match the embeddings; got {tuple(labels.shape)}")
    if emb_a.shape[0] == 0:
        raise ValueError("the loss needs at least one pair")
    if not torch.all((labels == 0) | (labels == 1)):
        raise ValueError("labels must be 1 (same) or 0 (different)")


class ContrastiveLoss(nn.Module):
    """L = 1/(2N) Σᵢ [ yᵢ·Dᵢ² + (1−yᵢ)·max(0, m−Dᵢ)² ], yᵢ = 1 for "same".

    Dᵢ is the Euclidean distance between the two embeddings of pair i. With unit vectors D ∈ [0, 2],
    so the margin must lie in (0, 2].
    """

    def __init__(self, margin: float = 1.0):
        super().__init__()
        if not 0.0 < float(margin) <= 2.0:
            raise ValueError(f"margin must be in (0, 2] for normalized embeddings, got {margin}")
        self.margin = float(margin)

    def per_pair(self, emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(N,) values yᵢ·Dᵢ² + (1−yᵢ)·max(0, m−Dᵢ)², before the 1/(2N)."""
        _check(emb_a, emb_b, labels)
        y = labels.to(emb_a.dtype)
        d2 = (emb_a - emb_b).pow(2).sum(dim=1)  # (N,) D², smooth at 0
        # D exactly, with a finite gradient at D = 0: sqrt's derivative there is infinite, so the square
        # root only ever sees positive values (a clamp to some ε would bias D, and L, by √ε).
        positive = d2 > 0
        d = torch.where(positive, d2.where(positive, 1.0).sqrt(), 0.0)
        return y * d2 + (1 - y) * (self.margin - d).clamp_min(0).pow(2)

    def forward(self, emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.per_pair(emb_a, emb_b, labels).mean() / 2
