"""Serving benchmark: scoring latency, embedding and training throughput, memory, and the floor.

Every figure is timed in the same run as the plain tutorial implementation of benchmarks/reference.py
(same resnet18 weights, same images), so each comes with a ratio; ours and the reference alternate call
by call, so a busy machine slows both alike. Images are new 640×480 photo-like JPEGs (gradients, shapes,
blur and sensor noise, quality 90). The backbone is resnet18 with random weights (SIAMESE_PRETRAINED=0):
speed does not depend on the weights.

    python benchmarks/bench_serve.py            # everything (about 4 minutes on 2 CPU cores)
    python benchmarks/bench_serve.py --quick    # fewer repeats (about 2 minutes)
    python benchmarks/bench_serve.py --only process,http

Sections: ``process`` (ModelService.score, cached pairs, embedding throughput, the floor), ``train``
(head and full mode pairs/s), ``http`` (the real app through gradio_client: latency, /train to a new
active version, scoring while a job trains, peak RSS), ``precision`` (bf16 and int8 against fp32).
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import random
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import count
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from benchmarks import reference  # noqa: E402
from siamese.config import ModelConfig, Settings  # noqa: E402
from siamese.embedder import Embedder, EmbeddingCache  # noqa: E402
from siamese.images import decode_bytes, load_image  # noqa: E402
from siamese.metrics import roc_auc  # noqa: E402
from siamese.model import build_model  # noqa: E402
from siamese.service import ModelService  # noqa: E402
from siamese.store import NewPair, PairStore  # noqa: E402
from siamese.train import FeatureCache, LabeledPair, TrainConfig, backbone_identity, train_model  # noqa: E402

SECTIONS = ("process", "train", "http", "precision")
_seeds = count(10_000)  # every photo() without a scene is new: no cache has seen it


# ----------------------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the table: a measurement, the reference's, their ratio and the target."""

    name: str
    ours: str
    reference: str = ""
    ratio: str = ""
    target: str = ""
    met: str = ""  # "yes", "NO" or "" (no target)


def check(ok: bool) -> str:
    return "yes" if ok else "NO"


def print_table(rows: list[Row], title: str = "") -> None:
    if title:
        print(f"\n## {title}")
    header = ("measurement", "siamese", "reference", "ratio", "target", "met")
    widths = [
        max(len(h), *(len(getattr(r, f)) for r in rows)) for h, f in zip(header, Row.__dataclass_fields__, strict=True)
    ]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        cells = [getattr(row, f) for f in Row.__dataclass_fields__]
        print("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |", flush=True)


# ----------------------------------------------------------------------------- inputs and timing


def photo(scene: int | None = None, variant: int = 0, size: tuple[int, int] = (640, 480), quality: int = 90) -> bytes:
    """A photo-like JPEG: a colour gradient, blurred shapes and noise.

    Images of one ``scene`` share the layout; each ``variant`` moves the shapes a little and has its own
    noise (a "same" pair). Without a scene, a new one each call (an image no cache has seen).
    """
    scene = next(_seeds) if scene is None else scene
    layout, jitter = np.random.default_rng(scene), np.random.default_rng([scene, variant])
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = layout.uniform(0, 2 * np.pi)
    t = ((x / w - 0.5) * np.cos(angle) + (y / h - 0.5) * np.sin(angle) + 0.5).clip(0, 1)[..., None]
    base = layout.uniform(0, 255, 3) * (1 - t) + layout.uniform(0, 255, 3) * t
    image = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(10):
        cx, cy = layout.uniform(0, w), layout.uniform(0, h)
        cx, cy = cx + jitter.normal(0, w / 40), cy + jitter.normal(0, h / 40)
        rx, ry = layout.uniform(w / 30, w / 6), layout.uniform(h / 30, h / 6)
        colour = tuple(int(c) for c in layout.integers(0, 256, 3))
        shape = draw.ellipse if layout.random() < 0.5 else draw.rectangle
        shape((cx - rx, cy - ry, cx + rx, cy + ry), fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(1.5))
    pixels = np.asarray(image, dtype=np.float32) + jitter.normal(0, 6, (h, w, 3))
    buffer = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def ms(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def median(samples) -> float:
    return float(statistics.median(samples))


def p95(samples) -> float:
    return float(np.percentile(samples, 95))


def lat(samples) -> str:
    return f"{median(samples):.1f} ms (p95 {p95(samples):.1f})"


def resnet18(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(backbone="resnet18", pretrained=False)).eval()


def peak_rss_mb(pid: int | str = "self") -> float:
    """VmHWM: the most resident memory the process has had, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


# ----------------------------------------------------------------------------- in process


def floor_ms(model) -> tuple[float, float, float]:
    """(GFLOP per image through the backbone, measured fp32 GFLOP/s of a large mm, ms for two images)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model.backbone(torch.randn(1, 3, 224, 224))
    flops = counter.get_total_flops()
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        torch.mm(a, b)
        samples.append(time.perf_counter() - started)
    rate = 2 * 2048**3 / min(samples)  # the best run: the machine's rate, not the neighbours' load
    return flops / 1e9, rate / 1e9, 2 * flops / rate * 1000


def bench_process(repeats: int, work: Path) -> list[Row]:
    settings = Settings(data_dir=work / "process", backbone="resnet18", pretrained=False)
    service = ModelService(settings, "cpu", background=False)  # the default engine: ONNX Runtime fp32
    engine = service.active.embedder.engine
    assert engine.runtime == "onnx", f"ONNX Runtime engine not built: {engine.note}"
    model = service.active.model
    # the same weights served by PyTorch (SIAMESE_RUNTIME=torch), for the engine's share of the gain
    torch_settings = replace(settings, data_dir=work / "process-torch", runtime="torch")
    torch_service = ModelService(torch_settings, "cpu", background=False)
    torch_service.active.model.load_state_dict(model.state_dict())
    net = reference.from_siamese(model)
    warmup = 3
    pairs = [(photo(), photo()) for _ in range(repeats + warmup)]

    # The model's own forward of the same pair, already a normalized (2, 3, 224, 224) batch: through the
    # engine the service uses, and through PyTorch.
    x = model.preprocessing.to_tensor([load_image(d).image for d in pairs[0]])
    x_last = x.contiguous(memory_format=torch.channels_last)

    def torch_forward() -> None:
        with torch.inference_mode():
            model.embed(x_last)

    ours, base, torch_base, torch_score, ref, agree = [], [], [], [], [], []
    for i, (a, b) in enumerate(pairs):
        result: dict = {}
        t_ours = ms(lambda: result.update(service.score(a, b)))  # noqa: B023
        t_base = ms(lambda: engine.run(x))
        t_torch_base = ms(torch_forward)
        t_torch = ms(lambda: agree.append(torch_service.score(a, b)["similarity"] - result["similarity"]))  # noqa: B023
        t_ref = ms(lambda: agree.append(reference.score(net, a, b) - result["similarity"]))  # noqa: B023
        if i >= warmup:
            ours.append(t_ours), base.append(t_base), ref.append(t_ref)
            torch_base.append(t_torch_base), torch_score.append(t_torch)
    # Both compute the same function (resize filters differ slightly), or the ratio would mean nothing.
    assert max(abs(d) for d in agree) < 0.02, f"reference and siamese disagree by {max(map(abs, agree)):.3f}"
    cached = [ms(lambda: service.score(a, b)) for _ in range(3) for a, b in pairs[warmup:]]  # noqa: B023
    service.flush_pool()

    # Where the time of a new pair goes (one pair at a time, the same images as above).
    decode = [ms(lambda: load_image(a)) for a, _ in pairs[warmup:]]  # noqa: B023
    images = [load_image(a).image for a, b in pairs[warmup : warmup + 2]]
    preprocess = [ms(lambda: model.preprocessing.to_tensor(images)) for _ in range(repeats)]

    gflop, rate, floor = floor_ms(model)
    overhead = median(ours) / median(base)
    rows = [
        Row(
            "score a new pair, in process (ModelService.score, ONNX Runtime fp32)",
            lat(ours),
            lat(ref),
            f"{median(ref) / median(ours):.2f}x faster",
            ">= 1.25x",
            check(median(ref) / median(ours) >= 1.25),
        ),
        Row(
            "  … of which the model's forward of the pair (batch of 2, ONNX Runtime)",
            lat(base),
            "",
            f"score / forward = {overhead:.2f}",
            "<= 1.20",
            check(overhead <= 1.20),
        ),
        Row(
            "  … the same score with SIAMESE_RUNTIME=torch",
            lat(torch_score),
            lat(ref),
            f"{median(ref) / median(torch_score):.2f}x faster",
        ),
        Row("  … the PyTorch forward of the pair (channels-last, inference_mode)", lat(torch_base)),
        Row("  … decode one 640×480 JPEG + SHA-256", f"{median(decode):.1f} ms"),
        Row("  … preprocess two images (resize, crop, normalize)", f"{median(preprocess):.1f} ms"),
        Row(
            f"  … floor: {2 * gflop:.2f} GFLOP at {rate:.0f} GFLOP/s (fp32 mm, best of 5)",
            f"{floor:.1f} ms",
            "",
            f"score / floor = {median(ours) / floor:.1f}",
        ),
        Row(
            "score a pair seen before, in process (embedding cache)",
            lat(cached),
            lat(ref),
            f"{median(ref) / median(cached):,.0f}x faster",
            "<= 2 ms, >= 25x",
            check(median(cached) <= 2.0 and median(ref) / median(cached) >= 25),
        ),
    ]
    rows += bench_embedding(model, net, repeats, engine)
    return rows


def bench_embedding(model, net, repeats: int, engine=None) -> list[Row]:
    """Images/s from encoded bytes to embeddings (decode included), at batch sizes 1, 8 and 32.

    The reference (one image per forward) is timed right after each, on as many new images (at most 8).
    """
    rows = []
    reference.embed(net, photo())
    for batch_size in (1, 8, 32):
        embedder = Embedder(model, "bench", EmbeddingCache(), batch_size=batch_size, engine=engine)
        embedder.embed([load_image(photo())])  # warm-up: the first forward of a shape is slower
        n = max(batch_size, 8) * (2 if batch_size < 32 else 1)
        datas = [photo() for _ in range(n)]
        started = time.perf_counter()
        embedder.embed([load_image(d) for d in datas])
        rate = n / (time.perf_counter() - started)
        started = time.perf_counter()
        for data in datas[:8]:
            reference.embed(net, data)
        ref_rate = min(n, 8) / (time.perf_counter() - started)
        rows.append(
            Row(
                f"embedding throughput, batch {batch_size} (decode included)",
                f"{rate:.1f} images/s",
                f"{ref_rate:.1f} images/s (batch 1)",
                f"{rate / ref_rate:.2f}x",
            )
        )
    return rows


# ----------------------------------------------------------------------------- training


def _scene_pairs(
    n_scenes: int, variants: int, n_pairs: int, seed: int
) -> list[tuple[tuple[int, int], tuple[int, int], bool]]:
    """Half same-scene, half different-scene pairs of (scene, variant) images, no pair twice."""
    assert n_pairs // 2 <= n_scenes * variants * (variants - 1) // 2, "not that many same pairs"
    rng = random.Random(seed)
    found: dict[frozenset, tuple] = {}
    while len(found) < n_pairs:
        same = len(found) % 2 == 0
        s1 = rng.randrange(n_scenes)
        s2 = s1 if same else rng.choice([s for s in range(n_scenes) if s != s1])
        v1, v2 = rng.sample(range(variants), 2) if same else (rng.randrange(variants), rng.randrange(variants))
        a, b = (s1, v1), (s2, v2)
        found.setdefault(frozenset((a, b)), (a, b, same))
    return list(found.values())


def bench_train(quick: bool) -> list[Row]:
    """Full mode against the reference loop on the same pairs; head mode on cached features."""
    model = resnet18()
    # Full mode: 48 (quick) or 96 pairs over 32 images (8 scenes × 4), batch 16; the first step untimed.
    n_pairs, batch = (48, 16) if quick else (96, 16)
    spec = _scene_pairs(8, 4, n_pairs, seed=1)
    datas = {key: photo(1000 + key[0], key[1]) for a, b, _ in spec for key in (a, b)}
    digests = {key: load_image(data).digest for key, data in datas.items()}
    by_digest = {digests[k]: data for k, data in datas.items()}
    pairs = [LabeledPair(f"p{i}", digests[a], digests[b], same) for i, (a, b, same) in enumerate(spec)]
    steps: list[float] = []

    def on_progress(info: dict) -> None:
        if info.get("phase") == "train" and "metrics" not in info:
            steps.append(time.perf_counter())

    config = TrainConfig(epochs=1, mode="full", batch_size=batch, implied_ratio=0.0, patience=0)
    train_model(model, pairs, [], lambda d: decode_bytes(by_digest[d]), config, on_progress=on_progress)
    ours_full = batch * (len(steps) - 1) / (steps[-1] - steps[0])

    net = reference.from_siamese(model)
    triples = [(datas[a], datas[b], same) for a, b, same in spec]
    reference.train(copy.deepcopy(net), triples[:batch], batch_size=batch)  # warm-up: first shapes
    ref_rate = reference.train(net, triples[batch:], batch_size=batch)

    # Head mode: 2,000 pairs over 200 images, features cached (as a first job leaves them).
    cache, identity = FeatureCache(), backbone_identity(model)
    generator = torch.Generator().manual_seed(0)
    names = [f"img{i:04d}" for i in range(200)]
    for name in names:
        cache.put(identity, name, torch.randn(model.feature_dim, generator=generator).abs())
    rng = random.Random(2)
    head_pairs = [LabeledPair(f"h{i}", *rng.sample(names, 2), i % 2 == 0) for i in range(2000)]
    ends: list[float] = []

    def on_epoch(info: dict) -> None:
        if "metrics" in info:
            ends.append(time.perf_counter())

    head_config = TrainConfig(epochs=4, mode="head", implied_ratio=0.0, patience=0)
    train_model(
        model, head_pairs[:1600], head_pairs[1600:], None, head_config, feature_cache=cache, on_progress=on_epoch
    )
    ours_head = 1600 / float(np.diff(ends).mean())
    return [
        Row(
            f"training, full mode: {n_pairs} pairs over {len(datas)} images, batch {batch}",
            f"{ours_full:.2f} pairs/s",
            f"{ref_rate:.2f} pairs/s",
            f"{ours_full / ref_rate:.2f}x",
            ">= 1.3x",
            check(ours_full / ref_rate >= 1.3),
        ),
        Row(
            "training, head mode: 1,600 pairs, features cached (incl. validation)",
            f"{ours_head:,.0f} pairs/s",
            f"{ref_rate:.2f} pairs/s (full)",
            f"{ours_head / ref_rate:,.0f}x",
            ">= 100x",
            check(ours_head / ref_rate >= 100),
        ),
    ]


# ----------------------------------------------------------------------------- over HTTP


def _fill_store(data_dir: Path, n_pairs: int = 500) -> int:
    """Labels at least ``n_pairs`` train + val pairs over 160 small images (20 scenes × 8); returns how many.

    Pairs across the train/val split do not count (training leaves them out), so a few more are labeled.
    """
    store = PairStore(data_dir)
    keys = [(s, v) for s in range(20) for v in range(8)]
    digest = {key: store.add_image(photo(2000 + key[0], key[1], size=(160, 120)), source="upload") for key in keys}
    spec = _scene_pairs(20, 8, 800, seed=3)
    added = 0
    for start in range(0, len(spec), 50):
        rows = [
            NewPair(digest[a], digest[b], "same" if same else "different", "bench")
            for a, b, same in spec[start : start + 50]
        ]
        store.add_pairs(rows)
        added = len(store.pairs_for_split("train")) + len(store.pairs_for_split("val"))
        if added >= n_pairs:
            break
    store.close()
    return added


def bench_http(repeats: int, work: Path, in_process_ms: float | None = None) -> list[Row]:
    """The real app (``python app.py``) through gradio_client; ``in_process_ms`` is the in-process median."""
    import httpx
    from gradio_client import Client, handle_file

    from siamese.rest import SCORE_PATH
    from tests.appserver import run_app

    data_dir = work / "http" / "data"
    n_labeled = _fill_store(data_dir)
    files = work / "http" / "images"
    files.mkdir(parents=True)

    def new_pair() -> tuple[str, str]:
        paths = []
        for _ in range(2):
            path = files / f"{next(_seeds)}.jpg"
            path.write_bytes(photo())
            paths.append(str(path))
        return paths[0], paths[1]

    env = {"SIAMESE_BACKBONE": "resnet18", "SIAMESE_PRETRAINED": "0"}
    with run_app(data_dir, env=env, timeout=180) as app:
        client = Client(app.url, verbose=False)

        def wait_engine(timeout: float = 180) -> dict:
            """Until the active version is served by ONNX Runtime (exported in the background)."""
            deadline = time.monotonic() + timeout
            while (runtime := client.predict(api_name="/model_info")["runtime"])["runtime"] != "onnx":
                if runtime["note"] or time.monotonic() > deadline:
                    raise RuntimeError(f"the app did not move to ONNX Runtime: {runtime}")
                time.sleep(0.2)
            return runtime

        wait_engine()

        def score(a: str, b: str, via: Client = client) -> dict:
            return via.predict(handle_file(a), handle_file(b), api_name="/score")

        # gradio_client makes a new httpx client for every request (two uploads, the queue join, the event
        # stream), and each loads the CA bundle; a ready SSL context, passed as ssl_verify, skips that.
        shared_tls = Client(app.url, verbose=False, ssl_verify=ssl.create_default_context())
        plain = httpx.Client(base_url=app.url, timeout=60)  # one keep-alive connection, as a script would

        def score_plain(a: str, b: str) -> dict:
            files = {"image_a": Path(a).read_bytes(), "image_b": Path(b).read_bytes()}
            response = plain.post(SCORE_PATH, files=files)
            response.raise_for_status()
            return response.json()

        for _ in range(3):
            score(*new_pair())
            score(*new_pair(), via=shared_tls)
            score_plain(*new_pair())
        fresh = [[new_pair() for _ in range(repeats)] for _ in range(3)]  # photos take ~37 ms: made beforehand
        idle, idle_tls, idle_plain = [], [], []
        for pairs in zip(*fresh, strict=True):  # interleaved, so a noisy moment hits all three alike
            idle.append(ms(lambda: score(*pairs[0])))  # noqa: B023
            idle_tls.append(ms(lambda: score(*pairs[1], via=shared_tls)))  # noqa: B023
            idle_plain.append(ms(lambda: score_plain(*pairs[2])))  # noqa: B023
        base_call = [ms(lambda: client.predict(api_name="/model_info")) for _ in range(repeats)]
        base_tls = [ms(lambda: shared_tls.predict(api_name="/model_info")) for _ in range(repeats)]
        seen = new_pair()
        score(*seen)
        cached = [ms(lambda: score(*seen)) for _ in range(repeats)]
        cached_plain = [ms(lambda: score_plain(*seen)) for _ in range(repeats)]
        serving_rss = peak_rss_mb(app.process.pid)

        # /train to a new active version, 500 pairs, head mode, features cached by a first job.
        def train_to_active(**options) -> float:
            wait_engine()  # the previous activation's export is done: it would compete with this job
            before = client.predict(api_name="/model_info")["model_version"]
            started = time.perf_counter()
            client.predict(mode="head", api_name="/train", **options)
            while client.predict(api_name="/model_info")["model_version"] == before:
                status = client.predict(api_name="/train_status")
                if status["state"] in ("failed", "cancelled"):
                    raise RuntimeError(f"training ended {status['state']}: {status.get('message')}")
                time.sleep(0.02)
            return time.perf_counter() - started

        first = train_to_active()  # computes the backbone features of the 120 images
        warm = [train_to_active() for _ in range(2)]
        started = time.perf_counter()
        wait_engine()
        engine_ready = time.perf_counter() - started  # after the last activation: PyTorch served meanwhile

        # Scoring while a full-mode job trains (the job is cancelled after the timed calls).
        wait_engine()  # the last version's engine, built in the background after its activation
        fresh_busy = [new_pair() for _ in range(repeats)]
        client.predict(mode="full", epochs=1, api_name="/train")
        while client.predict(api_name="/train_status").get("phase") != "train":
            time.sleep(0.1)  # past loading the images, into the steps
        busy = [ms(lambda: score(*pair)) for pair in fresh_busy]  # noqa: B023
        state = client.predict(api_name="/train_status")["state"]
        client.predict(api_name="/cancel_training")
        training_rss = peak_rss_mb(app.process.pid)

    ratio = p95(busy) / p95(idle)

    def versus(samples) -> tuple[str, str, str]:
        """(ratio to in process, target, met) for an HTTP latency."""
        if not in_process_ms:
            return "", "", ""
        r = median(samples) / in_process_ms
        return f"HTTP / in process = {r:.2f}", "<= 2x in process", check(r <= 2)

    return [
        Row("score a new pair over HTTP: gradio_client, the real app", lat(idle), "", *versus(idle)),
        Row(
            "… gradio_client with a ready SSL context (ssl_verify=ssl.create_default_context())",
            lat(idle_tls),
            "",
            *versus(idle_tls),
        ),
        Row(
            f"… POST {SCORE_PATH} (httpx, one keep-alive connection, both files in one request)",
            lat(idle_plain),
            "",
            *versus(idle_plain),
        ),
        Row(
            "score a pair seen before over HTTP: gradio_client / POST /v1/score", f"{lat(cached)} / {lat(cached_plain)}"
        ),
        Row("/model_info over HTTP (no files, no work: Gradio's own cost per call)", lat(base_call)),
        Row("… with a ready SSL context", lat(base_tls)),
        Row(
            f"score a new pair while a full-mode job trains ({state} throughout)",
            lat(busy),
            "",
            f"p95 busy / idle = {ratio:.2f}",
            "<= 3x",
            check(ratio <= 3 and state == "running"),
        ),
        Row(
            f"/train to new active version: {n_labeled} pairs, head mode, features cached",
            f"{median(warm):.2f} s",
            "",
            f"first job (computes features of 160 images): {first:.1f} s",
        ),
        Row("… then until ONNX Runtime serves the new version (PyTorch meanwhile)", f"{engine_ready:.1f} s"),
        Row(
            "app peak RSS while serving (VmHWM)",
            f"{serving_rss:,.0f} MB",
            "",
            "",
            "<= 1,536 MB",
            check(serving_rss <= 1536),
        ),
        Row("app peak RSS incl. a full-mode job (batch 64)", f"{training_rss:,.0f} MB"),
    ]


# ----------------------------------------------------------------------------- reduced precision


def bench_precision(repeats: int, quick: bool = False) -> list[Row]:
    """fp32 (PyTorch and ONNX Runtime), ONNX Runtime int8 and bf16 autocast: the speed of a pair's forward,
    and the validation AUC on two sets, each on fresh images that calibration never saw:

    - ``photos``: 40 same-scene and 40 different-scene pairs of the synthetic 640×480 photos (easy);
    - ``digits``: scikit-learn's digits through resnet18 (random weights, as here) with a projection head
      trained in head mode on 300 other digit pairs: a real, imperfect model whose AUC can move.
    """
    from benchmarks.digits import load_digits_images, sample_pairs, split_indices
    from siamese.runtime import export_onnx, onnx_engine, quantize_int8, torch_engine

    model = resnet18()
    work = Path(tempfile.mkdtemp(prefix="siamese-precision-"))
    # 1. a trained head on digits (head mode: backbone features computed once)
    digits = load_digits_images()
    n_train, n_val = (150, 150) if quick else (300, 300)
    train_idx, val_idx, calib_idx = split_indices(len(digits), [n_train, n_val, 64], seed=0)
    train_pairs = sample_pairs(digits, train_idx, 300, seed=1, prefix="t")
    val_pairs = sample_pairs(digits, val_idx, 600 if quick else 1000, seed=2, prefix="v")
    result = train_model(model, train_pairs, [], digits.load_image, TrainConfig(mode="head", epochs=30, patience=0))
    model = result.model.eval()
    to_tensor = model.preprocessing.to_tensor

    # 2. the engines, int8 calibrated on 64 digits and 16 photos that no check uses
    calibration = torch.cat(
        [
            to_tensor([digits.load_image(digits.digests[i]) for i in calib_idx]),
            to_tensor([load_image(photo(7000 + s, 0)).image for s in range(16)]),
        ]
    )
    fp32_path = export_onnx(model, work / "fp32.onnx")
    int8_path = quantize_int8(fp32_path, work / "int8.onnx", calibration)
    torch_run = torch_engine(model.to(memory_format=torch.channels_last)).run

    def bf16(t: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model.embed(t.contiguous(memory_format=torch.channels_last)).float()

    engines: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "fp32 PyTorch": torch_run,
        "fp32 ONNX Runtime": onnx_engine(fp32_path, "fp32").run,
        "int8 ONNX Runtime (static, per-channel)": onnx_engine(int8_path, "int8").run,
        "bf16 autocast PyTorch": bf16,
    }

    # 3. validation sets
    photos = to_tensor([load_image(photo(3000 + s, v)).image for s in range(40) for v in range(2)])
    photo_pairs = [(2 * s, 2 * s + 1, True) for s in range(40)]
    photo_pairs += [(2 * s, 2 * ((s + 1) % 40), False) for s in range(40)]
    val_digests = sorted({d for p in val_pairs for d in (p.image_a, p.image_b)})
    where = {d: i for i, d in enumerate(val_digests)}
    digit_images = to_tensor([digits.load_image(d) for d in val_digests])
    digit_pairs = [(where[p.image_a], where[p.image_b], p.same) for p in val_pairs]

    def auc(run, images: torch.Tensor, pairs) -> float:
        emb = torch.cat([run(images[i : i + 32]) for i in range(0, len(images), 32)]).double()
        sims = [float(emb[a] @ emb[b]) for a, b, _ in pairs]
        return roc_auc(np.array(sims), np.array([same for *_, same in pairs]))

    x = photos[:2].contiguous()
    times: dict[str, list[float]] = {name: [] for name in engines}
    for run in engines.values():
        run(x), run(x)
    for _ in range(repeats):
        for name, run in engines.items():
            times[name].append(ms(lambda: run(x)))  # noqa: B023
    aucs = {name: (auc(run, photos, photo_pairs), auc(run, digit_images, digit_pairs)) for name, run in engines.items()}
    base_ms, (base_photos, base_digits) = median(times["fp32 PyTorch"]), aucs["fp32 PyTorch"]
    rows = []
    for name in engines:
        speed = base_ms / median(times[name])
        photos_auc, digits_auc = aucs[name]
        drop = max(base_photos - photos_auc, base_digits - digits_auc)
        reduced = not name.startswith("fp32")
        rows.append(
            Row(
                f"precision {name}: forward of a pair; AUC photos {photos_auc:.4f}, digits {digits_auc:.4f}",
                lat(times[name]),
                "",
                f"{speed:.2f}x fp32 PyTorch; AUC drop {drop:+.4f}",
                ">= 2x, drop <= 0.005" if reduced else "",
                check(speed >= 2 and drop <= 0.005) if reduced else "",
            )
        )
    print(f"precision: digits head trained to val AUC {base_digits:.4f} (fp32); {len(digit_pairs)} digit pairs")
    return rows


# ----------------------------------------------------------------------------- main


def run(sections: tuple[str, ...] = SECTIONS, quick: bool = False) -> list[Row]:
    """Runs the chosen sections; returns their rows (benchmarks/run_all.py prints them with the others)."""
    repeats = 10 if quick else 25
    sections = tuple(s for s in SECTIONS if s in sections)  # process first: http compares with it
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        in_process_ms = None
        for section in sections:
            started = time.perf_counter()
            print(f"bench_serve {section} ...", flush=True)
            if section == "process":
                found = bench_process(repeats, Path(work))
                in_process_ms = float(found[0].ours.split()[0])
            elif section == "train":
                found = bench_train(quick)
            elif section == "http":
                found = bench_http(repeats, Path(work), in_process_ms)
            else:
                found = bench_precision(repeats, quick)
            print_table(found, f"{section} ({time.perf_counter() - started:.0f} s)")
            rows += found
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    sections = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs", flush=True)
    print_table(run(sections, args.quick), "Serving: siamese next to the tutorial reference (resnet18, 640×480 JPEGs)")


if __name__ == "__main__":
    main()
