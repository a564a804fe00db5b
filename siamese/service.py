"""The shared model service: one active model per process, served to every user while training runs.

The active model is an immutable snapshot (:class:`ActiveModel`: embedder, version, threshold) held
in one attribute. Requests read the attribute once; a finished job or a rollback builds a new snapshot
and assigns it, so no request ever sees a half-trained model or a threshold from another version.
"""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from .backbones import pick_device
from .checkpoint import WEIGHTS_FILE, load_checkpoint, model_metadata
from .config import ModelConfig, Settings
from .embedder import Embedder, EmbeddingCache
from .embedmap import build_map
from .explain import overlay, similarity_saliency
from .hubsync import from_settings as hub_from_settings
from .images import DecodedImage, ImageError, ImageSource, content_hash, decode_bytes, load_image, to_bytes
from .jobs import JobCancelled, TrainingJobs
from .labelgraph import LabelGraph
from .model import ContrastiveSiameseNetwork, build_model
from .search import PoolIndex, describe
from .store import PairStore
from .suggest import Suggester, thumbnail_vectors
from .train import FeatureCache, LabeledPair, TrainConfig, check_enough, train_model
from .transfer import export_zip, import_path
from .versions import ModelRegistry

log = logging.getLogger(__name__)

# Pool images a suggest/search request embeds at most; the background warm-up embeds the rest.
INDEX_PER_REQUEST = 512
# Threshold of a model nobody has calibrated yet (cosine similarity).
UNCALIBRATED_THRESHOLD = 0.5
LABELS = ("same", "different")


class NotReady(RuntimeError):
    """The model is still loading."""


@dataclass(frozen=True)
class ActiveModel:
    """Everything a request needs from the active model, swapped as one reference."""

    embedder: Embedder
    version: str
    threshold: float
    meta: dict

    @property
    def model(self) -> ContrastiveSiameseNetwork:
        return self.embedder.model


def _pair_score(emb_a: torch.Tensor, emb_b: torch.Tensor, active: ActiveModel) -> dict:
    similarity = max(-1.0, min(1.0, float(emb_a @ emb_b)))
    return {
        "similarity": similarity,
        "distance": math.sqrt(max(0.0, 2.0 - 2.0 * similarity)),
        "same": similarity >= active.threshold,
        "threshold": active.threshold,
        "model_version": active.version,
    }


def ensure_active_version(registry: ModelRegistry, settings: Settings) -> str:
    """The active version; on first start, v0 from the starting weights, saved so restarts agree.

    The starting weights are ``settings.weights`` when given, else the backbone's (ImageNet weights
    when ``settings.pretrained`` and available, random otherwise, which the metadata says).
    """
    version = registry.active()
    if version is not None:
        return version
    if settings.weights is not None:
        model, meta = load_checkpoint(settings.weights)
        meta = {**meta, "parent": None, "source": settings.weights.name}
    else:
        model = build_model(ModelConfig(backbone=settings.backbone, pretrained=settings.pretrained))
        meta = model_metadata(
            model, threshold=UNCALIBRATED_THRESHOLD, metrics={}, parent=None, pretrained_note=model.pretrained_note
        )
    info = registry.save(model, meta)
    registry.set_active(info.version)
    return info.version


class ModelService:
    """The one object the UI, the API and the CLI talk to."""

    def __init__(self, settings: Settings, device: torch.device | str | None = None, *, background: bool = True):
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.device = torch.device(device) if device is not None else pick_device()
        self.store = PairStore(self.data_dir)
        self.hub = hub_from_settings(settings, self.store)  # None unless SIAMESE_HUB_DATASET and HF_TOKEN
        self.registry = ModelRegistry(self.data_dir / "models")
        self.cache = EmbeddingCache()
        self._active: ActiveModel | None = None
        self._load_error: str | None = None
        self._ready = threading.Event()
        self._switch_lock = threading.Lock()  # serializes activations, not reads
        self._pool_queue: queue.Queue[DecodedImage | None] = queue.Queue()
        self._pool_worker = threading.Thread(target=self._pool_loop, name="siamese-pool", daemon=True)
        self._pool_worker.start()
        self._init_training()
        self.suggester = Suggester(seed=0)
        self._pool_index: PoolIndex | None = None
        self._looks = PoolIndex("thumbnails")  # the model-independent view of the pool
        self._index_lock = threading.Lock()
        self._reviewed: set[str] = set()  # contradictions the Label tab has offered for review
        if background:
            threading.Thread(target=self._load_initial, name="siamese-load", daemon=True).start()
        else:
            self._load_initial()

    # ---------------------------------------------------------------- start-up

    def _load_initial(self) -> None:
        try:
            if self.hub is not None:  # an ephemeral disk (Spaces): labels come back from the Hub first
                self.hub.restore()
                self.hub.start()
            self._activate(ensure_active_version(self.registry, self.settings))
        except Exception as error:  # the UI still serves and says why
            log.exception("could not load the model")
            self._load_error = f"{type(error).__name__}: {error}"
        finally:
            self._ready.set()

    def wait_ready(self, timeout: float | None = 120.0) -> ActiveModel:
        if not self._ready.wait(timeout):
            raise NotReady("the model is still loading; try again in a few seconds")
        if self._active is None:
            raise NotReady(f"the model could not be loaded: {self._load_error}")
        return self._active

    @property
    def active(self) -> ActiveModel:
        return self.wait_ready()

    def _activate(self, version: str) -> ActiveModel:
        """Loads ``version`` and makes it the one every request uses, in one assignment."""
        with self._switch_lock:
            model, meta = self.registry.load(version, device=self.device)
            model = model.to(memory_format=torch.channels_last)
            embedder = Embedder(model, version, self.cache, device=self.device)
            active = ActiveModel(embedder, version, float(meta.get("threshold", UNCALIBRATED_THRESHOLD)), meta)
            self._active = active
            self.registry.set_active(version)
        threading.Thread(target=self._warm_index, name="siamese-index", daemon=True).start()
        return active

    # ---------------------------------------------------------------- images

    def decode(self, source: ImageSource) -> DecodedImage:
        if source is None:
            raise ValueError("an image is missing: give both images")
        return load_image(source)

    def _pool_loop(self) -> None:
        while True:
            item = self._pool_queue.get()
            try:
                if item is not None and not self.store.has_image(item.digest):
                    self.store.add_image(item.data, source="scored")
            except Exception:
                log.exception("could not add a scored image to the pool")
            finally:
                self._pool_queue.task_done()

    def flush_pool(self) -> None:
        """Waits until every scored image has joined the pool (tests, shutdown)."""
        self._pool_queue.join()

    def add_image(self, source: ImageSource) -> str:
        """Validates one image and adds it to the pool at once (an upload); returns its id."""
        item = self.decode(source)
        return self.store.add_image(item.data, source="upload")

    def image_path(self, digest: str) -> Path:
        return self.store.image_path(digest)

    # ---------------------------------------------------------------- scoring

    def embed(self, images: Sequence[DecodedImage]) -> torch.Tensor:
        return self.active.embedder.embed(images)

    def score(self, image_a: ImageSource, image_b: ImageSource) -> dict:
        """Similarity, distance and verdict of two images under the active model."""
        active = self._active  # None while loading: the full path below waits, or says why
        if active is not None:
            seen_a, seen_b = self._seen(image_a, active), self._seen(image_b, active)
            if seen_a is not None and seen_b is not None:  # a pair seen before: hashes and look-ups only
                return _pair_score(seen_a, seen_b, active)
        return self._score(self.decode(image_a), self.decode(image_b), self.active)

    def _seen(self, source: ImageSource, active: ActiveModel) -> torch.Tensor | None:
        """The embedding ``active`` already gave this file (bytes or a path) when it is in the pool, else None.

        Found by the hash of the bytes alone: decoding a JPEG costs more than everything else here.
        """
        if not isinstance(source, (bytes, bytearray, memoryview, str, Path)):
            return None  # PIL images and arrays are encoded before hashing: the full path costs little more
        try:
            digest = content_hash(to_bytes(source))
        except ImageError:
            return None  # decode() says what is wrong
        embedding = active.embedder.cache.get(active.version, digest)
        return embedding if embedding is not None and self.store.has_image(digest) else None

    def _score(self, a: DecodedImage, b: DecodedImage, active: ActiveModel) -> dict:
        embeddings = active.embedder.embed([a, b])
        for item in (a, b):  # joins the pool off the request path
            self._pool_queue.put(item)
        return _pair_score(embeddings[0], embeddings[1], active)

    # ---------------------------------------------------------------- labels

    def counts(self) -> dict:
        counts = self.store.counts()
        return {"same": counts.same, "different": counts.different, "total": counts.total}

    def _check_label(self, label: str) -> str:
        if not isinstance(label, str) or label.strip().lower() not in LABELS:
            shown = repr(label) if len(repr(label)) <= 80 else f"{repr(label)[:80]}… ({len(str(label)):,} characters)"
            raise ValueError(f"label must be 'same' or 'different', got {shown}")  # never echo a huge input whole
        return label.strip().lower()

    def label(self, image_a: ImageSource, image_b: ImageSource, label: str, annotator: str = "anonymous") -> dict:
        """Stores a labeled pair (replacing an earlier label of the same two images)."""
        label = self._check_label(label)
        a, b = self.decode(image_a), self.decode(image_b)
        if a.digest == b.digest:
            raise ValueError("both images are the same file; a pair needs two different images")
        self.store.add_image(a.data, source="label")
        self.store.add_image(b.data, source="label")
        result = self.store.add_pair(a.digest, b.digest, label, annotator=annotator or "anonymous")
        return {"pair_id": result.pair_id, "created": result.created, **self.counts()}

    def label_known(self, digest_a: str, digest_b: str, label: str, annotator: str = "anonymous") -> dict:
        """Labels two pool images by id (the Label tab's suggested pairs)."""
        label = self._check_label(label)
        result = self.store.add_pair(digest_a, digest_b, label, annotator=annotator or "anonymous")
        return {"pair_id": result.pair_id, "created": result.created, **self.counts()}

    def _check_pair_id(self, pair_id: str) -> str:
        if not isinstance(pair_id, str) or not pair_id.strip():
            raise ValueError("pair_id is empty; pass the pair_id that /label returned")
        return pair_id.strip()

    def delete_pair(self, pair_id: str) -> dict:
        deleted = self.store.delete_pair(self._check_pair_id(pair_id))
        return {"deleted": bool(deleted), **self.counts()}

    def relabel(self, pair_id: str, label: str, annotator: str = "anonymous") -> dict:
        pair_id = self._check_pair_id(pair_id)
        if self.store.get_pair(pair_id) is None:
            raise LookupError(f"no labeled pair with id {pair_id!r}")
        self.store.relabel(pair_id, self._check_label(label), annotator=annotator or "anonymous")
        return {"pair_id": pair_id, **self.counts()}

    def undo(self, annotator: str = "anonymous") -> dict:
        pair_id = self.store.undo_last(annotator or "anonymous")
        return {"pair_id": pair_id, **self.counts()}

    def list_pairs(self, label: str | None = None, annotator: str | None = None, offset: int = 0, limit: int = 50):
        if label:
            label = self._check_label(label)
        pairs = self.store.list_pairs(label=label, annotator=annotator or None, offset=int(offset), limit=int(limit))
        return [
            {
                "pair_id": p.pair_id,
                "image_a": str(self.store.image_path(p.image_a)),
                "image_b": str(self.store.image_path(p.image_b)),
                "label": p.label,
                "annotator": p.annotator,
                "created_at": p.created_at,
            }
            for p in pairs
        ]

    # ---------------------------------------------------------------- models

    def models(self) -> list[dict]:
        active = self.registry.active()
        return [info.to_dict(active) for info in self.registry.versions()]

    def activate(self, version: str) -> dict:
        """Makes ``version`` the active model (a rollback, or a roll forward)."""
        if not isinstance(version, str) or not version.strip():
            raise ValueError("version is empty; pick one from /models")
        self.registry.path(version.strip())  # VersionError for bad or unknown names, before any work
        return {"model_version": self._activate(version.strip()).version}

    def checkpoint_file(self, version: str) -> Path:
        return self.registry.path(version) / WEIGHTS_FILE

    def model_info(self) -> dict:
        active = self.active
        meta = active.meta
        pretrained = bool(meta.get("pretrained_init", False))
        notice = ""
        if not pretrained:
            note = meta.get("pretrained_note") or ""
            notice = "The backbone is not pretrained: it started from random weights"
            notice += f" ({note})." if note else "."
        return {
            "model_version": active.version,
            "backbone": meta.get("backbone", active.model.config.backbone),
            "pretrained": pretrained,
            "embedding_dim": active.model.config.embedding_dim,
            "threshold": active.threshold,
            "device": str(self.device),
            "calibrated": bool(meta.get("metrics")),
            "notice": notice,
        }

    # ---------------------------------------------------------------- training

    def _init_training(self) -> None:
        self.jobs = TrainingJobs(self.data_dir / "jobs")
        self.feature_cache = FeatureCache()

    def _load_pixels(self, digest: str):
        return decode_bytes(self.store.image_bytes(digest))

    def labeled_pairs(self, split: str) -> list[LabeledPair]:
        return [
            LabeledPair.from_label(p.pair_id, p.image_a, p.image_b, p.label) for p in self.store.pairs_for_split(split)
        ]

    def train(
        self,
        epochs: int | None = None,
        learning_rate: float | None = None,
        margin: float | None = None,
        batch_size: int | None = None,
        mode: str | None = None,
        **extra,
    ) -> dict:
        """Starts fine-tuning the active model in the background; returns at once.

        Raises:
            ValueError: an invalid option, or too few labels (TooFewLabels).
            RuntimeError: a job is already running.
        """
        options = dict(epochs=epochs, learning_rate=learning_rate, margin=margin, batch_size=batch_size, mode=mode)
        config = TrainConfig().with_options(**options, **extra)
        train_pairs, val_pairs = self.labeled_pairs("train"), self.labeled_pairs("val")
        check_enough(train_pairs, val_pairs)
        base = self.active
        job_id = self.jobs.start(lambda ctx: self._run_training(ctx, base, config, train_pairs, val_pairs))
        return {"job_id": job_id, "state": "running"}

    def _run_training(self, ctx, base: ActiveModel, config, train_pairs, val_pairs) -> str:
        result = train_model(
            base.model,
            train_pairs,
            val_pairs,
            self._load_pixels,
            config,
            on_progress=ctx.report,
            should_stop=ctx.should_stop,
            feature_cache=self.feature_cache,
            device=self.device,
            base_threshold=base.threshold,
        )
        if result.cancelled or result.model is None:
            raise JobCancelled("training was cancelled; the active model is unchanged")
        ctx.report({"metrics": result.metrics, "history": result.history, "comparison": result.comparison})
        meta = model_metadata(
            result.model,
            threshold=result.threshold,
            metrics=result.metrics,
            parent=base.version,
            train_pairs_hash=pairs_hash(train_pairs),
            train_config=config.to_dict(),
            mode=result.mode,
            history=result.history,
            comparison=result.comparison,
        )
        info = self.registry.save(result.model, meta)  # fully on disk before anyone can use it
        self._activate(info.version)
        return info.version

    def train_status(self) -> dict:
        return self.jobs.status()

    def cancel_training(self) -> dict:
        return {"state": self.jobs.cancel()["state"]}

    # ---------------------------------------------------------------- data in and out

    def export_dataset(self) -> Path:
        """A zip of every image and label (see :func:`siamese.transfer.export_zip`)."""
        out = self.data_dir / "exports" / f"siamese-dataset-{utc_stamp()}.zip"
        return export_zip(self.store, out)

    def import_dataset(self, path: str | Path, annotator: str = "import") -> dict:
        """Imports an export zip or a zip of class folders; returns what was added and rejected."""
        if path is None or not str(path).strip():
            raise ValueError("no file given: upload a .zip (an export, or class folders)")
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path.name} is not a file: upload a .zip (an export, or class folders)")
        report = import_path(self.store, path, annotator=annotator or "import")
        return report.to_dict()

    # ---------------------------------------------------------------- model in the loop

    def explain(self, image_a: ImageSource, image_b: ImageSource):
        """Heat maps over both images of what drives their similarity, and the score."""
        a, b = self.decode(image_a), self.decode(image_b)
        active = self.active
        score = self._score(a, b, active)
        with active.embedder.lock:
            _, heat_a, heat_b = similarity_saliency(active.model, a.image, b.image, device=self.device)
        return overlay(active.model, a.image, heat_a), overlay(active.model, b.image, heat_b), score

    # ---------------------------------------------------------------- pool index: suggestions, search, map

    def _pool_images(self, digests: Sequence[str]) -> list[DecodedImage]:
        return [load_image(self.store.image_path(d)) for d in digests]

    def _index(self, limit: int | None = INDEX_PER_REQUEST) -> PoolIndex:
        """The pool's embeddings under the active model, extended by at most ``limit`` new images.

        A request embeds a bounded slice; the background warm-up after a switch does the rest.
        """
        active = self.active
        with self._index_lock:
            if self._pool_index is None or self._pool_index.version != active.version:
                self._pool_index = PoolIndex(active.version)
            index = self._pool_index
            pool = self.store.pool()

            def embed(digests: Sequence[str]) -> torch.Tensor:  # one decode serves both views
                images = self._pool_images(digests)
                self._looks.add(digests, thumbnail_vectors([item.image for item in images]))
                return active.embedder.embed(images)

            index.update(pool, embed, limit=limit)
        return index

    def _warm_index(self) -> None:
        try:
            self._index(limit=None)
        except Exception:
            log.exception("could not index the pool")

    def label_graph(self) -> LabelGraph:
        return LabelGraph.from_pairs(self.store.all_pairs())

    def suggest_pair(self) -> tuple[Path, Path, dict]:
        """The unlabeled pool pair that would teach the model most, and why."""
        digests, matrix = self._index().snapshot()
        graph = self.label_graph()
        suggestion = self.suggester.suggest(
            digests, matrix, self.active.threshold, graph.labeled(), graph.usage(), self._looks.rows(digests)
        )
        if suggestion is None:
            raise ValueError("no unlabeled pair to suggest: add images to the pool (score, label or import some)")
        return self.image_path(suggestion.image_a), self.image_path(suggestion.image_b), suggestion.to_dict()

    def pair_to_judge(self) -> tuple[Path, Path, dict]:
        """What the Label tab shows next: a contradiction not yet reviewed, else a suggestion.

        A contradiction's "different" pair is offered once per process; judging it again (either way)
        or skipping it moves on.
        """
        for contradiction in self.label_graph().contradictions():
            pair_id = contradiction.pair_ids[0]
            pair = self.store.get_pair(pair_id)
            if pair is None or pair_id in self._reviewed:
                continue
            self._reviewed.add(pair_id)
            images = self._pool_images([pair.image_a, pair.image_b])
            score = self._score(images[0], images[1], self.active)
            reason = f"review: {contradiction.explanation}"
            return self.image_path(pair.image_a), self.image_path(pair.image_b), {**score, "reason": reason}
        return self.suggest_pair()

    def search(self, image: ImageSource, k: int = 8) -> list[dict]:
        """The ``k`` pool images most similar to ``image``, most similar first."""
        if isinstance(k, bool) or not isinstance(k, (int, float)) or int(k) != k or not 1 <= k <= 1000:
            raise ValueError(f"k must be an integer between 1 and 1000, got {k!r}")
        query = self.decode(image)
        index = self._index()
        hits = index.search(self.active.embedder.embed([query])[0], int(k), exclude=[query.digest])
        return describe(hits, self.label_graph().hint)

    def contradictions(self) -> list[dict]:
        """Labels that contradict each other through the same-groups, for review."""
        return [asdict(c) for c in self.label_graph().contradictions()]

    def embedding_map(self) -> dict:
        """A 2-D projection of the pool under the active model, coloured by same-groups."""
        digests, matrix = self._index().snapshot()
        return build_map(self.active.version, digests, matrix, self.label_graph(), max_points=5000).columns()


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def pairs_hash(pairs: Sequence) -> str:
    """A hash of the training pairs, stored with each version (which data made this model)."""
    digest = hashlib.sha256()
    for pair in sorted(pairs, key=lambda p: p.pair_id):
        digest.update(f"{pair.pair_id}:{pair.image_a}:{pair.image_b}:{int(pair.same)}\n".encode())
    return digest.hexdigest()


__all__ = ["ActiveModel", "ModelService", "NotReady", "pairs_hash", "replace", "utc_stamp"]
