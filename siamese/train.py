"""Fine-tuning a Siamese network on labeled pairs. Reads top to bottom, like nanoGPT's train.py.

Two modes:

- ``head``: the backbone is frozen. Its features are computed once per unique image (in eval mode) and
  kept in a :class:`FeatureCache` that outlives the job, so only the projection head trains, on (N, F)
  tensors: an epoch over 10,000 pairs takes a fraction of a second.
- ``full``: backbone and head train together, with light augmentation; an image that appears in several
  pairs of a batch goes through the network once.

Both use the contrastive loss, AdamW with warmup + cosine decay, pairs implied by the labels
(A=B, B=C ⇒ A=C), and early stopping on validation AUC (the best epoch's weights are kept). The model
passed in is never modified; a deep copy is trained. Same inputs + same seed ⇒ identical weights.
"""

from __future__ import annotations

import copy
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .embedder import EmbeddingCache
from .labelgraph import LabelGraph
from .loss import ContrastiveLoss
from .metrics import best_threshold, evaluate_pairs
from .model import ContrastiveSiameseNetwork

MODES = ("auto", "head", "full")
MIN_PER_CLASS = 4  # labeled pairs of each kind (same, different) needed to train at all
MIN_TRAIN_PER_CLASS = 2  # of those, in the training split
IMPLIED_POOL = 20  # implied pairs drawn from: this many times the ones one epoch trains
_EVAL_BATCH = 64  # images per no-grad forward when computing features or embeddings

LoadImage = Callable[[str], Image.Image]


# -----------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class TrainConfig:
    """How to fine-tune; the first five fields are the options of ``/train``.

    Defaults are tuned so that ``small_cnn`` from scratch reaches a held-out AUC above 0.95 on 500
    labeled digit pairs with about 33,000 image forwards (about a minute on two idle CPU cores); see
    benchmarks/bench_train.py.
    """

    epochs: int = 20  # passes over the labeled + implied pairs; early stopping may end sooner
    learning_rate: float = 3e-3  # peak AdamW rate, reached after warmup, then cosine decay
    margin: float = 1.0  # contrastive margin on the distance of unit embeddings (0, 2]
    batch_size: int = 64  # pairs per optimizer step
    mode: str = "auto"  # "head" (frozen backbone), "full" (train everything) or "auto" (see resolve_mode)
    seed: int = 0  # shuffling, augmentation and the implied-pair sample
    weight_decay: float = 1e-4  # AdamW decoupled weight decay
    patience: int = 8  # stop after this many epochs without a better validation AUC; 0 = never stop early
    warmup_fraction: float = 0.05  # share of the steps spent ramping the learning rate up from zero
    augment: float = 1.0  # full mode: strength of crop / colour jitter (0 = none, 1 = light)
    flip: bool = False  # full mode: random horizontal flips; off since a mirror image may differ (text, digits)
    # implied pairs per labeled pair in each epoch, a fresh sample each time (0 = none). 4 rather than 1: on
    # labels from suggestions (which grow groups) it lifts digits AUC at 500 labels from 0.975-0.979 to
    # 0.993-0.997 (benchmarks/bench_active.py); full mode pays for it in steps (2.5x at 500 such labels)
    implied_ratio: float = 4.0
    backbone_lr_scale: float = 0.1  # full mode, pretrained backbone: its rate relative to the head's
    auto_head_max_pairs: int = 5000  # auto: a pretrained backbone with at most this many pairs trains its head only

    def __post_init__(self) -> None:
        ints = {"epochs": (1, 500), "batch_size": (2, 4096), "seed": (0, 2**31 - 1), "patience": (0, 500)}
        ints["auto_head_max_pairs"] = (0, 10**9)
        for name, (low, high) in ints.items():
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                object.__setattr__(self, name, value := int(value))  # 10.0 from a JSON number or a form
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer between {low} and {high}, got {value!r}")
        floats = {
            "learning_rate": (0.0, 1.0, False),  # (low, high, low allowed)
            "margin": (0.0, 2.0, False),
            "weight_decay": (0.0, 1.0, True),
            "warmup_fraction": (0.0, 0.5, True),
            "augment": (0.0, 2.0, True),
            "implied_ratio": (0.0, 100.0, True),
            "backbone_lr_scale": (0.0, 10.0, True),
        }
        for name, (low, high, low_ok) in floats.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not (low <= value if low_ok else low < value) or value > high:
                bracket = "[" if low_ok else "("
                raise ValueError(f"{name} must be in {bracket}{low:g}, {high:g}], got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if not isinstance(self.flip, bool):
            raise ValueError(f"flip must be true or false, got {self.flip!r}")

    def with_options(self, **options) -> TrainConfig:
        """A copy with the given options; None means "keep the default" (how ``/train`` passes them)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown training option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return replace(self, **{k: v for k, v in options.items() if v is not None})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class LabeledPair:
    """Two images (content-hash digests) and whether they show the same thing."""

    pair_id: str
    image_a: str
    image_b: str
    same: bool

    @classmethod
    def from_label(cls, pair_id: str, image_a: str, image_b: str, label: str) -> LabeledPair:
        """From the store's ``"same"`` / ``"different"`` labels."""
        if label not in ("same", "different"):
            raise ValueError(f"a label is 'same' or 'different', got {label!r}")
        return cls(pair_id, image_a, image_b, label == "same")


class TooFewLabels(ValueError):
    """Not enough labeled pairs of one kind to train; the message says how many more are needed."""


class FeatureCache(EmbeddingCache):
    """Backbone features, (F,) float32 per image, keyed by (backbone identity, image digest).

    Shared across jobs: a second job on the same images with the same frozen backbone does no backbone
    forward at all. The same thread-safe LRU map as the embedding cache, keyed by backbone, not version.
    """


def backbone_identity(model: ContrastiveSiameseNetwork) -> str:
    """A name for exactly these backbone weights and preprocessing: features depend on nothing else."""
    digest = hashlib.sha256(f"{model.config.backbone}|{model.preprocessing.to_dict()}".encode())
    for name, tensor in model.backbone.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return f"{model.config.backbone}:{digest.hexdigest()[:32]}"


@dataclass
class TrainResult:
    """What a training run produced. ``model`` is None when the run was cancelled."""

    model: ContrastiveSiameseNetwork | None
    metrics: dict
    threshold: float | None
    history: list[dict]
    comparison: dict | None
    cancelled: bool
    mode: str
    stats: dict = field(default_factory=dict)  # seconds, steps, backbone_images, feature_cache_hits


# -----------------------------------------------------------------------------
# labels: enough of them, and the ones they imply


def check_enough(train_pairs: Sequence[LabeledPair], val_pairs: Sequence[LabeledPair] = ()) -> None:
    """Raises TooFewLabels unless there are enough same and different pairs to train on."""
    total_same = sum(p.same for p in train_pairs) + sum(p.same for p in val_pairs)
    total_diff = len(train_pairs) + len(val_pairs) - total_same
    missing = []
    if total_same < MIN_PER_CLASS:
        missing.append(f"{MIN_PER_CLASS - total_same} more 'same'")
    if total_diff < MIN_PER_CLASS:
        missing.append(f"{MIN_PER_CLASS - total_diff} more 'different'")
    if missing:
        raise TooFewLabels(
            f"too few labels to train: need at least {MIN_PER_CLASS} 'same' and {MIN_PER_CLASS} 'different' pairs, "
            f"have {total_same} same and {total_diff} different; label {' and '.join(missing)} pair(s)"
        )
    train_same = sum(p.same for p in train_pairs)
    train_diff = len(train_pairs) - train_same
    if train_same < MIN_TRAIN_PER_CLASS or train_diff < MIN_TRAIN_PER_CLASS:
        raise TooFewLabels(
            f"too few labels in the training split: it has {train_same} same and {train_diff} different pairs "
            f"(the rest are held out for validation) and needs {MIN_TRAIN_PER_CLASS} of each; label a few more pairs"
        )


def implied_pairs(pairs: Sequence[LabeledPair], max_count: int | None = None, seed: int = 0) -> list[LabeledPair]:
    """Pairs the labels imply but do not state (A=B, B=C ⇒ A=C; A=B, B≠C ⇒ A≠C); see
    :meth:`siamese.labelgraph.LabelGraph.implied`. Default cap: 4 per labeled pair, a seeded sample."""
    implied = LabelGraph.from_pairs(pairs).implied(
        max_count=4 * len(pairs) if max_count is None else max_count, seed=seed
    )
    return [LabeledPair(p.pair_id, p.image_a, p.image_b, p.same) for p in implied]


# -----------------------------------------------------------------------------
# mode


def resolve_mode(config: TrainConfig, model: ContrastiveSiameseNetwork, n_pairs: int) -> str:
    """``head`` or ``full``. Auto: a pretrained backbone with few pairs keeps its features and trains the
    head (fast, hard to overfit); a backbone without pretrained weights (small_cnn) must learn, so full."""
    if config.mode != "auto":
        return config.mode
    if getattr(model, "pretrained", False) and n_pairs <= config.auto_head_max_pairs:
        return "head"
    return "full"


# -----------------------------------------------------------------------------
# images: pixels for full mode, cached features for head mode


class _Cancelled(Exception):
    pass


def _load_pixels(
    digests: Sequence[str], load_image: LoadImage, model: ContrastiveSiameseNetwork, check
) -> torch.Tensor:
    """(N, 3, H, W) uint8 after the backbone's resize and crop: decoded once, normalized per batch."""
    prep = model.preprocessing
    arrays = []
    for i, digest in enumerate(digests):
        if i % 64 == 0:
            check()
        try:
            image = load_image(digest)
        except Exception as error:
            raise ValueError(f"image {digest[:12]} could not be loaded for training ({error})") from error
        arrays.append(prep.to_array(image))
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _normalize(pixels: torch.Tensor, model: ContrastiveSiameseNetwork) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> normalized float (N, 3, H, W), channels-last (faster convolutions on CPU)."""
    prep = model.preprocessing
    mean = torch.tensor(prep.mean, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(prep.std, device=pixels.device).view(1, 3, 1, 1)
    x = (pixels.float() / 255.0 - mean) / std
    return x.contiguous(memory_format=torch.channels_last)


def augment(images: torch.Tensor, generator: torch.Generator, strength: float = 1.0, flip: bool = True) -> torch.Tensor:
    """A different random resized crop, flip and brightness/contrast change for each image.

    (N, 3, H, W) -> (N, 3, H, W). One affine grid for the whole batch: crops keep 70–100% of the area
    (at strength 1) with aspect ratios in [3/4, 4/3]; brightness and contrast move by up to ±20%.
    """
    if strength <= 0 and not flip:
        return images
    n = images.shape[0]

    def uniform(low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=generator)

    area = uniform(1.0 - 0.3 * strength, 1.0)
    log_ratio = uniform(-math.log(4 / 3) * strength, math.log(4 / 3) * strength)
    scale_x = (area * log_ratio.exp()).sqrt().clamp(max=1.0)
    scale_y = (area / log_ratio.exp()).sqrt().clamp(max=1.0)
    shift_x = uniform(-1.0, 1.0) * (1.0 - scale_x)
    shift_y = uniform(-1.0, 1.0) * (1.0 - scale_y)
    mirror = torch.where(uniform(0.0, 1.0) < 0.5, -1.0, 1.0) if flip else torch.ones(n)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = scale_x * mirror, shift_x
    theta[:, 1, 1], theta[:, 1, 2] = scale_y, shift_y
    grid = F.affine_grid(theta.to(images.device), list(images.shape), align_corners=False)
    out = F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
    contrast = uniform(1.0 - 0.2 * strength, 1.0 + 0.2 * strength).view(n, 1, 1, 1).to(images.device)
    brightness = uniform(-0.2 * strength, 0.2 * strength).view(n, 1, 1, 1).to(images.device)
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    return ((out - mean) * contrast + mean + brightness).contiguous(memory_format=torch.channels_last)


@torch.no_grad()
def _features(
    model: ContrastiveSiameseNetwork,
    digests: Sequence[str],
    load_image: LoadImage,
    cache: FeatureCache | None,
    identity: str,
    device: torch.device,
    stats: dict,
    check,
    on_batch: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """(N, F) frozen-backbone features in eval mode: from the cache where present, else one forward each."""
    found: dict[str, torch.Tensor] = {}
    missing = []
    for digest in digests:
        cached = cache.get(identity, digest) if cache is not None else None
        if cached is None:
            missing.append(digest)
        else:
            found[digest] = cached
    stats["feature_cache_hits"] = stats.get("feature_cache_hits", 0) + len(found)
    was_training = model.backbone.training
    model.backbone.eval()
    try:
        for start in range(0, len(missing), _EVAL_BATCH):
            chunk = missing[start : start + _EVAL_BATCH]
            pixels = _load_pixels(chunk, load_image, model, check)
            features = model.features(_normalize(pixels, model).to(device)).float().cpu()  # (B, F)
            stats["backbone_images"] = stats.get("backbone_images", 0) + len(chunk)
            for digest, row in zip(chunk, features, strict=True):
                found[digest] = row.clone()
                if cache is not None:
                    cache.put(identity, digest, found[digest])
            if on_batch is not None:
                on_batch(start + len(chunk), len(missing))
            check()
    finally:
        model.backbone.train(was_training)
    if not digests:
        return torch.empty(0, model.feature_dim)
    return torch.stack([found[d] for d in digests])


def _pair_tensors(
    pairs: Sequence[LabeledPair], index: dict[str, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Image indices of both sides and labels (1 same, 0 different): three (P,) tensors."""
    a = torch.tensor([index[p.image_a] for p in pairs], dtype=torch.long)
    b = torch.tensor([index[p.image_b] for p in pairs], dtype=torch.long)
    y = torch.tensor([1.0 if p.same else 0.0 for p in pairs])
    return a, b, y


# -----------------------------------------------------------------------------
# evaluation


class _Embeddings:
    """Embeds the images of a job with the model as it is now: cached features (head) or pixels (full)."""

    def __init__(self, model, mode: str, features: torch.Tensor | None, pixels: torch.Tensor | None, device):
        self.model, self.mode, self.features, self.pixels, self.device = model, mode, features, pixels, device

    @torch.no_grad()
    def all(self) -> torch.Tensor:
        """(N, D) embeddings of every image, in eval mode."""
        was_training = self.model.training
        self.model.eval()
        try:
            if self.mode == "head":
                return self.model.project(self.features.to(self.device)).float().cpu()
            chunks = []
            for start in range(0, len(self.pixels), _EVAL_BATCH):
                x = _normalize(self.pixels[start : start + _EVAL_BATCH].to(self.device), self.model)
                chunks.append(self.model.embed(x).float().cpu())
            return torch.cat(chunks) if chunks else torch.empty(0, self.model.config.embedding_dim)
        finally:
            self.model.train(was_training)


def _similarities(embeddings: torch.Tensor, pairs: Sequence[LabeledPair], index: dict[str, int]) -> np.ndarray:
    if not pairs:
        return np.zeros(0)
    a, b, _ = _pair_tensors(pairs, index)
    return (embeddings[a] * embeddings[b]).sum(dim=1).numpy().astype(np.float64)


def _labels(pairs: Sequence[LabeledPair]) -> np.ndarray:
    return np.array([p.same for p in pairs], dtype=bool)


def _both_kinds(pairs: Sequence[LabeledPair]) -> bool:
    return any(p.same for p in pairs) and not all(p.same for p in pairs)


def _assess(embeddings, train_pairs, val_pairs, index, threshold: float | None = None) -> tuple[dict, np.ndarray]:
    """Metrics on the validation pairs with a threshold calibrated there, falling back to the training
    pairs (and saying so) where validation lacks a kind; also each evaluated pair's similarity."""
    calibrate_on = val_pairs if _both_kinds(val_pairs) else train_pairs
    evaluate_on = val_pairs if val_pairs else train_pairs
    given = threshold
    if threshold is None:
        threshold, _ = best_threshold(_similarities(embeddings, calibrate_on, index), _labels(calibrate_on))
    sims = _similarities(embeddings, evaluate_on, index)
    metrics = evaluate_pairs(sims, _labels(evaluate_on), threshold=threshold)
    metrics["threshold_calibrated"] = given is None and calibrate_on is evaluate_on
    metrics["threshold_source"] = "given" if given is not None else "val" if calibrate_on is val_pairs else "train"
    metrics["evaluated_on"] = "val" if evaluate_on is val_pairs else "train"
    if given is None and calibrate_on is not val_pairs:
        metrics["note"] = "no validation pairs of both kinds: the threshold was calibrated on the training pairs" + (
            "" if val_pairs else ", and these metrics are measured on them too (optimistic)"
        )
    return metrics, sims


def evaluate_model(
    model: ContrastiveSiameseNetwork,
    pairs: Sequence[LabeledPair],
    load_image: LoadImage,
    *,
    threshold: float | None = None,
    feature_cache: FeatureCache | None = None,
    device: torch.device | str = "cpu",
) -> dict:
    """Pair metrics of ``model`` on ``pairs`` (see :func:`siamese.metrics.evaluate_pairs`).

    Args:
        threshold: the model's decision threshold; None calibrates the best one on these pairs.
        feature_cache: backbone features to reuse (and fill), as in head-mode training.
    """
    if not pairs:
        raise ValueError("no pairs to evaluate: label some pairs first")
    device = torch.device(device)
    digests = sorted({d for p in pairs for d in (p.image_a, p.image_b)})
    index = {d: i for i, d in enumerate(digests)}
    identity = backbone_identity(model) if feature_cache is not None else ""
    features = _features(model, digests, load_image, feature_cache, identity, device, {}, lambda: None)
    embeddings = _Embeddings(model, "head", features, None, device).all()
    sims = _similarities(embeddings, pairs, index)
    return evaluate_pairs(sims, _labels(pairs), threshold=threshold)


# -----------------------------------------------------------------------------
# distributed data parallel (torchrun): each rank takes a shard of every batch


def _distributed() -> tuple[int, int]:
    """(rank, world size) of an initialized process group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _Step(torch.nn.Module):
    """What a training step runs, as one module, so DistributedDataParallel can wrap it."""

    def __init__(self, model: ContrastiveSiameseNetwork, mode: str):
        super().__init__()
        self.model, self.mode = model, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.project(x) if self.mode == "head" else self.model.embed(x)


def _average_buffers(model: torch.nn.Module, world: int) -> None:
    """BatchNorm statistics differ per rank (each saw its own shards): average them, so every rank
    evaluates, stops early and saves exactly the same model."""
    import torch.distributed as dist

    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            buffer.div_(world)
        else:
            dist.broadcast(buffer, src=0)


# -----------------------------------------------------------------------------
# training


@contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    """PyTorch's intra-op threads set to ``count`` for a block (None: unchanged), restored after."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_model(
    base_model: ContrastiveSiameseNetwork,
    train_pairs: Sequence[LabeledPair],
    val_pairs: Sequence[LabeledPair],
    load_image: LoadImage,
    config: TrainConfig = TrainConfig(),
    *,
    on_progress: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    feature_cache: FeatureCache | None = None,
    device: torch.device | str = "cpu",
    base_threshold: float | None = None,
) -> TrainResult:
    """Fine-tunes a copy of ``base_model`` on ``train_pairs``; ``base_model`` itself is left untouched.

    Args:
        load_image: digest -> PIL image (any mode; the backbone's preprocessing is applied here).
        on_progress: called every step with epoch, step, total_steps, progress (0…1) and loss, and after
            each epoch also with the validation metrics and the history so far.
        should_stop: polled every step; when it returns True the run ends with ``cancelled=True`` and no model.
        feature_cache: head mode reads and fills it, so a later job on the same images skips the backbone.
        base_threshold: the base model's own threshold for the before/after comparison (None: calibrated
            like the new model's).

    Raises:
        TooFewLabels: see :func:`check_enough`.
    """
    started = time.perf_counter()
    check_enough(train_pairs, val_pairs)
    device = torch.device(device)
    report = on_progress or (lambda info: None)
    stats: dict = {"backbone_images": 0, "feature_cache_hits": 0}

    def check() -> None:
        if should_stop is not None and should_stop():
            raise _Cancelled

    # ---- data: labeled + implied pairs, one table of unique images. Each epoch trains every labeled pair
    # and a fresh sample of the implied ones (implied_ratio per labeled pair), so over the epochs many
    # more of them teach the model at the cost of one sample.
    max_implied = int(config.implied_ratio * len(train_pairs))
    extra = implied_pairs(train_pairs, max_count=IMPLIED_POOL * max_implied, seed=config.seed) if max_implied else []
    n_implied = min(max_implied, len(extra))  # per epoch
    fit_pairs = list(train_pairs) + extra
    digests = sorted({d for p in [*fit_pairs, *val_pairs] for d in (p.image_a, p.image_b)})
    index = {d: i for i, d in enumerate(digests)}
    pair_a, pair_b, pair_y = _pair_tensors(fit_pairs, index)
    mode = resolve_mode(config, base_model, len(train_pairs))

    # ---- model: a copy; in head mode the backbone is frozen (eval mode, no gradients)
    model = copy.deepcopy(base_model).to(device)
    if mode == "head":
        model.backbone.requires_grad_(False)
    model.eval()
    rank, world = _distributed()
    generator = torch.Generator().manual_seed(config.seed)  # pair order: the same on every rank
    augment_generator = torch.Generator().manual_seed(config.seed * 1_000_003 + rank + 1)  # per rank
    history: list[dict] = []

    try:
        # ---- features (head) or pixels (full), once per unique image
        features = pixels = None
        if mode == "head":
            identity = backbone_identity(model)

            def on_batch(done: int, total: int) -> None:
                report({"phase": "features", "images_done": done, "images_total": total, "progress": 0.0})

            features = _features(model, digests, load_image, feature_cache, identity, device, stats, check, on_batch)
            features = features.to(device)  # (N, F)
        else:
            report({"phase": "images", "images_total": len(digests), "progress": 0.0})
            pixels = _load_pixels(digests, load_image, model, check).to(device)  # (N, 3, H, W) uint8
        embedder = _Embeddings(model, mode, features, pixels, device)

        # ---- the model before training, for the comparison
        before, before_sims = _assess(embedder.all(), train_pairs, val_pairs, index, base_threshold)

        # ---- optimizer and schedule: AdamW, linear warmup then cosine decay to 1% of the peak
        head_params = list(model.head.parameters())
        groups = [{"params": head_params, "lr_scale": 1.0}]
        if mode == "full":
            scale = config.backbone_lr_scale if getattr(base_model, "pretrained", False) else 1.0
            groups.append({"params": list(model.backbone.parameters()), "lr_scale": scale})
        optimizer = torch.optim.AdamW(groups, lr=config.learning_rate, weight_decay=config.weight_decay)
        steps_per_epoch = math.ceil((len(train_pairs) + n_implied) / config.batch_size)
        total_steps = steps_per_epoch * config.epochs
        warmup = max(1, round(config.warmup_fraction * total_steps))

        def learning_rate(step: int) -> float:
            if step < warmup:
                return config.learning_rate * (step + 1) / warmup
            t = (step - warmup) / max(1, total_steps - warmup)
            return config.learning_rate * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * t)))

        loss_fn = ContrastiveLoss(config.margin)

        # ---- one step: embed each unique image of the batch once, then the pairs' loss
        forward = _Step(model, mode)
        if world > 1:  # gradients averaged over the ranks' shards; buffers are averaged per epoch
            forward = torch.nn.parallel.DistributedDataParallel(forward, broadcast_buffers=False)

        def step(batch: torch.Tensor) -> float:
            batch = batch[rank::world]  # this rank's shard of the batch (all of it on one process)
            a, b, y = pair_a[batch], pair_b[batch], pair_y[batch].to(device)
            images, inverse = torch.unique(torch.cat([a, b]), return_inverse=True)  # (U,), (2B,)
            if mode == "head":
                embeddings = forward(features[images.to(device)])  # (U, D)
            else:
                x = _normalize(pixels[images.to(device)], model)
                if config.augment > 0 or config.flip:
                    x = augment(x, augment_generator, config.augment, config.flip)
                embeddings = forward(x)  # (U, D)
                stats["backbone_images"] += len(images)
            emb = embeddings[inverse.to(device)]
            loss = loss_fn(emb[: len(a)], emb[len(a) :], y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss.item()

        def position(epoch: int, losses: list[float]) -> dict:
            """Where the run is, for on_progress."""
            return {
                "phase": "train",
                "epoch": epoch,
                "epochs": config.epochs,
                "step": global_step,
                "total_steps": total_steps,
                "progress": global_step / total_steps,
                "loss": float(np.mean(losses)),
            }

        # ---- the loop: epochs of shuffled pairs, validation after each, keep the best epoch
        early_stop = config.patience > 0 and _both_kinds(val_pairs)
        best_auc, best_epoch, best_state = -math.inf, 0, None
        trained = model.head if mode == "head" else model  # what changes, so what the best epoch must keep
        global_step = 0
        # Head mode's steps are tiny matrix products: a second thread gains little and, on a busy shared
        # CPU, every parallel region waits for a descheduled thread (measured with one core busy: 2,000
        # pairs, 2 epochs, 13.5 s on 2 threads, 0.42 s on 1).
        with _torch_threads(1 if mode == "head" else None):
            for epoch in range(1, config.epochs + 1):
                if mode == "head":
                    model.head.train()
                else:
                    model.train()
                order = _epoch_order(len(train_pairs), len(extra), n_implied, generator)
                losses = []
                for start in range(0, len(order), config.batch_size):
                    check()
                    if min(config.batch_size, len(order) - start) < world:
                        continue  # a last batch too small to give every rank a pair: all ranks skip it
                    for group in optimizer.param_groups:
                        group["lr"] = learning_rate(global_step) * group["lr_scale"]
                    losses.append(step(order[start : start + config.batch_size]))
                    global_step += 1
                    report(position(epoch, losses))
                model.eval()
                if world > 1:
                    _average_buffers(model, world)
                val_metrics, _ = _assess(embedder.all(), train_pairs, val_pairs, index)
                auc = val_metrics["auc"]
                history.append({"epoch": epoch, "loss": float(np.mean(losses)), "val_auc": auc})
                improved = auc is not None and auc > best_auc + 1e-6
                if improved or not early_stop:
                    best_auc, best_epoch = (auc if auc is not None else best_auc), epoch
                    best_state = {k: v.detach().clone() for k, v in trained.state_dict().items()}
                report({**position(epoch, losses), "metrics": val_metrics, "history": [dict(h) for h in history]})
                if early_stop and epoch - best_epoch >= config.patience:
                    break
    except _Cancelled:
        return TrainResult(None, {}, None, history, None, cancelled=True, mode=mode, stats=_finish(stats, started))

    # ---- the best epoch's weights, final metrics and the before/after comparison
    trained.load_state_dict(best_state)
    model.eval()
    after, after_sims = _assess(embedder.all(), train_pairs, val_pairs, index)
    compared = val_pairs if val_pairs else train_pairs
    truth = _labels(compared)
    right_before = (before_sims >= before["threshold"]) == truth
    right_after = (after_sims >= after["threshold"]) == truth
    comparison = {
        "before": before,
        "after": after,
        "fixed": [p.pair_id for p, b, a in zip(compared, right_before, right_after, strict=True) if a and not b],
        "broke": [p.pair_id for p, b, a in zip(compared, right_before, right_after, strict=True) if b and not a],
    }
    metrics = {
        **after,
        "mode": mode,
        "n_train_pairs": len(train_pairs),
        "n_implied_pairs": n_implied,  # per epoch
        "n_implied_available": len(extra),
        "n_val_pairs": len(val_pairs),
        "epochs_run": len(history),
        "best_epoch": best_epoch,
    }
    stats["steps"] = global_step
    return TrainResult(
        model=model,
        metrics=metrics,
        threshold=after["threshold"],
        history=history,
        comparison=comparison,
        cancelled=False,
        mode=mode,
        stats=_finish(stats, started),
    )


def _epoch_order(n_labeled: int, n_available: int, n_implied: int, generator: torch.Generator) -> torch.Tensor:
    """One epoch's pairs, shuffled: every labeled pair (rows ``0…n_labeled-1``) and ``n_implied`` of the
    ``n_available`` implied ones after them, a new sample each epoch."""
    implied = n_labeled + torch.randperm(n_available, generator=generator)[:n_implied]
    chosen = torch.cat([torch.arange(n_labeled), implied])
    return chosen[torch.randperm(len(chosen), generator=generator)]


def _finish(stats: dict, started: float) -> dict:
    return {**stats, "seconds": round(time.perf_counter() - started, 3)}
