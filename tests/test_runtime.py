"""The scoring engines: ONNX Runtime fp32 equals PyTorch, int8 is quantized and only served once verified."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from sklearn.metrics import roc_auc_score

from siamese.checkpoint import model_metadata, save_checkpoint
from siamese.config import ModelConfig, Settings
from siamese.embedder import Embedder
from siamese.images import decode_bytes, load_image
from siamese.metrics import roc_auc
from siamese.model import build_model
from siamese.runtime import (
    MIN_VERIFY_PAIRS,
    RuntimeUnavailable,
    export_onnx,
    fp32_onnx,
    onnx_engine,
    quantize_int8,
    torch_engine,
    verify_int8,
)
from siamese.service import ModelService
from tests.images_factory import labeled_pairs, shapes_dataset

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(ModelConfig(backbone="small_cnn", pretrained=False)).eval()


@pytest.fixture(scope="module")
def images(model):
    items = shapes_dataset(per_class=24, seed=3)
    return model.preprocessing.to_tensor([decode_bytes(data) for _, data in items])


@pytest.fixture(scope="module")
def fp32_path(model, tmp_path_factory):
    return export_onnx(model, tmp_path_factory.mktemp("onnx") / "model.fp32.onnx")


@pytest.fixture(scope="module")
def int8_path(fp32_path, images):
    return quantize_int8(fp32_path, fp32_path.with_name("model.int8.onnx"), images[:32])


def test_onnx_fp32_equals_pytorch_for_any_batch_size(model, fp32_path, images):
    engine = onnx_engine(fp32_path, "fp32")
    with torch.inference_mode():
        for n in (1, 2, 7):
            expected = model.embed(images[:n])
            got = engine.run(images[:n])
            assert got.shape == expected.shape
            assert torch.allclose(got, expected, atol=1e-5), float((got - expected).abs().max())


def test_int8_graph_is_quantized_and_close_but_not_equal(fp32_path, int8_path, images):
    ops = {node.op_type for node in onnx.load(str(int8_path)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert int8_path.stat().st_size < fp32_path.stat().st_size / 2  # int8 weights: a quarter, plus scales
    fp32 = onnx_engine(fp32_path, "fp32").run(images[32:])
    int8 = onnx_engine(int8_path, "int8").run(images[32:])
    cosines = (fp32 * int8).sum(1)
    assert float(cosines.min()) > 0.95  # the same embedding, up to quantization noise
    assert float((fp32 - int8).abs().max()) > 1e-4  # and really a different computation


def test_int8_calibration_needs_images(fp32_path, tmp_path):
    with pytest.raises(ValueError, match="at least one image"):
        quantize_int8(fp32_path, tmp_path / "x.onnx", torch.empty(0, 3, 32, 32))


def _pairs(n_same: int, n_different: int, n_images: int) -> list[tuple[int, int, bool]]:
    rng = np.random.default_rng(0)
    pairs = []
    for same, count in ((True, n_same), (False, n_different)):
        for _ in range(count):
            a, b = rng.choice(n_images, 2, replace=False)
            pairs.append((int(a), int(b), same))
    return pairs


def test_verify_int8_compares_validation_auc(model, images):
    reference = torch_engine(model).run
    # labels from the fp32 model itself: the more similar half "same"; its AUC is then 1, and checkable
    embeddings = reference(images)
    rng = np.random.default_rng(1)
    index = [tuple(int(x) for x in rng.choice(len(images), 2, replace=False)) for _ in range(60)]
    raw = [float(embeddings[a] @ embeddings[b]) for a, b in index]
    pairs = [(a, b, sim > float(np.median(raw))) for (a, b), sim in zip(index, raw, strict=True)]
    assert any(p[2] for p in pairs) and not all(p[2] for p in pairs)
    sims = np.array([float(embeddings[a] @ embeddings[b]) for a, b, _ in pairs])
    expected_auc = roc_auc(sims, [p[2] for p in pairs])

    same_engine = verify_int8(reference, reference, images, pairs)
    assert same_engine.passed and same_engine.pairs == 60
    assert same_engine.auc_fp32 == pytest.approx(expected_auc) and same_engine.auc_int8 == pytest.approx(expected_auc)

    def scrambled(batch: torch.Tensor) -> torch.Tensor:  # an engine that has lost the picture
        out = reference(batch)
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        return torch.nn.functional.normalize(out + 2 * noise)

    bad = verify_int8(reference, scrambled, images, pairs)
    assert not bad.passed
    assert bad.auc_int8 < bad.auc_fp32 - 0.005
    assert "beyond" in bad.reason and f"{bad.auc_int8:.4f}" in bad.reason


def test_verify_int8_refuses_without_enough_labels(model, images):
    run = torch_engine(model).run
    few = verify_int8(run, run, images, _pairs(3, 3, len(images)))
    assert not few.passed and few.auc_fp32 is None and str(MIN_VERIFY_PAIRS) in few.reason
    one_kind = verify_int8(run, run, images, _pairs(MIN_VERIFY_PAIRS + 5, 0, len(images)))
    assert not one_kind.passed and "both same and different" in one_kind.reason


def test_embedder_keeps_int8_and_fp32_embeddings_apart(model, fp32_path, int8_path):
    items = [load_image(data) for _, data in shapes_dataset(per_class=2, seed=5)]
    embedder = Embedder(model, "v7", engine=onnx_engine(fp32_path, "fp32"))
    fp32 = embedder.embed(items)
    assert embedder.key == "v7"
    embedder.use(onnx_engine(int8_path, "int8"))
    assert embedder.key == "v7@int8" and embedder.cached(items[0].digest) is None
    int8 = embedder.embed(items)
    assert embedder.images_forwarded == 2 * len(items)  # int8 computed its own, not served from fp32's
    assert not torch.equal(fp32, int8)
    assert torch.equal(embedder.cached(items[0].digest), int8[0])
    embedder.use(torch_engine(model))
    assert torch.equal(embedder.cached(items[0].digest), fp32[0])  # back on fp32: its cache entries again


# ---------------------------------------------------------------- in the service


def make_service(data_dir, **settings) -> ModelService:
    settings = Settings(data_dir=data_dir, backbone="small_cnn", pretrained=False, **settings)
    return ModelService(settings, device="cpu", background=False)


def test_service_scores_through_onnx_runtime_by_default(tmp_path):
    service = make_service(tmp_path / "data")
    info = service.model_info()["runtime"]
    assert info["runtime"] == "onnx" and info["precision"] == "fp32", info
    assert service.active.embedder.engine.path.parent == tmp_path / "data" / "runtime"
    items = shapes_dataset(per_class=2, seed=9)
    result = service.score(items[0][1], items[1][1])
    pixels = service.active.model.preprocessing.to_tensor([decode_bytes(items[0][1]), decode_bytes(items[1][1])])
    with torch.inference_mode():
        expected = service.active.model.embed(pixels.contiguous(memory_format=torch.channels_last))
    assert result["similarity"] == pytest.approx(float(expected[0] @ expected[1]), abs=1e-5)


def test_service_runtime_torch_setting(tmp_path):
    service = make_service(tmp_path / "data", runtime="torch")
    assert service.model_info()["runtime"]["runtime"] == "torch"
    assert not (tmp_path / "data" / "runtime").exists()


def test_onnx_failure_falls_back_to_pytorch_and_says_why(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "runtime").write_text("a file where the ONNX cache folder should be")
    service = make_service(data)
    info = service.model_info()["runtime"]
    assert info["runtime"] == "torch"
    assert "ONNX Runtime failed" in info["note"] and "PyTorch serves" in info["note"]
    items = shapes_dataset(per_class=1)
    assert 0 <= service.score(items[0][1], items[1][1])["distance"] <= 2  # and it still serves


def test_int8_waits_for_validation_pairs(tmp_path):
    service = make_service(tmp_path / "data", precision="int8")
    for a, b, label in labeled_pairs(shapes_dataset(per_class=4), 6):
        service.label(a, b, label)
    service.activate("v0")
    info = service.model_info()["runtime"]
    assert info["precision"] == "fp32" and "validation pairs" in info["note"], info


def _label_until_validated(service, minimum: int) -> None:
    items = shapes_dataset(per_class=80, seed=11)
    for a, b, label in labeled_pairs(items, 800, seed=2):
        service.label(a, b, label)
        if len(service.labeled_pairs("val")) >= minimum:
            return
    raise AssertionError("the store never put enough pairs in validation")


@pytest.mark.slow
def test_int8_is_served_only_within_the_auc_budget(tmp_path):
    data = tmp_path / "data"
    service = make_service(data, precision="int8")
    _label_until_validated(service, 30)
    service.activate("v0")  # a fresh activation runs the check on the labels now present
    info = service.model_info()["runtime"]
    # the same check, computed here from the files on disk and scikit-learn
    files = {p.name.split(".")[-2]: p for p in (data / "runtime").iterdir()}
    assert set(files) == {"fp32", "int8"}, files
    pairs = service.labeled_pairs("val")
    digests = sorted({d for p in pairs for d in (p.image_a, p.image_b)})
    images = [decode_bytes(service.store.image_bytes(d)) for d in digests]
    pixels = service.active.model.preprocessing.to_tensor(images)
    where = {d: i for i, d in enumerate(digests)}
    truth = [p.same for p in pairs]
    aucs = {}
    for name, path in files.items():
        emb = onnx_engine(path, name).run(pixels).numpy().astype(np.float64)
        sims = [float(np.dot(emb[where[p.image_a]], emb[where[p.image_b]])) for p in pairs]
        aucs[name] = roc_auc_score(truth, sims)
    assert f"fp32 {aucs['fp32']:.4f}, int8 {aucs['int8']:.4f}" in info["note"], (info, aucs)
    assert info["precision"] == ("int8" if aucs["fp32"] - aucs["int8"] <= 0.005 else "fp32"), (info, aucs)
    items = shapes_dataset(per_class=1, seed=12)
    assert -1 <= service.score(items[0][1], items[1][1])["similarity"] <= 1


EXIT_SCRIPT = """
import sys
from pathlib import Path
from siamese.config import Settings
from siamese.service import ModelService
from siamese.store import PairStore
from tests.images_factory import shapes_dataset
data = Path(sys.argv[1])
store = PairStore(data)
for _, image in shapes_dataset(per_class=400, seed=int(sys.argv[2])):
    store.add_image(image, source="upload")
service = ModelService(Settings(data_dir=data, backbone="small_cnn", pretrained=False), device="cpu", background=False)
service.activate("v0")  # another engine build and pool warm-up, both in background threads
print("exiting", len(service._workers))
"""


@pytest.mark.slow
def test_exit_while_background_work_runs_is_clean(tmp_path):
    """Exit waits for the pool warm-up and the engine build: a daemon thread inside PyTorch or ONNX Runtime
    at interpreter finalization aborts the process (rc -6, "terminate called without an active exception")."""
    for attempt in range(3):
        data = tmp_path / f"data{attempt}"
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, str(data), str(attempt)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith("exiting") and int(done.stdout.split()[1]) >= 1  # work was still running


def test_export_runs_in_a_child_process_and_reports_its_failure(model, tmp_path):
    checkpoint = save_checkpoint(model, tmp_path / "v0", model_metadata(model, threshold=0.5, metrics={}, parent=None))
    path = fp32_onnx(checkpoint, tmp_path / "runtime", "v0-abc")
    assert path == tmp_path / "runtime" / "v0-abc.fp32.onnx"
    images = torch.rand(3, 3, 32, 32)
    with torch.inference_mode():
        assert torch.allclose(onnx_engine(path, "fp32").run(images), model.embed(images), atol=1e-5)
    assert fp32_onnx(tmp_path / "nowhere", tmp_path / "runtime", "v0-abc") == path  # cached: no export at all
    with pytest.raises(RuntimeUnavailable, match="export exited with 1"):
        fp32_onnx(tmp_path / "nowhere", tmp_path / "runtime", "v9-def")
