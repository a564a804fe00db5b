"""Fine-tuning: quality on an easy task, the two modes, caching, reproducibility, cancellation, errors."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from benchmarks.digits import load_digits_images, sample_pairs, split_indices
from siamese.backbones import Backbone
from siamese.config import ModelConfig
from siamese.images import Preprocessing
from siamese.model import ContrastiveSiameseNetwork, build_model
from siamese.train import (
    FeatureCache,
    LabeledPair,
    TooFewLabels,
    TrainConfig,
    _epoch_order,
    check_enough,
    evaluate_model,
    implied_pairs,
    resolve_mode,
    train_model,
)

FAST = TrainConfig(epochs=3, batch_size=32, augment=0.0, flip=False)


def tiny_model(pretrained: bool = False, seed: int = 0) -> ContrastiveSiameseNetwork:
    """A two-layer CNN on 16×16 inputs: trains in a fraction of a second."""
    torch.manual_seed(seed)
    module = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(),  # (N, 64)
    )  # fmt: skip
    backbone = Backbone(module, 64, Preprocessing(16, 16, (0.5,) * 3, (0.5,) * 3), pretrained=pretrained)
    return ContrastiveSiameseNetwork(backbone, ModelConfig(backbone="tiny", embedding_dim=16, head_hidden=32))


@pytest.fixture(scope="module")
def digits():
    return load_digits_images()


@pytest.fixture(scope="module")
def data(digits):
    """Train pairs over 300 images, validation pairs over 100 others."""
    train_images, val_images = split_indices(len(digits), [300, 100], seed=0)
    train = sample_pairs(digits, train_images, 160, seed=1, prefix="t")
    val = sample_pairs(digits, val_images, 80, seed=2, prefix="v")
    return train, val


class ForwardCounter:
    """Counts the images each backbone forward sees (the hook travels with deep copies of the model)."""

    def __init__(self, model: ContrastiveSiameseNetwork):
        self.batches: list[tuple[int, bool]] = []  # (images, training?)
        model.backbone.register_forward_hook(
            lambda module, args, out: self.batches.append((len(args[0]), module.training))
        )

    @property
    def images(self) -> int:
        return sum(n for n, _ in self.batches)


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_full_mode_learns_digits(digits, data):
    train, val = data
    base = tiny_model()
    result = train_model(base, train, val, digits.load_image, replace(FAST, epochs=6, mode="full"))
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    before, after = result.comparison["before"]["auc"], result.comparison["after"]["auc"]
    assert after > before + 0.05, (before, after)
    assert after > 0.8
    assert result.metrics["auc"] == after
    assert result.metrics["mode"] == "full"
    assert result.metrics["n_train_pairs"] == len(train) and result.metrics["n_val_pairs"] == len(val)
    assert result.metrics["n_implied_pairs"] > 0
    assert not result.model.training


def test_best_epoch_is_kept(digits, data):
    train, val = data
    config = replace(FAST, epochs=8, patience=2, mode="head", learning_rate=0.05)  # noisy: early stops
    result = train_model(tiny_model(), train, val, digits.load_image, config)
    aucs = [h["val_auc"] for h in result.history]
    assert result.metrics["auc"] == pytest.approx(max(aucs))
    assert result.history[result.metrics["best_epoch"] - 1]["val_auc"] == max(aucs)


def test_evaluate_model_matches_sklearn(digits, data):
    _, val = data
    model = tiny_model().eval()
    metrics = evaluate_model(model, val, digits.load_image)
    with torch.no_grad():
        prep = model.preprocessing
        a = model.embed(prep.to_tensor([digits.load_image(p.image_a) for p in val]))
        b = model.embed(prep.to_tensor([digits.load_image(p.image_b) for p in val]))
    sims = (a * b).sum(1).numpy()
    assert metrics["auc"] == pytest.approx(roc_auc_score([p.same for p in val], sims), abs=1e-5)
    assert metrics["n_pairs"] == len(val)


def test_comparison_lists_fixed_and_broken_pairs(digits, data):
    train, val = data
    result = train_model(tiny_model(pretrained=True), train, val, digits.load_image, replace(FAST, mode="head"))
    comparison = result.comparison
    val_ids = {p.pair_id for p in val}
    assert set(comparison["fixed"]) <= val_ids and set(comparison["broke"]) <= val_ids
    assert not set(comparison["fixed"]) & set(comparison["broke"])
    # accuracy after - before = (fixed - broke) / n
    delta = comparison["after"]["accuracy"] - comparison["before"]["accuracy"]
    assert delta == pytest.approx((len(comparison["fixed"]) - len(comparison["broke"])) / len(val), abs=1e-5)


def test_without_val_pairs_threshold_comes_from_train_and_says_so(digits, data):
    train, _ = data
    result = train_model(tiny_model(), train, [], digits.load_image, replace(FAST, epochs=1))
    assert result.metrics["threshold_source"] == "train"
    assert "training pairs" in result.metrics["note"]
    assert result.metrics["n_val_pairs"] == 0 and result.metrics["n_pairs"] == len(train)


# ----------------------------------------------------------------------------- modes and caching


def test_head_mode_reuses_cached_features_across_jobs(digits, data):
    train, val = data
    base = tiny_model(pretrained=True)
    counter = ForwardCounter(base)
    cache = FeatureCache()
    config = replace(FAST, mode="head")
    first = train_model(base, train, val, digits.load_image, config, feature_cache=cache)
    n_images = len({d for p in [*train, *val] for d in (p.image_a, p.image_b)})
    assert counter.images == n_images  # each unique image once, in eval mode
    assert all(not training for _, training in counter.batches)
    assert first.stats["backbone_images"] == n_images
    counter.batches.clear()
    second = train_model(base, train, val, digits.load_image, replace(config, seed=1), feature_cache=cache)
    assert counter.images == 0
    assert second.stats["backbone_images"] == 0 and second.stats["feature_cache_hits"] == n_images


def test_head_mode_freezes_backbone_and_trains_head(digits, data):
    train, val = data
    base = tiny_model(pretrained=True)
    result = train_model(base, train, val, digits.load_image, replace(FAST, mode="head"))
    assert result.mode == "head"
    assert _same_state(_state(result.model.backbone), _state(base.backbone))  # BN statistics too
    assert not _same_state(_state(result.model.head), _state(base.head))


@pytest.mark.parametrize("mode, during", [("head", 1), ("full", 2)])
def test_head_mode_steps_on_one_thread_and_restores_the_count(digits, data, mode, during):
    train, val = data
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: set[int] = set()

    def on_progress(info: dict) -> None:
        if "loss" in info and "metrics" not in info:  # a training step
            seen.add(torch.get_num_threads())

    try:
        config = replace(FAST, mode=mode, epochs=1)
        train_model(tiny_model(pretrained=True), train, val, digits.load_image, config, on_progress=on_progress)
        assert seen == {during}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_full_mode_trains_backbone(digits, data):
    train, val = data
    base = tiny_model()
    result = train_model(base, train, val, digits.load_image, replace(FAST, mode="full", epochs=1))
    assert result.mode == "full"
    before, after = base.backbone[0].weight, result.model.backbone[0].weight
    assert not torch.equal(before, after)


def test_each_image_of_a_batch_is_embedded_once(digits):
    hub = digits.digests[0]
    others = [d for d, c in zip(digits.digests, digits.classes, strict=True) if c == digits.classes[0]][1:5]
    others += [d for d, c in zip(digits.digests, digits.classes, strict=True) if c != digits.classes[0]][:4]
    pairs = [LabeledPair(f"p{i}", hub, other, i < 4) for i, other in enumerate(others)]  # a star: 8 pairs, 9 images
    base = tiny_model()
    counter = ForwardCounter(base)
    config = TrainConfig(epochs=2, batch_size=8, mode="full", implied_ratio=0.0, augment=0.0, flip=False)
    train_model(base, pairs, [], digits.load_image, config)
    training_batches = [n for n, training in counter.batches if training]
    assert training_batches == [9, 9]  # not 16: the hub image goes through once per batch


def test_base_model_is_untouched(digits, data):
    train, val = data
    for mode, pretrained in [("full", False), ("head", True)]:
        base = tiny_model(pretrained=pretrained)
        base.train()
        state = _state(base)
        train_model(base, train, val, digits.load_image, replace(FAST, mode=mode, epochs=1))
        assert _same_state(_state(base), state)
        assert base.training and all(p.requires_grad for p in base.parameters())


def test_resolve_mode():
    config = TrainConfig()
    assert resolve_mode(config, tiny_model(pretrained=True), 100) == "head"
    assert resolve_mode(config, tiny_model(pretrained=True), config.auto_head_max_pairs + 1) == "full"
    assert resolve_mode(config, tiny_model(pretrained=False), 100) == "full"
    assert resolve_mode(replace(config, mode="full"), tiny_model(pretrained=True), 10) == "full"
    assert resolve_mode(replace(config, mode="head"), tiny_model(pretrained=False), 10) == "head"
    small_cnn = build_model(ModelConfig(backbone="small_cnn", pretrained=True))  # has no pretrained weights
    assert resolve_mode(config, small_cnn, 10) == "full"


@pytest.mark.parametrize("mode", ["full", "head"])
def test_same_seed_same_weights(digits, data, mode):
    train, val = data[0][:32] + data[0][-32:], data[1][:16] + data[1][-16:]  # both kinds
    config = TrainConfig(epochs=2, batch_size=16, mode=mode)  # with augmentation: it is seeded too
    runs = [
        train_model(tiny_model(pretrained=True), train, val, digits.load_image, replace(config, seed=s))
        for s in (7, 7, 8)
    ]
    assert _same_state(_state(runs[0].model), _state(runs[1].model))
    assert runs[0].history == runs[1].history
    assert not _same_state(_state(runs[0].model), _state(runs[2].model))


def test_progress_reports(digits, data):
    train, val = data
    reports: list[dict] = []
    model = tiny_model(pretrained=True)
    train_model(model, train, val, digits.load_image, replace(FAST, epochs=2), on_progress=reports.append)
    steps = [r for r in reports if r.get("phase") == "train"]
    progress = [r["progress"] for r in steps]
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert {"epoch", "step", "total_steps", "loss"} <= steps[0].keys()
    epoch_ends = [r for r in steps if "metrics" in r]
    assert [r["epoch"] for r in epoch_ends] == [1, 2]
    assert epoch_ends[-1]["metrics"]["auc"] is not None and len(epoch_ends[-1]["history"]) == 2


def test_cancellation_is_prompt(digits, data):
    train, val = data
    stop = threading.Event()
    stopped_at: list[float] = []

    def on_progress(info: dict) -> None:
        if info.get("phase") == "train" and info["step"] == 3 and not stop.is_set():
            stopped_at.append(time.perf_counter())
            stop.set()

    config = TrainConfig(epochs=500, batch_size=16, mode="full")
    result = train_model(
        tiny_model(), train, val, digits.load_image, config, on_progress=on_progress, should_stop=stop.is_set
    )
    assert result.cancelled and result.model is None
    assert time.perf_counter() - stopped_at[0] < 2.0


def test_cancellation_during_feature_extraction(digits, data):
    train, val = data
    result = train_model(tiny_model(pretrained=True), train, val, digits.load_image, FAST, should_stop=lambda: True)
    assert result.cancelled and result.model is None


def test_unloadable_image_is_a_clear_error(digits, data):
    train, val = data

    def load_image(digest):
        raise FileNotFoundError("gone")

    with pytest.raises(ValueError, match="could not be loaded"):
        train_model(tiny_model(), train, val, load_image, FAST)


# ----------------------------------------------------------------------------- labels


def _pair(a: str, b: str, same: bool) -> LabeledPair:
    return LabeledPair(f"{a}{b}", a, b, same)


def _as_set(pairs) -> set[tuple[frozenset, bool]]:
    return {(frozenset((p.image_a, p.image_b)), p.same) for p in pairs}


def test_implied_pairs_transitive_same_and_different():
    labels = [_pair("A", "B", True), _pair("B", "C", True), _pair("C", "D", False), _pair("E", "F", True)]
    implied = _as_set(implied_pairs(labels))
    assert implied == {
        (frozenset("AC"), True),  # A=B=C
        (frozenset("AD"), False),  # A=C, C≠D
        (frozenset("BD"), False),
    }


def test_implied_pairs_join_two_groups():
    labels = [_pair("A", "B", True), _pair("C", "D", True), _pair("B", "C", False)]
    implied = _as_set(implied_pairs(labels))
    assert implied == {(frozenset("AC"), False), (frozenset("AD"), False), (frozenset("BD"), False)}


def test_contradictory_group_implies_nothing():
    labels = [_pair("A", "B", True), _pair("B", "C", True), _pair("A", "C", False), _pair("C", "D", False)]
    labels += [_pair("X", "Y", True), _pair("Y", "Z", True)]
    implied = _as_set(implied_pairs(labels))
    assert implied == {(frozenset("XZ"), True)}  # nothing about A, B, C or D


def test_implied_pairs_are_capped_by_a_seeded_sample():
    images = [f"i{k:03d}" for k in range(60)]
    labels = [_pair(images[k], images[k + 1], True) for k in range(59)]  # one group: 1,770 pairs, 59 labeled
    capped = implied_pairs(labels, max_count=100, seed=3)
    assert len(capped) == 100
    assert all(p.same for p in capped)
    labeled = {frozenset((p.image_a, p.image_b)) for p in labels}
    assert not any(frozenset((p.image_a, p.image_b)) in labeled for p in capped)
    assert len(_as_set(capped)) == 100  # no duplicates
    assert _as_set(capped) == _as_set(implied_pairs(labels, max_count=100, seed=3))
    assert _as_set(capped) != _as_set(implied_pairs(labels, max_count=100, seed=4))
    assert len(implied_pairs(labels)) == 4 * len(labels)  # the default cap
    assert len(implied_pairs(labels, max_count=10_000)) == 60 * 59 // 2 - 59


def test_too_few_labels():
    same = [_pair(f"s{k}", f"t{k}", True) for k in range(5)]
    different = [_pair(f"d{k}", f"e{k}", False) for k in range(5)]
    with pytest.raises(TooFewLabels, match=r"have 5 same and 2 different; label 2 more 'different'"):
        check_enough(same + different[:2], [])
    with pytest.raises(TooFewLabels, match="training split"):
        check_enough(same[:1] + different, same[1:])
    check_enough(same[:4] + different[:4], [])
    with pytest.raises(TooFewLabels):
        train_model(tiny_model(), same, [], lambda d: None, FAST)


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"epochs": 0}, "epochs must be an integer between 1 and 500, got 0"),
        ({"epochs": 2.5}, "epochs must be an integer"),
        ({"epochs": True}, "epochs must be an integer"),
        ({"batch_size": 1}, "batch_size must be an integer between 2"),
        ({"learning_rate": 0}, r"learning_rate must be in \(0, 1\]"),
        ({"learning_rate": float("nan")}, "learning_rate must be a number"),
        ({"margin": 2.5}, r"margin must be in \(0, 2\]"),
        ({"mode": "fast"}, "mode must be one of auto, head, full"),
        ({"weight_decay": -1}, "weight_decay must be in"),
        ({"patience": -1}, "patience must be an integer"),
        ({"seed": "1"}, "seed must be an integer"),
        ({"augment": 5}, "augment must be in"),
        ({"flip": 1}, "flip must be true or false"),
    ],
)
def test_invalid_config_values(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options)


def test_config_options_from_the_api():
    config = TrainConfig().with_options(epochs=10.0, learning_rate=None, mode="head")
    assert config.epochs == 10 and isinstance(config.epochs, int)
    assert config.learning_rate == TrainConfig().learning_rate and config.mode == "head"
    with pytest.raises(ValueError, match="unknown training option"):
        TrainConfig().with_options(epoch=3)
    assert np.isclose(TrainConfig(learning_rate=1).learning_rate, 1.0)


def test_each_epoch_trains_every_label_and_a_fresh_sample_of_implied_pairs():
    generator = torch.Generator().manual_seed(0)
    epochs = [_epoch_order(30, 200, 40, generator) for _ in range(5)]
    seen_implied = set()
    for order in epochs:
        rows = order.tolist()
        assert len(rows) == 70 and len(set(rows)) == 70  # no pair twice in one epoch
        assert set(range(30)) <= set(rows)  # every labeled pair
        implied = {r for r in rows if r >= 30}
        assert len(implied) == 40 and implied <= set(range(30, 230))
        seen_implied |= implied
    assert len(seen_implied) > 100  # five samples of 40 out of 200: nearly disjoint, not one fixed set
    assert rows[:30] != list(range(30))  # shuffled
    assert _epoch_order(5, 3, 3, torch.Generator()).sort().values.tolist() == list(range(8))  # fewer than asked


def test_training_draws_implied_pairs_from_a_larger_pool_without_more_steps(digits):
    # 8 images of each of two digits, each chain-labeled "same": two groups of 28 pairs, 14 labels.
    by_class = {c: [d for d, k in zip(digits.digests, digits.classes, strict=True) if k == c][:8] for c in (0, 1)}
    labels = [LabeledPair(f"s{c}{i}", group[i], group[i + 1], True) for c, group in by_class.items() for i in range(7)]
    labels += [LabeledPair(f"d{i}", by_class[0][i], by_class[1][i], False) for i in range(4)]
    config = replace(FAST, epochs=2, batch_size=8, mode="full", implied_ratio=1.0, augment=0.0, patience=0)
    result = train_model(tiny_model(), labels, [], digits.load_image, config)
    n = len(labels)
    expected_available = 2 * (28 - 7) + 64 - 4  # implied "same" in each group, and every cross pair minus labels
    assert result.metrics["n_implied_available"] == expected_available
    assert result.metrics["n_implied_pairs"] == n  # per epoch: implied_ratio × labels
    assert result.stats["steps"] == 2 * math.ceil(2 * n / config.batch_size)
