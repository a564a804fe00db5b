"""The HTTP API of shared/API.md, driven through ``gradio_client`` against the real ``python app.py``.

One app (small_cnn, a temporary data dir) serves the module; tests run in file order and build on
each other's labels: score, label, delete, bad requests, train, export/import, rollback, login.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import pytest

from tests.appserver import SHAPES, run_app, shape_png

pytestmark = pytest.mark.slow

gradio_client = pytest.importorskip("gradio_client")
Client, handle_file = gradio_client.Client, gradio_client.handle_file
AppError = gradio_client.exceptions.AppError

ENDPOINTS = {
    "/score",
    "/label",
    "/delete_pair",
    "/train",
    "/train_status",
    "/cancel_training",
    "/suggest_pair",
    "/search",
    "/explain",
    "/export_dataset",
    "/import_dataset",
    "/models",
    "/activate_model",
    "/model_info",
}
UNKNOWN_PAIR = "0" * 16  # a well-formed pair id that names nothing: /delete_pair then just reports counts


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with run_app(tmp_path_factory.mktemp("api") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def client(app):
    return Client(app.url, verbose=False)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, list[Path]]:
    """Five PNGs per class (circle, square, triangle), each a distinct file."""
    folder = tmp_path_factory.mktemp("shapes")
    made: dict[str, list[Path]] = {}
    for kind in SHAPES:
        made[kind] = []
        for seed in range(5):
            path = folder / f"{kind}-{seed}.png"
            path.write_bytes(shape_png(kind, seed))
            made[kind].append(path)
    return made


def counts(client) -> dict:
    result = client.predict(UNKNOWN_PAIR, api_name="/delete_pair")
    assert result["deleted"] is False
    return {key: result[key] for key in ("same", "different", "total")}


def label(client, a: Path, b: Path, which: str) -> dict:
    return client.predict(handle_file(a), handle_file(b), which, api_name="/label")


def wait_for_training(client, timeout: float = 150.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.predict(api_name="/train_status")
        if status["state"] != "running":
            return status
        assert 0.0 <= status["progress"] <= 1.0
        time.sleep(0.5)
    raise AssertionError(f"training still running after {timeout:.0f} s: {status}")


def test_view_api_lists_every_endpoint(client):
    info = client.view_api(return_format="dict", print_info=False)
    assert set(info["named_endpoints"]) == ENDPOINTS
    assert info["unnamed_endpoints"] == {}  # the screens' own events stay out of the API
    train = {p["parameter_name"]: p for p in info["named_endpoints"]["/train"]["parameters"]}
    assert set(train) == {"epochs", "learning_rate", "margin", "batch_size", "mode"}
    assert all(p["parameter_has_default"] for p in train.values())


def test_model_info_describes_the_active_model(client):
    info = client.predict(api_name="/model_info")
    assert info["model_version"] == "v0"
    assert info["backbone"] == "small_cnn"
    assert info["pretrained"] is False
    assert "not pretrained" in info["notice"]
    assert isinstance(info["embedding_dim"], int) and info["embedding_dim"] > 0
    assert -1.0 <= info["threshold"] <= 1.0
    assert info["device"] == "cpu"


def test_the_real_server_moves_scoring_to_onnx_runtime(client, shapes):
    deadline = time.monotonic() + 120  # the export runs in the background after start
    while (runtime := client.predict(api_name="/model_info")["runtime"])["runtime"] != "onnx":
        assert time.monotonic() < deadline, runtime
        assert not runtime["note"], runtime  # PyTorch serves meanwhile without a note; a note means it failed
        time.sleep(0.5)
    assert runtime["precision"] == "fp32"
    result = client.predict(handle_file(shapes["circle"][0]), handle_file(shapes["circle"][1]), api_name="/score")
    assert -1.0 <= result["similarity"] <= 1.0


def test_score_two_images(client, shapes):
    result = client.predict(handle_file(shapes["circle"][0]), handle_file(shapes["square"][0]), api_name="/score")
    assert set(result) >= {"similarity", "distance", "same", "threshold", "model_version"}
    assert -1.0 <= result["similarity"] <= 1.0
    assert 0.0 <= result["distance"] <= 2.0
    assert result["distance"] == pytest.approx((2 - 2 * result["similarity"]) ** 0.5, abs=1e-4)
    assert result["same"] is (result["similarity"] >= result["threshold"])
    assert result["model_version"] == "v0"


def test_an_image_is_similar_to_itself(client, shapes):
    same = handle_file(shapes["triangle"][0])
    result = client.predict(same, handle_file(shapes["triangle"][0]), api_name="/score")
    assert result["similarity"] == pytest.approx(1.0, abs=1e-4)
    assert result["distance"] == pytest.approx(0.0, abs=0.01)
    assert result["same"] is True


def test_label_creates_and_replaces_pairs(client, shapes):
    circle, other_circle, square = shapes["circle"][0], shapes["circle"][1], shapes["square"][0]
    first = label(client, circle, other_circle, "same")
    assert first["created"] is True
    assert isinstance(first["pair_id"], str) and first["pair_id"]
    assert (first["same"], first["different"], first["total"]) == (1, 0, 1)

    second = label(client, circle, square, "different")
    assert second["created"] is True
    assert (second["same"], second["different"], second["total"]) == (1, 1, 2)

    again = label(client, other_circle, circle, "different")  # the same two images, the other way round
    assert again["created"] is False
    assert again["pair_id"] == first["pair_id"]
    assert (again["same"], again["different"], again["total"]) == (0, 2, 2)
    label(client, circle, other_circle, "same")  # put it back
    assert counts(client) == {"same": 1, "different": 1, "total": 2}


def test_delete_pair(client, shapes):
    made = label(client, shapes["square"][1], shapes["triangle"][1], "different")
    assert made["total"] == 3
    gone = client.predict(made["pair_id"], api_name="/delete_pair")
    assert gone["deleted"] is True
    assert (gone["same"], gone["different"], gone["total"]) == (1, 1, 2)
    assert client.predict(made["pair_id"], api_name="/delete_pair")["deleted"] is False


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c, s, tmp: c.predict(handle_file(tmp), handle_file(s["circle"][0]), api_name="/score"), "not a"),
        (lambda c, s, tmp: label(c, s["circle"][0], s["square"][0], "maybe"), "label must be"),
        (lambda c, s, tmp: c.predict("not-a-pair", api_name="/delete_pair"), "pair"),
        (lambda c, s, tmp: c.predict("../x", api_name="/activate_model"), "version"),
        (lambda c, s, tmp: c.predict("v999", api_name="/activate_model"), "v999"),
        (lambda c, s, tmp: c.predict(epochs=0, api_name="/train"), "epochs"),
        (lambda c, s, tmp: c.predict(mode="sideways", api_name="/train"), "mode"),
        (lambda c, s, tmp: c.predict(handle_file(tmp), api_name="/import_dataset"), "zip"),
    ],
    ids=[
        "text-as-image",
        "bad-label",
        "bad-pair-id",
        "path-version",
        "unknown-version",
        "zero-epochs",
        "bad-mode",
        "text-as-zip",
    ],
)
def test_bad_requests_raise_a_clear_error_and_change_nothing(client, shapes, tmp_path, call, message):
    text = tmp_path / "notes.txt"
    text.write_text("these are notes, not an image or a zip\n")
    before = counts(client)
    with pytest.raises(AppError) as caught:
        call(client, shapes, text)
    assert message in str(caught.value)
    assert "Traceback" not in str(caught.value)
    assert counts(client) == before  # nothing changed, and the server answers the next request
    assert client.predict(api_name="/model_info")["model_version"] == "v0"


def test_training_needs_enough_labels(client):
    with pytest.raises(AppError, match=r"(?i)label"):
        client.predict(epochs=2, api_name="/train")
    assert client.predict(api_name="/train_status")["state"] in ("idle", "failed")


def test_train_to_a_new_version(client, shapes):
    kinds = list(shapes)
    for kind in kinds:  # every same pair within a class, and as many different pairs across classes
        images = shapes[kind]
        for i in range(len(images)):
            for j in range(i + 1, len(images)):
                label(client, images[i], images[j], "same")
    for i, kind in enumerate(kinds):
        other = kinds[(i + 1) % len(kinds)]
        for a in shapes[kind]:
            for b in shapes[other][:3]:
                label(client, a, b, "different")
    labeled = counts(client)
    assert labeled["same"] >= 30 and labeled["different"] >= 30

    started = client.predict(epochs=8, api_name="/train")
    assert started["state"] == "running" and started["job_id"]
    status = wait_for_training(client)
    assert status["state"] == "succeeded", status["message"]
    assert status["job_id"] == started["job_id"]
    assert status["progress"] == pytest.approx(1.0)
    metrics = status["metrics"]
    assert set(metrics) >= {"auc", "accuracy", "threshold", "n_train_pairs", "n_val_pairs"}
    assert metrics["n_train_pairs"] + metrics["n_val_pairs"] == labeled["total"]
    new = status["model_version"]
    assert new and new != "v0"

    models = client.predict(api_name="/models")
    assert [m["version"] for m in models if m["active"]] == [new]
    made = next(m for m in models if m["version"] == new)
    assert made["parent"] == "v0" and made["backbone"] == "small_cnn" and made["created_at"]
    info = client.predict(api_name="/model_info")
    assert info["model_version"] == new
    assert info["threshold"] == pytest.approx(metrics["threshold"])
    score = client.predict(handle_file(shapes["circle"][0]), handle_file(shapes["circle"][1]), api_name="/score")
    assert score["model_version"] == new


def test_suggest_search_and_explain(client, shapes):
    image_a, image_b, why = client.predict(api_name="/suggest_pair")
    assert Path(image_a).is_file() and Path(image_b).is_file()
    assert -1.0 <= why["similarity"] <= 1.0 and isinstance(why["reason"], str)

    found = client.predict(handle_file(shapes["circle"][0]), 4, api_name="/search")
    assert 1 <= len(found) <= 4
    similarities = [hit["similarity"] for hit in found]
    assert similarities == sorted(similarities, reverse=True)
    assert all(len(hit["image_id"]) == 64 and "label_hint" in hit for hit in found)

    heat_a, heat_b, score = client.predict(
        handle_file(shapes["circle"][0]), handle_file(shapes["square"][0]), api_name="/explain"
    )
    assert Path(heat_a).is_file() and Path(heat_b).is_file()
    assert -1.0 <= score["similarity"] <= 1.0


def test_export_then_import_into_a_second_instance(client, tmp_path_factory):
    exported = Path(client.predict(api_name="/export_dataset"))
    with zipfile.ZipFile(exported) as archive:
        names = archive.namelist()
        header = archive.read("pairs.csv").decode().splitlines()[0]
    assert "pairs.csv" in names and "metadata.json" in names
    assert any(name.startswith("images/") for name in names)
    assert header.startswith("image_a,image_b,label,annotator,created_at")

    with run_app(tmp_path_factory.mktemp("api-second") / "data") as second:
        other = Client(second.url, verbose=False)
        report = other.predict(handle_file(exported), api_name="/import_dataset")
        assert report["rejected"] == []
        assert report["pairs_added"] == counts(client)["total"]
        assert counts(other) == counts(client)
        again = other.predict(handle_file(exported), api_name="/import_dataset")
        assert again["pairs_added"] == 0 and again["images_added"] == 0  # nothing twice


def test_activate_the_previous_version_rolls_back(client):
    current = client.predict(api_name="/model_info")["model_version"]
    assert current != "v0"
    assert client.predict("v0", api_name="/activate_model") == {"model_version": "v0"}
    assert client.predict(api_name="/model_info")["model_version"] == "v0"
    assert [m["version"] for m in client.predict(api_name="/models") if m["active"]] == ["v0"]
    assert client.predict(current, api_name="/activate_model")["model_version"] == current  # and forward


def test_login_is_required_and_labels_record_the_annotator(tmp_path_factory, shapes):
    with run_app(tmp_path_factory.mktemp("api-auth") / "data", env={"SIAMESE_AUTH": "ann:secret,bob:pw"}) as app:
        with pytest.raises(Exception):  # noqa: B017 - refused before any endpoint is reached
            Client(app.url, verbose=False)
        ann = Client(app.url, auth=("ann", "secret"), verbose=False)
        label(ann, shapes["circle"][0], shapes["square"][0], "different")
        with zipfile.ZipFile(ann.predict(api_name="/export_dataset")) as archive:
            rows = archive.read("pairs.csv").decode().splitlines()
        assert len(rows) == 2 and ",different,ann," in rows[1]
