"""The shared model service: one active model, atomic swaps, rollback, restarts, failures."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from siamese.config import Settings
from siamese.images import ImageError
from siamese.service import ModelService
from siamese.train import TooFewLabels
from siamese.versions import VersionError
from tests.images_factory import labeled_pairs, shapes_dataset


def make_service(data_dir) -> ModelService:
    return ModelService(Settings(data_dir=data_dir, backbone="small_cnn", pretrained=False), background=False)


@pytest.fixture
def service(tmp_path):
    return make_service(tmp_path / "data")


@pytest.fixture(scope="module")
def items():
    return shapes_dataset(per_class=16)


def label_many(service, items, n=60, seed=0):
    for a, b, label in labeled_pairs(items, n, seed=seed):
        service.label(a, b, label)


def wait_done(service, timeout=120):
    deadline = time.monotonic() + timeout
    while service.train_status()["state"] == "running":
        assert time.monotonic() < deadline, "training did not finish in time"
        time.sleep(0.1)
    return service.train_status()


def test_score_is_cosine_of_embeddings(service, items):
    a, b = items[0][1], items[1][1]
    result = service.score(a, b)
    emb = service.embed([service.decode(a), service.decode(b)])
    expected = float(emb[0] @ emb[1])
    assert result["similarity"] == pytest.approx(expected, abs=1e-6)
    assert result["distance"] == pytest.approx(float(torch.dist(emb[0], emb[1])), abs=1e-4)
    assert result["same"] == (expected >= result["threshold"])
    assert result["model_version"] == "v0"


def test_second_score_of_same_images_runs_no_forward(service, items):
    service.score(items[0][1], items[1][1])
    before = service.active.embedder.images_forwarded
    service.score(items[1][1], items[0][1])
    assert service.active.embedder.images_forwarded == before


def test_scored_images_join_the_pool(service, items):
    service.score(items[0][1], items[1][1])
    service.flush_pool()
    assert service.store.pool_size() == 2


def test_bad_inputs_raise_clear_errors_and_store_nothing(service, items):
    with pytest.raises(ImageError, match="not a recognized image"):
        service.score(b"hello, I am text", items[0][1])
    with pytest.raises(ValueError, match="label must be 'same' or 'different'"):
        service.label(items[0][1], items[1][1], "maybe")
    with pytest.raises(ValueError, match="two different images"):
        service.label(items[0][1], items[0][1], "same")
    with pytest.raises(VersionError):
        service.activate("../../etc/passwd")
    with pytest.raises(ValueError, match="epochs"):
        service.train(epochs=0)
    assert service.counts() == {"same": 0, "different": 0, "total": 0}
    assert [m["version"] for m in service.models()] == ["v0"]


def test_label_in_either_order_is_one_pair(service, items):
    first = service.label(items[0][1], items[2][1], "same")
    again = service.label(items[2][1], items[0][1], "different")
    assert first["created"] is True and again["created"] is False
    assert again["pair_id"] == first["pair_id"]
    assert (again["same"], again["different"], again["total"]) == (0, 1, 1)


def test_too_few_labels(service, items):
    label_many(service, items, n=4)
    with pytest.raises(TooFewLabels):
        service.train(epochs=1)
    assert service.train_status()["state"] == "idle"


@pytest.mark.slow
def test_training_swaps_atomically_while_scores_are_served(service, items):
    label_many(service, items, n=60)
    a, b = items[0][1], items[1][1]
    before = service.score(a, b)
    thresholds = {"v0": service.active.threshold}
    seen, errors, stop = [], [], threading.Event()

    def keep_scoring():
        while not stop.is_set():
            try:
                seen.append(service.score(a, b))
            except Exception as error:  # any error while training runs is a failure
                errors.append(error)

    scorer = threading.Thread(target=keep_scoring)
    scorer.start()
    started = service.train(epochs=3)
    assert started["state"] == "running"
    with pytest.raises(RuntimeError, match="already running"):
        service.train(epochs=1)
    status = wait_done(service)
    time.sleep(0.2)
    stop.set()
    scorer.join()
    assert status["state"] == "succeeded", status["message"]
    assert not errors
    new_version = status["model_version"]
    assert new_version == "v1" and service.active.version == "v1"
    thresholds["v1"] = service.active.threshold
    assert {s["model_version"] for s in seen} <= {"v0", "v1"}
    assert seen[-1]["model_version"] == "v1"
    for s in seen:  # each answer's threshold is its own version's: no mixed snapshot
        assert s["threshold"] == thresholds[s["model_version"]]
    for key in ("auc", "accuracy", "threshold", "n_train_pairs", "n_val_pairs"):
        assert key in status["metrics"]
    info = {m["version"]: m for m in service.models()}
    assert info["v1"]["parent"] == "v0" and info["v1"]["active"] and not info["v0"]["active"]

    # rollback: v0 scores exactly as before training
    assert service.activate("v0") == {"model_version": "v0"}
    assert service.score(a, b) == before

    # a restart picks up the active version, the labels and the versions
    counts = service.counts()
    restarted = make_service(service.data_dir)
    assert restarted.active.version == "v0"
    assert restarted.counts() == counts
    assert [m["version"] for m in restarted.models()] == ["v0", "v1"]
    assert restarted.score(a, b)["similarity"] == pytest.approx(before["similarity"], abs=1e-6)


@pytest.mark.slow
def test_failed_save_keeps_the_old_model(service, items, monkeypatch):
    label_many(service, items, n=40)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(service.registry, "save", disk_full)
    service.train(epochs=1)
    status = wait_done(service)
    assert status["state"] == "failed"
    assert "No space left" in status["message"]
    assert service.active.version == "v0"
    assert [m["version"] for m in service.models()] == ["v0"]


@pytest.mark.slow
def test_cancel_keeps_the_old_model(service, items):
    label_many(service, items, n=40)
    service.train(epochs=200, mode="full")
    time.sleep(0.5)
    asked = time.monotonic()
    service.cancel_training()
    status = wait_done(service, timeout=10)
    assert time.monotonic() - asked < 5
    assert status["state"] == "cancelled"
    assert service.active.version == "v0"
    assert [m["version"] for m in service.models()] == ["v0"]


def test_interrupted_job_is_reported_failed_after_restart(tmp_path):
    data = tmp_path / "data"
    jobs = data / "jobs"
    jobs.mkdir(parents=True)
    record = {"state": "running", "job_id": "j1", "started_at": "2026-01-01T00:00:00+00:00", "progress": 0.4}
    (jobs / "j1.json").write_text(json.dumps(record))
    service = make_service(data)
    status = service.train_status()
    assert status["state"] == "failed" and status["job_id"] == "j1"
    assert "interrupted" in status["message"]


def test_model_info_says_not_pretrained(service):
    info = service.model_info()
    assert info["pretrained"] is False and "not pretrained" in info["notice"]
    assert info["backbone"] == "small_cnn" and info["embedding_dim"] == 128 and info["device"] == "cpu"


def test_export_then_import_into_new_service(service, items, tmp_path):
    label_many(service, items, n=20)
    path = service.export_dataset()
    other = make_service(tmp_path / "other")
    report = other.import_dataset(path)
    assert report["pairs_added"] == 20 and not report["rejected"]
    assert other.counts() == service.counts()


def test_explain_returns_two_heat_maps_and_the_score(service, items):
    heat_a, heat_b, score = service.explain(items[0][1], items[1][1])
    assert heat_a.size == heat_b.size and heat_a.mode == "RGB"
    assert score == service.score(items[0][1], items[1][1])


def test_search_finds_the_nearest_pool_images(service, items):
    for _, data in items[:12]:
        service.add_image(data)
    query = items[0][1]
    hits = service.search(query, k=5)
    assert len(hits) == 5 and all(h["image_id"] != service.decode(query).digest for h in hits)
    # independently: cosine of the query with every other pool image, sorted
    q = service.embed([service.decode(query)])[0]
    others = [service.decode(data) for _, data in items[1:12]]
    sims = service.embed(others) @ q
    expected = sorted(sims.tolist(), reverse=True)[:5]
    assert [h["similarity"] for h in hits] == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="k must be"):
        service.search(query, k=0)


def test_suggest_pair_offers_an_unlabeled_pool_pair_with_a_reason(service, items):
    for _, data in items[:10]:
        service.add_image(data)
    labeled = {frozenset((service.decode(a).digest, service.decode(b).digest)) for a, b, _ in []}
    path_a, path_b, info = service.suggest_pair()
    pair = frozenset((path_a.stem, path_b.stem))
    assert len(pair) == 2 and pair not in labeled
    assert path_a.is_file() and path_b.is_file()
    assert isinstance(info["reason"], str) and info["reason"]
    assert -1.0 <= info["similarity"] <= 1.0


def test_suggest_pair_on_an_empty_pool_is_a_clear_error(service):
    with pytest.raises(ValueError, match="no unlabeled pair"):
        service.suggest_pair()


def test_label_tab_offers_a_contradiction_for_review_first(service, items):
    circles = [data for name, data in items if name == "circle"][:3]
    a, _, c = (service.decode(x).digest for x in circles)
    service.label(circles[0], circles[1], "same")
    service.label(circles[1], circles[2], "same")
    different = service.label(circles[0], circles[2], "different")  # contradicts a=b=c
    path_a, path_b, info = service.pair_to_judge()
    assert {path_a.stem, path_b.stem} == {a, c}
    assert info["reason"].startswith("review:")
    assert service.store.get_pair(different["pair_id"]).label == "different"
    # offered once: next comes a suggestion (or a clear message when nothing is left)
    try:
        _, _, after = service.pair_to_judge()
        assert not after["reason"].startswith("review:")
    except ValueError as error:
        assert "no unlabeled pair" in str(error)
