"""The shared model service: one active model per process, served to every user while training runs.

The active model is an immutable snapshot (:class:`ActiveModel`: embedder, version, threshold) held
in one attribute. Requests read the attribute once; a finished job or a rollback builds a new snapshot
and assigns it, so no request ever sees a half-trained model or a threshold from another version.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import math
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from weakref import ref

import torch

from .backbones import pick_device
from .checkpoint import WEIGHTS_FILE, load_checkpoint, model_metadata
from .config import ModelConfig, Settings
from .embedder import Embedder, EmbeddingCache
from .embedmap import EmbeddingMap, align, build_map, group_names, sample_points
from .explain import overlay, similarity_saliency
from .hubsync import from_settings as hub_from_settings
from .images import DecodedImage, ImageError, ImageSource, content_hash, decode_bytes, load_image, to_bytes
from .jobs import JobCancelled, TrainingJobs
from .labelgraph import LabelGraph
from .model import ContrastiveSiameseNetwork, build_model
from .runtime import (
    CALIBRATION_IMAGES,
    Engine,
    fp32_onnx,
    int8_onnx,
    onnx_engine,
    onnxruntime_available,
    too_few_to_verify,
    torch_engine,
    verify_int8,
    weights_digest,
)
from .search import PoolIndex, describe
from .store import PairStore
from .suggest import Suggester, thumbnail_vectors
from .train import FeatureCache, LabeledPair, TrainConfig, check_enough, train_model
from .transfer import export_zip, import_path
from .versions import ModelRegistry, VersionError

log = logging.getLogger(__name__)

# Pool images a suggest/search request embeds at most; the background warm-up embeds the rest.
INDEX_PER_REQUEST = 512
# Images in the embedding map of one model, and in a before/after pair of maps (the previous model
# embeds these, once: on a CPU, resnet18 takes about a minute for 2,000).
MAP_POINTS = 5000
COMPARE_MAP_POINTS = 2000
# The label graph follows the store's events; more changes than this at once (an import) rebuild it.
GRAPH_SYNC_EVENTS = 2000
# Validation pairs an int8 engine is checked on at most.
VERIFY_PAIRS = 1000
# Threshold of a model nobody has calibrated yet (cosine similarity).
UNCALIBRATED_THRESHOLD = 0.5
LABELS = ("same", "different")
INITIAL_VERSION = "v0"  # the first model of a data dir (see ensure_active_version)
THUMBNAILS = "thumbnails"  # the reference view's name when it is not a model's


class Closing(RuntimeError):
    """The service is shutting down; background work stops at its next step."""


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
        self._looks: PoolIndex | None = None  # the model-independent view of the pool (see _reference)
        self._index_lock = threading.Lock()
        self._graph: LabelGraph | None = None  # the labels as a graph, following the store (see _labels)
        self._graph_seq = 0  # the last store event the graph has taken in
        self._graph_lock = threading.Lock()
        self._reviewed: set[str] = set()  # contradictions the Label tab has offered for review
        self._previously_active: str | None = None
        self._cached_keys: dict[str, set[str]] = {}  # version -> its keys in self.cache (not the active one's)
        self._other_lock = threading.Lock()  # one other model (the previous one) loaded at a time
        self._engines_in_background = background
        self._closing = threading.Event()
        self._workers: set[threading.Thread] = set()
        self._workers_lock = threading.Lock()
        this = ref(self)  # atexit must not keep every service of a test session alive
        atexit.register(lambda: (service := this()) is not None and service.close())
        if background:
            self._spawn(self._load_initial, "siamese-load")
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

    def _spawn(self, target, name: str, *args) -> None:
        """Runs ``target`` in a daemon thread that :meth:`close` stops and waits for."""

        def run() -> None:
            try:
                target(*args)
            except Closing:
                pass
            finally:
                with self._workers_lock:
                    self._workers.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._workers_lock:
            if self._closing.is_set():
                return
            self._workers.add(thread)
        thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stops the background work (pool warm-up, engine building) and waits for it; runs at exit.

        A daemon thread still inside PyTorch or ONNX Runtime when the interpreter finalizes aborts the
        process ("terminate called without an active exception"), so exit waits for them to stop.
        """
        self._closing.set()
        with self._workers_lock:
            workers = list(self._workers)
        for thread in workers:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def _check_open(self) -> None:
        if self._closing.is_set():
            raise Closing("the service is shutting down")

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
            before, self._active = self._active, active
            self.registry.set_active(version)
            if before is not None and before.version != version:
                self._previously_active = before.version
            self._forget_embeddings(before, active)
        if self._engines_in_background:
            self._spawn(self._serve_faster, "siamese-engine", active)
        else:
            self._serve_faster(active)
        self._spawn(self._warm_index, "siamese-index")
        return active

    # ---------------------------------------------------------------- the scoring engine

    def _serve_faster(self, active: ActiveModel) -> None:
        """Moves ``active``'s scoring onto ONNX Runtime, in int8 when asked for and verified.

        PyTorch serves until the engine is ready (seconds: export, and for int8 quantization and the check
        on the validation pairs); any failure leaves PyTorch serving and says why in ``/model_info``.
        """
        settings, embedder = self.settings, active.embedder
        try:
            if settings.runtime == "torch":
                return
            if self.device.type != "cpu":
                embedder.use(torch_engine(active.model, note=f"PyTorch on {self.device}: ONNX Runtime serves CPUs"))
                return
            if not onnxruntime_available():
                embedder.use(torch_engine(active.model, note="onnxruntime is not installed: PyTorch serves"))
                return
            cache_dir = self.data_dir / "runtime"
            key = f"{active.version}-{weights_digest(self.checkpoint_file(active.version))}"
            fp32 = onnx_engine(fp32_onnx(self.registry.path(active.version), cache_dir, key), "fp32")
            size = active.model.preprocessing.crop_size
            probe = torch.rand(2, 3, size, size)
            with torch.inference_mode():
                expected = active.model.embed(probe.contiguous(memory_format=torch.channels_last))
            gap = float((fp32.run(probe) - expected).abs().max())
            if not gap < 1e-3:
                raise RuntimeError(f"the ONNX graph disagrees with PyTorch by {gap:.2g}")
            engine = fp32
            self._check_open()
            if settings.precision == "int8":
                engine = self._int8_engine(active, fp32, cache_dir, key)
            if self._active is active:  # not superseded meanwhile
                embedder.use(engine)
        except Closing:
            pass
        except Exception as error:
            log.exception("could not build the ONNX Runtime engine for %s", active.version)
            note = f"ONNX Runtime failed ({type(error).__name__}: {error}); PyTorch serves"
            embedder.use(torch_engine(active.model, note=note))

    def _int8_engine(self, active: ActiveModel, fp32: Engine, cache_dir: Path, key: str) -> Engine:
        """The int8 engine if it keeps the validation AUC within MAX_AUC_DROP of fp32, else ``fp32`` saying why."""
        pairs = self.labeled_pairs("val")[:VERIFY_PAIRS]
        missing = too_few_to_verify([p.same for p in pairs])
        if missing:
            return replace(fp32, note=missing)
        held_out = {d for p in pairs for d in (p.image_a, p.image_b)}
        calibration = [d for d in self.store.pool() if d not in held_out][:CALIBRATION_IMAGES]
        if not calibration:
            return replace(fp32, note="int8 needs pool images to calibrate on; serving fp32")
        preprocessing = active.model.preprocessing
        images = preprocessing.to_tensor([self._load_pixels(d) for d in calibration])
        int8 = onnx_engine(int8_onnx(fp32.path, cache_dir, key, images), "int8")
        order = sorted(held_out)
        position = {d: i for i, d in enumerate(order)}
        val_images = preprocessing.to_tensor([self._load_pixels(d) for d in order]) if order else images[:0]
        check = verify_int8(
            fp32.run, int8.run, val_images, [(position[p.image_a], position[p.image_b], p.same) for p in pairs]
        )
        log.info("int8 check for %s: %s", active.version, check.reason)
        return replace(int8, note=check.reason) if check.passed else replace(fp32, note=check.reason)

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
        embedding = active.embedder.cached(digest)
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
            "runtime": active.embedder.engine.describe(),
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

        A request embeds a bounded slice; the background warm-up after a switch does the rest. Each image
        also gets its row in the "looks alike" reference (:meth:`_reference`), from the same decode.
        """
        active = self.active
        with self._index_lock:
            if self._pool_index is None or self._pool_index.version != active.version:
                self._pool_index = PoolIndex(active.version)
            index, looks = self._pool_index, self._reference()
            pool = self.store.pool()
            loaded: dict[str, Embedder] = {}  # v0, when the reference needs its forwards: let go after this call

            def embed(digests: Sequence[str]) -> torch.Tensor:  # one decode serves both views
                self._check_open()  # the warm-up stops between chunks at exit
                images = self._pool_images(digests)
                rows = active.embedder.embed(images)
                todo = [i for i, digest in enumerate(digests) if digest not in looks]
                if todo:
                    new = [digests[i] for i in todo]
                    if looks.version == THUMBNAILS:
                        looks.add(new, thumbnail_vectors([images[i].image for i in todo]))
                    elif looks.version == active.version:  # the initial model is active: its rows serve
                        looks.add(new, rows[todo])
                    else:
                        looks.add(new, self._embed_other(looks.version, new, [images[i] for i in todo], loaded))
                return rows

            index.update(pool, embed, limit=limit)
        return index

    def _warm_index(self) -> None:
        try:
            self._index(limit=None)
            with self._labels():  # built here, so the first suggestion does not wait for 100,000 labels
                pass
        except Closing:
            pass
        except Exception:
            log.exception("could not index the pool")

    def _reference(self) -> PoolIndex:
        """The "looks alike" view that hard positives and negatives are judged against (under _index_lock).

        When the initial model v0 is pretrained (ImageNet weights), its embeddings: what a generic
        network finds alike, which suits photos. Otherwise 8×8 thumbnails (:func:`thumbnail_vectors`),
        which suit digits and shapes. Decided once (v0 never changes); each pool image costs one row, kept
        for the life of the process whichever model is active.
        """
        if self._looks is None:
            try:
                pretrained = bool(self.registry.info(INITIAL_VERSION).meta.get("pretrained_init"))
            except VersionError:  # no v0 (removed by hand): nothing to call the initial model
                pretrained = False
            self._looks = PoolIndex(INITIAL_VERSION if pretrained else THUMBNAILS)
        return self._looks

    def _embed_other(
        self,
        version: str,
        digests: Sequence[str],
        images: Sequence[DecodedImage] | None = None,
        loaded: dict[str, Embedder] | None = None,
    ) -> torch.Tensor:
        """(N, D) embeddings of pool images under ``version``, which need not be the active model.

        Rows already in the embedding cache cost nothing; for the rest, the version is loaded (once per
        ``loaded`` dict: the caller drops it, so the model does not stay in memory) and its forwards take
        turns with the active model's, one batch at a time, so scoring waits for one batch at most.

        Args:
            images: the decoded ``digests``, when the caller has them; else each batch is read from the pool.
            loaded: models loaded so far by this caller, by version.
        """
        found: dict[str, torch.Tensor] = {}
        for digest in digests:
            cached = self.cache.get(version, digest)
            if cached is not None:
                found[digest] = cached
        missing = [i for i, digest in enumerate(digests) if digest not in found]
        if missing:
            loaded = {} if loaded is None else loaded
            if version not in loaded:
                model, _ = self.registry.load(version, device=self.device)
                model = model.to(memory_format=torch.channels_last)
                loaded[version] = Embedder(model, version, self.cache, device=self.device)  # PyTorch, fp32
                with self._switch_lock:
                    self._cached_keys.setdefault(version, set()).add(version)
            embedder = loaded[version]
            for start in range(0, len(missing), embedder.batch_size):
                batch = [digests[i] for i in missing[start : start + embedder.batch_size]]  # decoded outside the lock
                part = missing[start : start + embedder.batch_size]
                pixels = [images[i] for i in part] if images is not None else self._pool_images(batch)
                with self.active.embedder.lock:  # one forward at a time: two on shared cores only thrash
                    found.update(zip(batch, embedder.embed(pixels), strict=True))
        if not digests:
            return torch.empty(0, 0)
        return torch.stack([found[digest] for digest in digests])

    def _forget_embeddings(self, before: ActiveModel | None, active: ActiveModel) -> None:
        """Drops cached embeddings of versions that are neither active nor shown "before" it (under _switch_lock).

        The other versions' rows would only wait in the LRU to be pushed out; the previous version's stay,
        so its map (:meth:`embedding_maps`) costs no forward when it was active in this process.
        """
        if before is not None:  # its rows: under the version, and the engine's key (e.g. int8) if another
            self._cached_keys.setdefault(before.version, set()).update({before.version, before.embedder.key})
        keep = {active.version, self._previous_of(active)}
        for version in [v for v in self._cached_keys if v not in keep]:
            for key in self._cached_keys.pop(version):
                self.cache.drop_version(key)

    # ---------------------------------------------------------------- the labels as a graph

    @contextmanager
    def _labels(self) -> Iterator[LabelGraph]:
        """The label graph, up to date with the store, held for the caller's questions (do not keep it).

        The graph follows the store's event log: every change to a label (by this process or another:
        a label, relabel, delete, undo, import or Hub replay) is an event with a larger ``seq``, written in
        the same transaction as the change. Each use re-reads the pairs of the events it has not seen and
        puts them into the graph as they stand now (an absent pair is removed), so the graph always
        equals one rebuilt from ``store.all_pairs()``; a burst of events (an import) rebuilds it.
        Labeling never waits for this lock: only readers of the graph take it.
        """
        with self._graph_lock:
            graph = self._graph
            limit = max(GRAPH_SYNC_EVENTS, len(graph) // 10) if graph is not None else 0
            events = self.store.events(after_seq=self._graph_seq, limit=limit) if graph is not None else []
            if graph is not None and len(events) < limit:
                for pair_id in dict.fromkeys(event.pair_id for event in events):
                    pair = self.store.get_pair(pair_id)
                    if pair is None:
                        graph.remove(pair_id)
                    else:
                        graph.add(pair)
                if events:
                    self._graph_seq = events[-1].seq
            else:  # first use, or many changes at once
                seq = self.store.last_event_seq()  # read before the pairs: later events are taken in next time
                graph = self._graph = LabelGraph.from_pairs(self.store.all_pairs())
                self._graph_seq = seq
            yield graph

    def label_graph(self) -> LabelGraph:
        """The labels as a graph (a copy of the one kept up to date; see :meth:`_labels`)."""
        with self._labels() as graph:
            return graph.copy()

    # ---------------------------------------------------------------- suggestions, search, contradictions

    def suggest_pair(self) -> tuple[Path, Path, dict]:
        """The unlabeled pool pair that would teach the model most, and why."""
        index, active = self._index(), self.active
        digests, matrix = index.snapshot()
        reference = self._reference().rows(digests)
        with self._labels() as graph:
            suggestion = self.suggester.suggest(
                digests,
                matrix,
                active.threshold,
                graph.labeled(),
                graph.usage(),
                reference,
                groups=graph,
                calibrated=bool(active.meta.get("metrics")),
            )
        if suggestion is None:
            raise ValueError("no unlabeled pair to suggest: add images to the pool (score, label or import some)")
        return self.image_path(suggestion.image_a), self.image_path(suggestion.image_b), suggestion.to_dict()

    def pair_to_judge(self) -> tuple[Path, Path, dict]:
        """What the Label tab shows next: a contradiction not yet reviewed, else a suggestion.

        A contradiction's "different" pair is offered once per process; judging it again (either way)
        or skipping it moves on.
        """
        while True:
            with self._labels() as graph:
                pair_id = next((p for p in graph.contradicting() if p not in self._reviewed), None)
                if pair_id is None:
                    break
                self._reviewed.add(pair_id)
                contradiction = graph.contradiction(pair_id)
            pair = self.store.get_pair(pair_id)
            if pair is None:  # deleted since
                continue
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
        with self._labels() as graph:
            return describe(hits, graph.hint)

    def contradictions(self) -> list[dict]:
        """Labels that contradict each other through the same-groups, for review."""
        with self._labels() as graph:
            return [asdict(c) for c in graph.contradictions()]

    # ---------------------------------------------------------------- embedding maps

    def previous_version(self) -> str | None:
        """The version shown "before" the active one: the version it was trained from (its parent), else
        the version active before it in this process; None when there is neither (only v0)."""
        return self._previous_of(self.active)

    def _previous_of(self, active: ActiveModel) -> str | None:
        for candidate in (active.meta.get("parent"), self._previously_active):
            if isinstance(candidate, str) and candidate != active.version:
                try:
                    self.registry.path(candidate)
                except VersionError:  # removed by hand: try the next
                    continue
                return candidate
        return None

    def embedding_maps(self) -> list[EmbeddingMap]:
        """2-D projections of the pool, coloured by same-groups: the previous model's, then the active one's.

        The previous model (:meth:`previous_version`) embeds the same images as the active one's map (at
        most ``COMPARE_MAP_POINTS``: every labeled image, then a seeded sample), loaded for this call only;
        its map is turned onto the active one's axes (:func:`~siamese.embedmap.align`). With no previous
        version, the list holds the active model's map alone (of up to ``MAP_POINTS`` images).
        """
        active = self.active
        previous = self._previous_of(active)
        digests, matrix = self._index().snapshot()
        if not digests:
            raise ValueError("the pool is empty: score, label or import some images first")
        with self._labels() as graph:
            groups = group_names(digests, graph)
        if previous is None:
            return [build_map(active.version, digests, matrix, groups=groups, max_points=MAP_POINTS)]
        keep = sample_points(groups, COMPARE_MAP_POINTS)
        shown, shown_groups = [digests[i] for i in keep], [groups[i] for i in keep]
        current = build_map(active.version, shown, matrix[torch.as_tensor(keep)], groups=shown_groups)
        with self._other_lock:  # one previous model in memory at a time; a second call finds the rows cached
            before = self._embed_other(previous, shown)
        return [align(build_map(previous, shown, before, groups=shown_groups), current), current]


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def pairs_hash(pairs: Sequence) -> str:
    """A hash of the training pairs, stored with each version (which data made this model)."""
    digest = hashlib.sha256()
    for pair in sorted(pairs, key=lambda p: p.pair_id):
        digest.update(f"{pair.pair_id}:{pair.image_a}:{pair.image_b}:{int(pair.same)}\n".encode())
    return digest.hexdigest()


__all__ = ["ActiveModel", "ModelService", "NotReady", "pairs_hash", "replace", "utc_stamp"]
