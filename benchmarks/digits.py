"""scikit-learn's handwritten digits as a small image-pair dataset for benchmarks and tests.

1,797 8×8 grayscale digits (ten classes), upsampled to 32×32 (bilinear) and encoded as PNG, so they go
through the same decoding and preprocessing as uploaded images. Helpers split the images into disjoint
sets and sample balanced labeled pairs within one set.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image

from siamese.images import content_hash, decode_bytes
from siamese.train import LabeledPair


@dataclass(frozen=True, eq=False)
class Digits:
    """PNG bytes per image, its digest (SHA-256) and its class, in the same order."""

    data: tuple[bytes, ...]
    digests: tuple[str, ...]
    classes: np.ndarray  # (N,) int digit per image

    def __len__(self) -> int:
        return len(self.data)

    def load_image(self, digest: str) -> Image.Image:
        """digest -> RGB PIL image, decoded like any upload (what ``train_model`` needs)."""
        return decode_bytes(_index(self)[digest])

    def pixels(self, indices: Sequence[int]) -> np.ndarray:
        """(N, 32·32) float grayscale in [0, 1]: the raw-pixel baseline's vectors."""
        return np.stack(
            [np.asarray(Image.open(io.BytesIO(self.data[i])), dtype=np.float64).ravel() / 255 for i in indices]
        )


@lru_cache(maxsize=4)
def _index(digits: Digits) -> dict[str, bytes]:
    return dict(zip(digits.digests, digits.data, strict=True))


@lru_cache(maxsize=4)
def load_digits_images(size: int = 32) -> Digits:
    """The 1,797 digits as ``size``×``size`` grayscale PNGs."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    data = []
    for image in bunch.images:  # (8, 8) values 0..16
        small = Image.fromarray(np.round(image * (255 / 16)).astype(np.uint8), mode="L")
        buffer = io.BytesIO()
        small.resize((size, size), Image.Resampling.BILINEAR).save(buffer, format="PNG")
        data.append(buffer.getvalue())
    return Digits(tuple(data), tuple(content_hash(d) for d in data), np.asarray(bunch.target))


def split_indices(n: int, sizes: Sequence[int], seed: int = 0) -> list[list[int]]:
    """Disjoint random subsets of range(n) with the given sizes."""
    if sum(sizes) > n:
        raise ValueError(f"cannot take {sum(sizes)} distinct images out of {n}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    out, start = [], 0
    for size in sizes:
        out.append(sorted(order[start : start + size]))
        start += size
    return out


def sample_pairs(
    digits: Digits, indices: Sequence[int], n_pairs: int, seed: int = 0, prefix: str = "p"
) -> list[LabeledPair]:
    """``n_pairs`` distinct labeled pairs over the images ``indices``: half same class, half different."""
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for i in indices:
        by_class.setdefault(int(digits.classes[i]), []).append(i)
    classes = sorted(c for c, members in by_class.items() if len(members) >= 2)
    seen: set[frozenset[int]] = set()
    pairs: list[LabeledPair] = []
    n_same = n_pairs // 2
    attempts = 0
    while len(pairs) < n_pairs:
        attempts += 1
        if attempts > 100 * n_pairs:
            raise ValueError(f"could not draw {n_pairs} distinct pairs from {len(indices)} images")
        if len(pairs) < n_same:
            c = rng.choice(classes)
            a, b = rng.sample(by_class[c], 2)
        else:
            a, b = rng.sample(list(indices), 2)
            if digits.classes[a] == digits.classes[b]:
                continue
        key = frozenset((a, b))
        if key in seen:
            continue
        seen.add(key)
        same = bool(digits.classes[a] == digits.classes[b])
        pairs.append(LabeledPair(f"{prefix}{len(pairs)}", digits.digests[a], digits.digests[b], same))
    return pairs
