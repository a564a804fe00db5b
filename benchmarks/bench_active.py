"""Benchmark: label efficiency of suggested pairs versus random pairs, on scikit-learn's digits.

A pool of digit images is labeled in rounds, with the digits' true classes as the annotator. Each round
labels a batch of pairs, retrains ``small_cnn`` (warm-started from the previous round's model) and
measures the ROC AUC on a fixed set of held-out pairs, over images that are never in the pool. Two arms
start from the same random weights and the same training settings and differ only in who picks the pairs:

- ``suggested``: :class:`siamese.suggest.Suggester` (uncertain and hard pairs, 20% random);
- ``random``: uniformly random pool pairs (the same class with ``random_share=1``), what a user labels
  without suggestions.

The goal: the suggested arm reaches the AUC that random pairs reach with 1,000 labels using at most half
as many. Prints a table and draws ``benchmarks/results/active.png``.

    python benchmarks/bench_active.py           # 50 → 1,000 labels (about 10 minutes on two cores)
    python benchmarks/bench_active.py --quick   # 50 → 200 labels on a smaller pool (about a minute)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.digits import Digits, load_digits_images, sample_pairs, split_indices
from siamese.config import ModelConfig
from siamese.model import ContrastiveSiameseNetwork, build_model
from siamese.suggest import Suggester, thumbnail_vectors
from siamese.train import LabeledPair, TooFewLabels, TrainConfig, evaluate_model, train_model

UNCALIBRATED_THRESHOLD = 0.5  # what the app uses before the first training
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Arm:
    """One way of choosing pairs, and everything it has labeled and learned so far."""

    name: str
    suggester: Suggester
    model: ContrastiveSiameseNetwork
    threshold: float = UNCALIBRATED_THRESHOLD
    pairs: list[LabeledPair] = field(default_factory=list)
    kinds: Counter = field(default_factory=Counter)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (labels, test AUC)
    seconds: float = 0.0


@torch.no_grad()
def embed_pool(model: ContrastiveSiameseNetwork, batch: torch.Tensor) -> torch.Tensor:
    """(N, D) unit embeddings of a preprocessed (N, 3, H, W) batch, in eval mode."""
    model.eval()
    return torch.cat([model.embed(batch[i : i + 256]) for i in range(0, len(batch), 256)])


def label_round(arm: Arm, target: int, pool: list[str], pixels: torch.Tensor, reference, truth: dict) -> None:
    """Labels ``target - len(arm.pairs)`` more pairs chosen by the arm's suggester, with the oracle."""
    embeddings = embed_pool(arm.model, pixels)
    labeled = {frozenset((p.image_a, p.image_b)) for p in arm.pairs}
    usage = Counter(d for p in arm.pairs for d in (p.image_a, p.image_b))
    batch = arm.suggester.suggest_batch(
        target - len(arm.pairs), pool, embeddings, arm.threshold, labeled, usage, reference
    )
    for s in batch:
        arm.pairs.append(
            LabeledPair(f"{arm.name}{len(arm.pairs)}", s.image_a, s.image_b, truth[s.image_a] == truth[s.image_b])
        )
        arm.kinds[s.kind] += 1


def train_round(arm: Arm, digits: Digits, config: TrainConfig, min_pairs: int) -> str:
    """Retrains on every label so far (warm start); keeps the old model when there are too few labels.

    Small rounds get more epochs, so that every round makes at least ``min_pairs`` pair passes.
    """
    fit_pairs = len(arm.pairs) * (1 + config.implied_ratio)  # at most: fewer pairs may be implied
    config = replace(config, epochs=min(30, max(config.epochs, math.ceil(min_pairs / fit_pairs))))
    try:
        result = train_model(arm.model, arm.pairs, [], digits.load_image, config)
    except TooFewLabels as error:
        return f"not trained ({error})"
    arm.model, arm.threshold = result.model, float(result.threshold)
    return f"{result.metrics['epochs_run']} epochs, {result.metrics['n_implied_pairs']} implied"


def first_reaching(curve: list[tuple[int, float]], auc: float) -> int | None:
    return next((n for n, value in curve if value >= auc), None)


def draw_plot(arms: list[Arm], goal: float | None, path: Path, width: int = 720, height: int = 440) -> None:
    """Test AUC against labeled pairs, one line per arm, drawn with PIL."""
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    left, right, top, bottom = 64, width - 24, 40, height - 48
    max_n = max(n for arm in arms for n, _ in arm.curve)
    aucs = [a for arm in arms for _, a in arm.curve]
    low = max(0.0, np.floor(min(aucs) * 20) / 20)
    high = min(1.0, np.ceil(max(aucs) * 20) / 20 + 0.0001)

    def to_xy(n: float, auc: float) -> tuple[float, float]:
        x = left + (right - left) * n / max_n
        y = bottom - (bottom - top) * (auc - low) / max(high - low, 1e-9)
        return x, y

    draw.text((left, 12), "Test ROC AUC vs labeled pairs (digits, small_cnn)", fill="black")
    draw.line([(left, top), (left, bottom), (right, bottom)], fill="black")
    for tick in np.arange(low, high + 1e-9, 0.05):
        _, y = to_xy(0, tick)
        draw.line([(left - 4, y), (right, y)], fill=(230, 230, 230))
        draw.text((left - 40, y - 6), f"{tick:.2f}", fill="black")
    for n in sorted({n for arm in arms for n, _ in arm.curve}):
        x, _ = to_xy(n, low)
        draw.line([(x, bottom), (x, bottom + 4)], fill="black")
        draw.text((x - 10, bottom + 8), str(n), fill="black")
    draw.text(((left + right) // 2 - 40, height - 20), "labeled pairs", fill="black")
    if goal is not None:
        _, y = to_xy(0, goal)
        for x in range(left, right, 12):
            draw.line([(x, y), (x + 6, y)], fill=(120, 120, 120))
        draw.text((right - 190, y - 14), f"random @ {max_n}: {goal:.3f}", fill=(90, 90, 90))
    colours = {"suggested": (214, 39, 40), "random": (31, 119, 180)}
    for i, arm in enumerate(arms):
        colour = colours.get(arm.name, (0, 0, 0))
        points = [to_xy(n, a) for n, a in arm.curve]
        draw.line(points, fill=colour, width=3)
        for x, y in points:
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
        draw.rectangle([left + 16, top + 8 + 18 * i, left + 30, top + 20 + 18 * i], fill=colour)
        draw.text((left + 36, top + 8 + 18 * i), arm.name, fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 → 200 labels on a 600-image pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per round at least (warm-started)")
    parser.add_argument("--min-pairs", type=int, default=None, help="pair passes per round at least (1500; 500 quick)")
    parser.add_argument("--out", type=Path, default=RESULTS / "active.png")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    started = time.perf_counter()

    digits = load_digits_images()
    pool_size = 600 if args.quick else 1300
    pool_idx, test_idx = split_indices(len(digits), [pool_size, len(digits) - pool_size], seed=args.seed)
    min_pairs = args.min_pairs or (500 if args.quick else 1500)
    schedule = [50, 100, 200] if args.quick else [50, 100, 200, 300, 500, 1000]
    test_pairs = sample_pairs(digits, test_idx, 2000, seed=args.seed + 1, prefix="test")
    pool = [digits.digests[i] for i in pool_idx]
    truth = {digits.digests[i]: int(digits.classes[i]) for i in pool_idx}
    images = [digits.load_image(d) for d in pool]
    config = TrainConfig(epochs=args.epochs, patience=0, flip=False, implied_ratio=0.5, seed=args.seed)

    torch.manual_seed(args.seed)
    base = build_model(ModelConfig(backbone="small_cnn", pretrained=False))
    pixels = base.preprocessing.to_tensor(images)  # (N, 3, 32, 32), shared by both arms
    reference = thumbnail_vectors(images)  # raw pixels: the model-independent "looks alike"
    arms = [
        Arm("suggested", Suggester(seed=args.seed, random_share=0.2), base),
        Arm("random", Suggester(seed=args.seed, random_share=1.0), base),
    ]
    print(f"pool {len(pool)} images, test {len(test_pairs)} pairs over {len(test_idx)} held-out images")
    print(f"{'arm':<10} {'labels':>6} {'same':>5} {'test AUC':>8}  training")
    for arm in arms:
        arm_started = time.perf_counter()
        for target in schedule:
            label_round(arm, target, pool, pixels, reference, truth)
            note = train_round(arm, digits, config, min_pairs)
            auc = evaluate_model(arm.model, test_pairs, digits.load_image)["auc"]
            arm.curve.append((len(arm.pairs), float(auc)))
            same = sum(p.same for p in arm.pairs)
            print(f"{arm.name:<10} {len(arm.pairs):>6} {same:>5} {auc:>8.4f}  {note}", flush=True)
        arm.seconds = time.perf_counter() - arm_started

    suggested, random_arm = arms
    goal = random_arm.curve[-1][1]
    reached = first_reaching(suggested.curve, goal)
    budget = random_arm.curve[-1][0]
    print()
    print(f"{'labels':>6} {'suggested':>9} {'random':>7}")
    for (n, a), (_, b) in zip(suggested.curve, random_arm.curve, strict=True):
        print(f"{n:>6} {a:>9.4f} {b:>7.4f}")
    for arm in arms:
        same = sum(p.same for p in arm.pairs)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(arm.kinds.items()))
        print(f"{arm.name}: {same}/{len(arm.pairs)} same pairs; kinds: {kinds}; {arm.seconds:.0f} s")
    if reached is None:
        best = max(a for _, a in suggested.curve)
        print(f"goal missed: suggestions never reached random's AUC {goal:.4f} at {budget} labels (best {best:.4f})")
    else:
        verdict = "met" if reached <= budget / 2 else "missed"
        print(
            f"suggestions reach random's AUC at {budget} labels ({goal:.4f}) with {reached} labels "
            f"({reached / budget:.0%}); goal (≤ 50%) {verdict}"
        )
    draw_plot(arms, goal, args.out)
    print(f"plot: {args.out}   total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
