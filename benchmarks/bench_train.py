"""Fine-tuning benchmark: quality on held-out digit pairs, and speed. Prints tables.

    python benchmarks/bench_train.py            # the full run (a few minutes on 2 CPU cores)
    python benchmarks/bench_train.py --quick    # a smoke run (well under a minute)

Quality: ``small_cnn`` from scratch, labeled pairs over 1,000 digit images (80% train / 20% validation
images, like the store's split), AUC on 2,000 held-out pairs over the other 797 images. Compared with
raw-pixel cosine similarity and a plain PyTorch loop (tutorial style: both images of each pair forwarded
every step, fixed-rate Adam, no augmentation, no implied pairs, same epochs, same training pairs).

Speed: head mode on 10,000 labeled pairs with cached features; full mode pairs/s next to the plain loop;
and the time from a train call to a finished result for 500 pairs in head mode with cached features.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.digits import Digits, load_digits_images, sample_pairs, split_indices
from siamese.config import ModelConfig
from siamese.loss import ContrastiveLoss
from siamese.metrics import roc_auc
from siamese.model import build_model
from siamese.train import (
    FeatureCache,
    LabeledPair,
    TrainConfig,
    backbone_identity,
    evaluate_model,
    train_model,
)


def small_cnn(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(backbone="small_cnn", pretrained=False))


def labeled_split(digits: Digits, train_images, val_images, n_pairs: int, seed: int = 0):
    """``n_pairs`` labels: 80% over the training images, 20% over the validation images."""
    n_val = n_pairs // 5
    train = sample_pairs(digits, train_images, n_pairs - n_val, seed=seed + 1, prefix="t")
    val = sample_pairs(digits, val_images, n_val, seed=seed + 2, prefix="v")
    return train, val


# ----------------------------------------------------------------------------- baselines


def raw_pixel_auc(digits: Digits, pairs: list[LabeledPair]) -> float:
    """Cosine similarity of the raw grayscale pixel vectors."""
    index = {d: i for i, d in enumerate(digits.digests)}
    a = digits.pixels([index[p.image_a] for p in pairs])
    b = digits.pixels([index[p.image_b] for p in pairs])
    sims = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
    return roc_auc(sims, [p.same for p in pairs])


def plain_loop(digits: Digits, pairs: list[LabeledPair], epochs: int, batch_size: int = 64, lr: float = 1e-3):
    """The tutorial loop: per pair, both images through the network, every step. Returns (model, seconds, pairs/s)."""
    model = small_cnn()
    prep = model.preprocessing
    index = {d: i for i, d in enumerate(digits.digests)}
    images = prep.to_tensor([digits.load_image(d) for d in digits.digests])  # decoded once, to be generous
    a = torch.tensor([index[p.image_a] for p in pairs])
    b = torch.tensor([index[p.image_b] for p in pairs])
    y = torch.tensor([float(p.same) for p in pairs])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = ContrastiveLoss(1.0)
    generator = torch.Generator().manual_seed(0)
    model.train()
    started = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(len(pairs), generator=generator)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            emb_a, emb_b = model(images[a[batch]], images[b[batch]])
            loss = loss_fn(emb_a, emb_b, y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - started
    return model.eval(), seconds, epochs * len(pairs) / seconds


# ----------------------------------------------------------------------------- quality


def quality(digits: Digits, quick: bool) -> None:
    train_images, val_images, test_images = split_indices(len(digits), [800, 200, 797], seed=0)
    test = sample_pairs(digits, test_images, 500 if quick else 2000, seed=3, prefix="x")
    config = TrainConfig(epochs=3) if quick else TrainConfig()
    n_labels = 200 if quick else 500
    train, val = labeled_split(digits, train_images, val_images, n_labels)

    print(
        f"\n## Quality: small_cnn from scratch, {n_labels} labeled pairs over 1,000 images ({len(train)} train / "
        f"{len(val)} val), AUC on {len(test)} held-out pairs over {len(test_images)} unseen images"
    )
    print(f"TrainConfig: {config}")
    rows = [("raw-pixel cosine", raw_pixel_auc(digits, test), "-", "-")]
    model, seconds, _ = plain_loop(digits, train, config.epochs)
    plain_auc = evaluate_model(model, test, digits.load_image)["auc"]
    rows.append((f"plain loop (Adam 1e-3, {config.epochs} epochs)", plain_auc, f"{seconds:.1f}", "-"))
    started = time.perf_counter()
    result = train_model(small_cnn(), train, val, digits.load_image, config)
    seconds = time.perf_counter() - started
    test_metrics = evaluate_model(result.model, test, digits.load_image, threshold=result.threshold)
    rows.append(
        (
            f"siamese train_model ({result.mode}, {result.metrics['epochs_run']} epochs)",
            test_metrics["auc"],
            f"{seconds:.1f}",
            f"{test_metrics['accuracy']:.3f}",
        )
    )
    print(f"| {'method':<48} | test AUC | seconds | test acc @ val threshold |")
    print(f"|{'-' * 50}|----------|---------|--------------------------|")
    for name, auc, secs, acc in rows:
        print(f"| {name:<48} | {auc:.4f}   | {secs:>7} | {acc:>24} |")
    imgs = result.stats["backbone_images"]
    print(
        f"ours: {len(train)} labeled + {result.metrics['n_implied_pairs']} implied pairs, best epoch "
        f"{result.metrics['best_epoch']}, val AUC {result.metrics['auc']}, {imgs} training image forwards "
        f"({imgs / result.stats['seconds']:.0f} images/s over the whole call)"
    )

    print("\n### AUC vs number of labeled pairs (ours, default TrainConfig)")
    print("| labeled pairs | implied | epochs run | test AUC | seconds |")
    print("|---------------|---------|------------|----------|---------|")
    for n in [100, 250] if quick else [100, 250, 500, 1000]:
        train, val = labeled_split(digits, train_images, val_images, n)
        started = time.perf_counter()
        result = train_model(small_cnn(), train, val, digits.load_image, config)
        seconds = time.perf_counter() - started
        auc = evaluate_model(result.model, test, digits.load_image)["auc"]
        print(
            f"| {n:>13} | {result.metrics['n_implied_pairs']:>7} | {result.metrics['epochs_run']:>10} | "
            f"{auc:.4f}   | {seconds:>7.1f} |"
        )


# ----------------------------------------------------------------------------- speed


def _prefilled_cache(model, digits: Digits) -> FeatureCache:
    """Features for every digit under the model's backbone identity, as a first job would leave them.

    Filled with random vectors rather than resnet18 forwards at 224×224 (minutes on a CPU): the head's
    training costs the same whatever the numbers are, and the forwards are exactly what the cache saves.
    """
    cache = FeatureCache()
    identity = backbone_identity(model)
    generator = torch.Generator().manual_seed(0)
    for digest in digits.digests:
        cache.put(identity, digest, torch.randn(model.feature_dim, generator=generator).abs())
    return cache


def speed(digits: Digits, quick: bool) -> None:
    print("\n## Speed")
    everything = list(range(len(digits)))
    resnet = build_model(ModelConfig(backbone="resnet18", pretrained=False))  # 512 features; weights do not matter
    cache = _prefilled_cache(resnet, digits)

    n = 2000 if quick else 10_000
    train = sample_pairs(digits, everything, n, seed=5, prefix="h")
    val = sample_pairs(digits, everything, 1000, seed=6, prefix="hv")
    val = [p for p in val if (p.image_a, p.image_b) not in {(q.image_a, q.image_b) for q in train}]
    epoch_ends: list[float] = []
    config = TrainConfig(epochs=5, mode="head", patience=0)

    def on_epoch(info: dict) -> None:
        if "metrics" in info:
            epoch_ends.append(time.perf_counter())

    result = train_model(resnet, train, val, digits.load_image, config, feature_cache=cache, on_progress=on_epoch)
    per_epoch = np.diff(epoch_ends).mean()
    pairs = n + result.metrics["n_implied_pairs"]
    print("| measurement | value |")
    print("|---|---|")
    print(
        f"| head mode, resnet18 features (512), {n:,} labeled + {result.metrics['n_implied_pairs']:,} implied pairs, "
        f"cached: seconds per epoch (incl. validation on {len(val)} pairs) | {per_epoch:.3f} s |"
    )
    print(f"| … pairs per second | {pairs / per_epoch:,.0f} |")
    print(f"| … backbone forwards | {result.stats['backbone_images']} |")
    only = replace(config, implied_ratio=0.0)
    epoch_ends.clear()
    train_model(resnet, train, val, digits.load_image, only, feature_cache=cache, on_progress=on_epoch)
    print(f"| head mode, the {n:,} labeled pairs only: seconds per epoch | {np.diff(epoch_ends).mean():.3f} s |")

    # Full mode against the plain loop, same 500 pairs, same epochs.
    images = split_indices(len(digits), [1000], seed=0)[0]
    train = sample_pairs(digits, images, 500, seed=7, prefix="f")
    epochs = 1 if quick else 3
    _, _, plain_rate = plain_loop(digits, train, epochs)
    config = TrainConfig(epochs=epochs, mode="full", implied_ratio=0.0, patience=0)
    first_step: list[float] = []  # image decoding is not counted (the plain loop decodes before it starts too)

    def mark(info: dict) -> None:
        if info.get("phase") == "train" and not first_step:
            first_step.append(time.perf_counter())

    result = train_model(small_cnn(), train, [], digits.load_image, config, on_progress=mark)
    ours_rate = epochs * len(train) / (time.perf_counter() - first_step[0])
    per_pair = result.stats["backbone_images"] / (epochs * len(train))
    print(f"| full mode small_cnn, 500 pairs: plain loop pairs/s (2 images per pair) | {plain_rate:,.0f} |")
    print(
        f"| full mode small_cnn, 500 pairs: ours pairs/s (augmentation on, {per_pair:.2f} images per pair) | "
        f"{ours_rate:,.0f} |"
    )

    # A whole call: 500 pairs, head mode, features cached, default settings otherwise.
    train = sample_pairs(digits, everything, 500, seed=8, prefix="c")
    val = sample_pairs(digits, everything, 125, seed=9, prefix="cv")
    started = time.perf_counter()
    result = train_model(resnet, train, val, digits.load_image, TrainConfig(mode="head"), feature_cache=cache)
    seconds = time.perf_counter() - started
    print(
        f"| train call to finished: 500 pairs, head mode, features cached, default TrainConfig "
        f"({result.metrics['epochs_run']} epochs) | {seconds:.2f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument("--only", choices=["quality", "speed"], help="run one part")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    digits = load_digits_images()
    if args.only in (None, "quality"):
        quality(digits, args.quick)
    if args.only in (None, "speed"):
        speed(digits, args.quick)


if __name__ == "__main__":
    main()
