"""Fast checks of siamese/ui.py: the app builds over a tiny stand-in service, and the API is wired.

No server is launched; the Blocks' own API description and functions are inspected and called.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from siamese.config import Settings, parse_auth
from siamese.embedmap import UNLABELED, EmbeddingMap
from siamese.images import MAX_BYTES, ImageError
from siamese.ui import (
    API_NAMES,
    _comparison_frame,
    _histogram_frame,
    _history_frame,
    _map_titles,
    _status_markdown,
    _upload,
    build_ui,
    example_pairs,
    launch_options,
)


class TinyService:
    """Answers every ModelService call with fixed values and records what was asked."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.calls: list[tuple] = []
        self.image = data_dir / "pool.png"
        Image.new("RGB", (8, 8), (255, 0, 0)).save(self.image)

    def _record(self, *call):
        self.calls.append(call)

    def score(self, image_a, image_b):
        self._record("score", image_a, image_b)
        if str(image_a).endswith(".txt"):
            raise ImageError("not a recognized image; supported formats: jpeg, png")
        return {"similarity": 0.5, "distance": 1.0, "same": True, "threshold": 0.4, "model_version": "v0"}

    def label(self, image_a, image_b, label, annotator="anonymous"):
        self._record("label", image_a, image_b, label, annotator)
        if label not in ("same", "different"):
            raise ValueError(f"label must be 'same' or 'different', got {label!r}")
        return {"pair_id": "0123456789abcdef", "created": True, "same": 1, "different": 0, "total": 1}

    def delete_pair(self, pair_id):
        raise KeyError(f"no labeled pair with id {pair_id!r}")

    def counts(self):
        return {"same": 1, "different": 0, "total": 1}

    def train(self, epochs=None, learning_rate=None, margin=None, batch_size=None, mode="auto"):
        self._record("train", epochs, learning_rate, margin, batch_size, mode)
        return {"job_id": "j1", "state": "running"}

    def train_status(self):
        return {
            "state": "succeeded",
            "job_id": "j1",
            "progress": 1.0,
            "epoch": 2,
            "loss": 0.1,
            "metrics": {
                "auc": 0.9,
                "accuracy": 0.8,
                "threshold": 0.3,
                "n_train_pairs": 8,
                "n_val_pairs": 2,
                "histograms": {"bin_edges": [0.0, 1.0, 2.0], "same": [3, 0], "different": [1, 4]},
            },
            "model_version": "v1",
            "message": "done",
            "history": [{"epoch": 1, "loss": 0.3, "val_auc": 0.7}, {"epoch": 2, "loss": 0.1, "val_auc": 0.9}],
            "comparison": {
                "before": {"auc": 0.5, "histograms": {}},
                "after": {"auc": 0.9, "histograms": {}},
                "fixed": ["0123456789abcdef", "fedcba9876543210"],
                "broke": [],
            },
        }

    def cancel_training(self):
        return {"state": "idle"}

    def models(self):
        return [{"version": "v0", "created_at": "2025-01-01T00:00:00", "backbone": "small_cnn", "active": True}]

    def checkpoint_file(self, version):
        return self.data_dir / f"{version}.safetensors"

    versions = ("v0",)  # the maps the Models tab draws: one per version, the active one last

    def embedding_maps(self):
        self._record("embedding_maps")
        names = tuple(f"{i:064x}" for i in range(6))
        points = np.arange(12, dtype=float).reshape(6, 2)
        groups = ("group 1", "group 1", UNLABELED, UNLABELED, UNLABELED, UNLABELED)
        return [EmbeddingMap(v, names, points * (i + 1), groups, (0.6, 0.3)) for i, v in enumerate(self.versions)]

    loading = False

    def wait_ready(self, timeout=None):
        if self.loading:
            raise RuntimeError("the model is still loading; try again in a few seconds")

    def model_info(self):
        return {
            "model_version": "v0",
            "backbone": "small_cnn",
            "pretrained": False,
            "embedding_dim": 8,
            "threshold": 0.4,
            "device": "cpu",
            "notice": "The backbone is not pretrained.",
        }


@pytest.fixture
def service(tmp_path):
    return TinyService(tmp_path)


@pytest.fixture
def demo(service):
    return build_ui(service)


def _endpoint(demo: gr.Blocks, name: str):
    (fn,) = [fn for fn in demo.fns.values() if fn.api_name == name]
    return fn


def test_builds_a_blocks_without_touching_the_model(demo, service):
    assert isinstance(demo, gr.Blocks)
    assert service.calls == []  # building calls nothing; the page asks when it loads


def test_every_api_endpoint_is_public_and_nothing_else_is(demo):
    info = demo.get_api_info()
    assert sorted(info["named_endpoints"]) == sorted(f"/{name}" for name in API_NAMES)
    assert info["unnamed_endpoints"] == {}


def test_api_parameters_are_named_as_the_contract_says(demo):
    endpoints = demo.get_api_info()["named_endpoints"]
    names = {path: [p["parameter_name"] for p in e["parameters"]] for path, e in endpoints.items()}
    assert names["/score"] == ["image_a", "image_b"]
    assert names["/label"] == ["image_a", "image_b", "label"]  # the annotator comes from the login
    assert names["/delete_pair"] == ["pair_id"]
    assert names["/train"] == ["epochs", "learning_rate", "margin", "batch_size", "mode"]
    assert names["/search"] == ["image", "k"]
    assert names["/explain"] == ["image_a", "image_b"]
    assert names["/import_dataset"] == ["file"]
    assert names["/activate_model"] == ["version"]
    for path in ("/train_status", "/cancel_training", "/suggest_pair", "/export_dataset", "/models", "/model_info"):
        assert names[path] == []
    train = {p["parameter_name"]: p for p in endpoints["/train"]["parameters"]}
    assert all(p["parameter_has_default"] for p in train.values())  # every /train option is optional
    assert train["mode"]["parameter_default"] == "auto"
    search = {p["parameter_name"]: p for p in endpoints["/search"]["parameters"]}
    assert search["k"]["parameter_default"] == 8
    assert len(endpoints["/suggest_pair"]["returns"]) == 3
    assert len(endpoints["/explain"]["returns"]) == 3


def _file(path: str) -> dict:
    """What Gradio hands an event that skips preprocessing: the uploaded file's data."""
    return {"path": path, "orig_name": path, "meta": {"_type": "gradio.FileData"}}


def test_endpoints_call_the_service(demo, service):
    score = _endpoint(demo, "score").fn(_file("a.png"), _file("b.png"))
    assert score["model_version"] == "v0"
    assert service.calls[-1] == ("score", "a.png", "b.png")
    _endpoint(demo, "train").fn(3, None, None, None, "head")
    assert service.calls[-1] == ("train", 3, None, None, None, "head")


def test_label_records_the_logged_in_user(demo, service):
    fn = _endpoint(demo, "label").fn
    fn(_file("a.png"), _file("b.png"), "same", gr.Request(username="alice"))
    assert service.calls[-1] == ("label", "a.png", "b.png", "same", "alice")
    fn(_file("a.png"), _file("b.png"), "different", gr.Request())
    assert service.calls[-1][-1] == "anonymous"


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("score", (_file("notes.txt"), _file("b.png")), "not a recognized image"),
        ("label", (_file("a.png"), _file("b.png"), "maybe", None), "label must be 'same' or 'different'"),
        ("delete_pair", ("0123456789abcdef",), "no labeled pair with id '0123456789abcdef'"),
    ],
)
def test_service_errors_become_gr_errors_with_the_message(demo, name, args, message):
    with pytest.raises(gr.Error) as caught:
        _endpoint(demo, name).fn(*args)
    assert message in caught.value.message
    assert "Traceback" not in caught.value.message


def test_error_messages_are_escaped_for_the_page(demo, service):
    with pytest.raises(gr.Error) as caught:
        _endpoint(demo, "label").fn(_file("a.png"), _file("b.png"), "<img src=x onerror=alert(1)>", None)
    assert "<img" not in caught.value.message
    assert "&lt;img" in caught.value.message


def test_screen_events_are_private(demo):
    public = [fn for fn in demo.fns.values() if fn.api_visibility != "private"]
    assert sorted(fn.api_name for fn in public) == sorted(API_NAMES)


def test_uploads_reach_the_service_untouched(demo):
    assert _upload(_file("/tmp/gradio/x/notes.txt")) == "/tmp/gradio/x/notes.txt"  # the service judges it
    assert _upload({"path": None, "url": "data:image/png;base64,iVBORw0KGgo="}) == b"\x89PNG\r\n\x1a\n"
    assert _upload(None) is None
    with_images = [fn for fn in demo.fns.values() if fn.api_name in ("score", "label", "search", "explain")]
    assert with_images and not any(fn.preprocess for fn in with_images)  # PIL never opens an upload first


def test_example_pairs_are_drawn_once_under_the_data_dir(tmp_path):
    pairs = example_pairs(tmp_path / "examples")
    assert len(pairs) >= 3
    files = {Path(p) for pair in pairs for p in pair}
    assert all(f.parent == tmp_path / "examples" and f.stat().st_size > 0 for f in files)
    stamps = {f: f.stat().st_mtime_ns for f in files}
    example_pairs(tmp_path / "examples")
    assert {f: f.stat().st_mtime_ns for f in files} == stamps


def test_launch_options_serve_only_the_data_dir_and_limit_uploads(service, tmp_path):
    options = launch_options(service, Settings(data_dir=tmp_path))
    served = [Path(path) for path in options["allowed_paths"]]  # never labels.sqlite3 or the job records
    assert {path.name for path in served} == {"images", "exports", "models", "examples"}
    assert all(path.parent == tmp_path.resolve() for path in served)
    assert options["max_file_size"] == MAX_BYTES
    assert options["auth"] is None
    assert "label-same" in options["js"]
    with_auth = launch_options(service, Settings(data_dir=tmp_path, auth=parse_auth("ann:pw,bob:pw2")))
    assert with_auth["auth"] == [("ann", "pw"), ("bob", "pw2")]


def test_the_poll_redraws_only_when_something_changed(demo, service):
    (poll,) = [fn for fn in demo.fns.values() if fn.name == "poll"]
    first = poll.fn((None, None))
    assert "succeeded" in first[0]  # the progress
    assert "Model v0" in first[8]  # the header
    again = poll.fn(first[-1])
    assert all(part == gr.skip() for part in again[:-1])
    service.model_info = lambda: {**TinyService.model_info(service), "model_version": "v1"}  # rolled forward
    moved = poll.fn(first[-1])
    assert all(part == gr.skip() for part in moved[:8])  # the training view stays
    assert "Model v1" in moved[8]


def test_the_train_view_shows_curves_comparison_and_histograms(service):
    status = service.train_status()
    assert _history_frame(status)["val_auc"].tolist() == [0.7, 0.9]
    table = _comparison_frame(status)
    assert table.values.tolist() == [
        ["validation AUC", "0.500", "0.900"],
        ["pairs now right", "", "2"],
        ["pairs now wrong", "", "0"],
    ]
    bars = _histogram_frame(status)
    assert bars.to_dict("records") == [
        {"distance": "0.50", "pairs": 3, "label": "same"},
        {"distance": "1.50", "pairs": 0, "label": "same"},
        {"distance": "0.50", "pairs": 1, "label": "different"},
        {"distance": "1.50", "pairs": 4, "label": "different"},
    ]
    assert _history_frame({}).empty
    empty = _histogram_frame({})  # every bin present at zero, so the chart draws once data comes
    assert len(empty) == 40 and empty["pairs"].sum() == 0 and set(empty["label"]) == {"same", "different"}


def test_the_header_says_so_while_the_model_loads(demo, service):
    (poll,) = [fn for fn in demo.fns.values() if fn.name == "poll"]
    service.loading = True
    assert "still loading" in poll.fn((None, None))[8]
    service.loading = False
    assert "Model v0" in poll.fn((None, None))[8]


def test_gradio_upload_cache_is_cleaned(demo):
    """Gradio's temporary copies of uploads are deleted hourly (the store keeps its own copy)."""
    assert demo.delete_cache == (3600, 3600)


def test_the_models_tab_draws_the_previous_map_beside_the_active_one(demo, service):
    (draw,) = [fn for fn in demo.fns.values() if fn.name == "draw_map"]
    assert draw.api_visibility == "private"
    note, picture = draw.fn()
    assert "Only **v0** so far" in note and "no previous model" in note
    assert picture.size == (480, 480 + 42)  # one panel
    service.versions = ("v1", "v2")
    note, picture = draw.fn()
    assert picture.size == (2 * 480, 480 + 42)  # two panels side by side
    assert "**v1** (before, left)" in note and "**v2** (active, right)" in note and "same 6 pool images" in note
    assert service.calls[-1] == ("embedding_maps",)
    assert _map_titles(service.embedding_maps()) == ["v1 (before)", "v2 (active)"]
    service.embedding_maps = lambda: (_ for _ in ()).throw(ValueError("the pool is empty: score some images"))
    with pytest.raises(gr.Error, match="the pool is empty"):
        draw.fn()


def test_status_line_names_the_scoring_engine_and_why(service):
    assert "ONNX Runtime" not in _status_markdown(service) and "ℹ️" not in _status_markdown(service)
    note = "validation AUC over 40 pairs: fp32 0.9100, int8 0.9000 (drop +0.0100, beyond the 0.005 allowed)"
    service.model_info = lambda: {
        **TinyService.model_info(service),
        "runtime": {"runtime": "onnx", "precision": "fp32", "note": note},
    }
    text = _status_markdown(service)
    assert "· ONNX Runtime fp32" in text
    assert f"ℹ️ {note}" in text
