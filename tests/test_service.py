"""The shared model service: one active model, atomic swaps, rollback, restarts, failures."""

from __future__ import annotations

import gc
import json
import random
import threading
import time
import weakref
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from siamese import service as service_module
from siamese.checkpoint import load_checkpoint, model_metadata
from siamese.config import ModelConfig, Settings
from siamese.images import ImageError, load_image
from siamese.labelgraph import LabelGraph
from siamese.model import build_model
from siamese.service import ModelService
from siamese.store import PairStore
from siamese.suggest import Suggester, thumbnail_vectors
from siamese.train import TooFewLabels
from siamese.transfer import export_zip
from siamese.versions import ModelRegistry, VersionError
from tests.images_factory import labeled_pairs, shapes_dataset
from tests.test_labelgraph import state


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


def test_suggest_pair_places_new_images_against_the_labeled_groups(service, items, monkeypatch):
    """The service hands the Suggester its label graph: a join pair's partner is a labeled group's member."""
    for _, data in items[:12]:
        service.add_image(data)
    service.label(items[0][1], items[1][1], "same")
    group = {service.decode(items[0][1]).digest, service.decode(items[1][1]).digest}
    monkeypatch.setattr(service, "suggester", Suggester(seed=0, random_share=0.0, join_share=1.0))
    monkeypatch.setattr(service, "_active", replace(service.active, threshold=-1.0))  # every image is near enough
    for _ in range(4):
        path_a, path_b, info = service.suggest_pair()
        assert info["kind"] == "join" and "labeled group of 2" in info["reason"]
        assert path_a.stem not in group and path_b.stem in group
        service.label(path_a, path_b, "different")  # answered: the next pick is another image
    service.label(path_a, items[0][1], "same")  # now a group of three
    assert "labeled group of 3" in service.suggest_pair()[2]["reason"]


def test_suggest_pair_learns_from_answers_only_under_a_calibrated_threshold(service, items):
    """A kind's record counts answers to its suggestions only once the active model has been trained."""
    for _, data in items[:24]:
        service.add_image(data)
    _, matrix = service._index().snapshot()
    sims = (matrix @ matrix.T).numpy()
    threshold = float(np.median(sims[np.triu_indices(len(sims), 1)]))  # splits the pool's pairs in half
    service.suggester = Suggester(seed=0, random_share=0.0, join_share=0.0)

    def answer(n):
        kinds = []
        for _ in range(n):
            path_a, path_b, info = service.suggest_pair()
            service.label_known(path_a.stem, path_b.stem, "different")
            kinds.append(info["kind"])
        return kinds

    def answered():
        return sum(n for _, n, _ in service.suggester.kind_record().values())

    service._active = replace(service.active, threshold=threshold)  # meta without metrics: never trained
    answer(8)
    assert answered() == 0
    service._active = replace(service.active, meta={**service.active.meta, "metrics": {"auc": 0.9}})
    kinds = answer(8)
    model_kinds = sum(k in ("uncertain", "hard_positive", "hard_negative") for k in kinds[:-1])
    assert answered() == model_kinds > 0  # the 8th answer is learned at the next call; random picks never count


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


# ---------------------------------------------------------------- the label graph follows the store


def rebuilt(service) -> LabelGraph:
    return LabelGraph.from_pairs(service.store.all_pairs())


@pytest.mark.parametrize("sync_events", [2000, 3])  # incremental; and rebuilt after every burst of > 3 events
def test_label_graph_equals_a_rebuild_after_any_changes(service, items, monkeypatch, tmp_path, sync_events):
    monkeypatch.setattr(service_module, "GRAPH_SYNC_EVENTS", sync_events)
    join_warm_ups()
    assert service._graph is not None  # the warm-up built it: the first suggestion does not wait for it
    rebuilds = []
    last_seq = service.store.last_event_seq
    monkeypatch.setattr(service.store, "last_event_seq", lambda: rebuilds.append(1) or last_seq())
    digests = [service.add_image(data) for _, data in items[::4][:14]]
    side = PairStore(tmp_path / "side")  # import zips are exported from here
    for _, data in items[::4][:14]:
        side.add_image(data)
    other = PairStore(service.data_dir)  # another process on the same data dir (the CLI, a second worker)
    rng = random.Random(11)
    kinds = ["label", "relabel", "delete", "undo", "other", "import"]
    done, seen_contradictions = [], 0
    for step in range(160):
        kind = rng.choices(kinds, weights=[40, 14, 12, 12, 8, 3])[0]
        pairs = service.store.all_pairs()
        who = rng.choice(["ann", "bob"])
        if kind == "label":
            service.label_known(*rng.sample(digests, 2), rng.choice(["same", "different"]), annotator=who)
        elif kind == "relabel" and pairs:
            service.relabel(rng.choice(pairs).pair_id, rng.choice(["same", "different"]), annotator=who)
        elif kind == "delete" and pairs:
            service.delete_pair(rng.choice(pairs).pair_id)
        elif kind == "undo":
            service.undo(annotator=who)
        elif kind == "other":
            other.add_pair(*rng.sample(digests, 2), rng.choice(["same", "different"]), annotator="carol")
        elif kind == "import":
            for _ in range(8):
                side.add_pair(*rng.sample(digests, 2), rng.choice(["same", "different"]), annotator="dan")
            service.import_dataset(export_zip(side, tmp_path / f"import-{step}.zip"))
        done.append(kind)
        if rng.random() < 0.5:  # sometimes several changes between two looks
            continue
        expected = rebuilt(service)
        assert state(service.label_graph()) == state(expected), f"step {step}: {kind}"
        assert service.contradictions() == [asdict(c) for c in expected.contradictions()]
        seen_contradictions += len(expected.contradicting())
    assert state(service.label_graph()) == state(rebuilt(service))
    assert set(done) == set(kinds) and service.store.counts().total > 20
    assert seen_contradictions  # the comparisons covered contradictions too
    if sync_events == 2000:
        assert rebuilds == []  # only corrected, never rebuilt
    else:
        assert len(rebuilds) > 5


def test_label_graph_is_safe_with_concurrent_labels(service, items, monkeypatch):
    digests = [service.add_image(data) for _, data in items[::3][:20]]
    add = LabelGraph.add

    def slow_add(graph, pair):  # widens every window in which another thread could see a graph half changed
        time.sleep(0.0002)
        add(graph, pair)

    monkeypatch.setattr(LabelGraph, "add", slow_add)
    errors: list[BaseException] = []
    stop = threading.Event()

    def write(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(50):
            pairs = service.store.list_pairs(limit=20)
            try:
                kind = rng.random()
                if kind < 0.6 or not pairs:
                    service.label_known(*rng.sample(digests, 2), rng.choice(["same", "different"]), f"w{seed}")
                elif kind < 0.75:
                    service.relabel(rng.choice(pairs).pair_id, rng.choice(["same", "different"]), f"w{seed}")
                elif kind < 0.9:
                    service.delete_pair(rng.choice(pairs).pair_id)
                else:
                    service.undo(f"w{seed}")
            except (LookupError, ValueError):  # another thread deleted the pair first
                pass
            except BaseException as error:
                errors.append(error)

    def read() -> None:
        while not stop.is_set():
            try:
                graph = service.label_graph()
                assert state(graph) == state(LabelGraph(graph.edges))  # whole at every moment
                service.contradictions()
            except BaseException as error:
                errors.append(error)

    writers = [threading.Thread(target=write, args=(seed,)) for seed in range(4)]
    readers = [threading.Thread(target=read) for _ in range(3)]
    for thread in writers + readers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    for thread in readers:
        thread.join()
    assert not errors, errors[:3]
    assert service.store.counts().total > 0
    assert state(service.label_graph()) == state(rebuilt(service))


# ---------------------------------------------------------------- versions made by hand (no training: fast)


def trained_from(service, parent: str, scale: float = 1.0, seed: int = 0) -> str:
    """A new version whose lineage says it was trained from ``parent``; its weights are ``parent``'s plus noise."""
    model, meta = service.registry.load(parent)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale * (p.std() if p.numel() > 1 else 1.0))
    meta = {k: v for k, v in meta.items() if k not in ("version", "created_at")}
    return service.registry.save(model, {**meta, "parent": parent}).version


def join_warm_ups() -> None:
    """Waits for the background pool indexing that each activation starts."""
    for thread in threading.enumerate():
        if thread.name == "siamese-index":
            thread.join()


def spy_loads(service, monkeypatch) -> tuple[list[str], list[weakref.ref]]:
    """Records each version the registry loads, and a weak reference to each model loaded."""
    loads, alive = [], []
    load = service.registry.load

    def spy(version, device="cpu"):
        model, meta = load(version, device=device)
        loads.append(version)
        alive.append(weakref.ref(model))
        return model, meta

    monkeypatch.setattr(service.registry, "load", spy)
    return loads, alive


def direct_embeddings(service, version: str, digests) -> torch.Tensor:
    """The version's checkpoint, loaded here and run on the pool images: no service code involved."""
    model, _ = load_checkpoint(service.registry.path(version))
    pixels = model.preprocessing.to_tensor([load_image(service.image_path(d)).image for d in digests])
    with torch.inference_mode():
        return model.embed(pixels)


# ---------------------------------------------------------------- the previous model's map beside the active one


def test_embedding_maps_put_the_parent_beside_the_active_model(tmp_path, items):
    decomposition = pytest.importorskip("sklearn.decomposition")
    linalg = pytest.importorskip("scipy.linalg")
    torch.manual_seed(0)  # v0's random weights: the same maps on every run
    service = make_service(tmp_path / "data")
    circles = [data for name, data in items if name == "circle"][:3]
    for _, data in items[::2][:30]:
        service.add_image(data)
    service.label(circles[0], circles[1], "same")
    service.label(circles[1], circles[2], "same")
    (only,) = service.embedding_maps()
    assert only.version == "v0" and service.previous_version() is None
    service.activate(trained_from(service, "v0", scale=0.3))
    before, after = service.embedding_maps()
    assert (before.version, after.version) == ("v0", "v1")
    assert before.digests == after.digests and sorted(after.digests) == sorted(service.store.pool())
    assert before.groups == after.groups and after.groups.count("group 1") == 3
    # Independently: v0's checkpoint embeds the same images; PCA by scikit-learn, Procrustes by SciPy.
    direct = direct_embeddings(service, "v0", before.digests).numpy().astype(np.float64)
    projected = decomposition.PCA(2, svd_solver="full").fit_transform(direct)  # centred
    target = after.points - after.points.mean(axis=0)
    rotation, _ = linalg.orthogonal_procrustes(projected, target)
    scale = np.linalg.norm(target) / np.linalg.norm(projected)
    expected = projected @ rotation * scale + after.points.mean(axis=0)
    spread = np.sqrt((target**2).sum(axis=1).mean())
    np.testing.assert_allclose(before.points, expected, atol=1e-3 * spread)

    def gap(points) -> float:
        return float(((points - after.points) ** 2).sum(axis=1).mean())

    assert 0 < gap(before.points) < gap(projected)  # aligned: closer than the raw projections (here 50× closer)


def test_previous_version_is_the_parent_else_the_one_active_before(service):
    service.activate(trained_from(service, "v0"))
    assert service.previous_version() == "v0"  # v1's parent
    service.activate("v0")
    assert service.previous_version() == "v1"  # v0 has no parent: the version active before it
    service.activate(trained_from(service, "v1"))
    assert service.previous_version() == "v1"  # v2's parent, not v0 (active just before)
    assert make_service(service.data_dir).previous_version() == "v1"  # lineage survives a restart
    service.activate("v0")
    assert make_service(service.data_dir).previous_version() is None  # what was active before does not
    join_warm_ups()


def test_the_previous_model_is_loaded_on_demand_and_not_kept(service, items, monkeypatch):
    for _, data in items[::2][:20]:
        service.add_image(data)
    service.embedding_maps()  # v0 active: the pool is embedded under v0
    service.activate(trained_from(service, "v0"))
    join_warm_ups()
    loads, alive = spy_loads(service, monkeypatch)
    service.embedding_maps()
    assert loads == []  # v0 embedded the pool while it was active: its rows are still cached
    service.cache.drop_version("v0")
    service.embedding_maps()
    service.embedding_maps()
    assert loads == ["v0"]  # loaded once; the second map found its embeddings cached
    gc.collect()
    assert alive[0]() is None  # and the model was let go
    assert len(service.cache.items_for("v0")) == service.store.pool_size()
    service.activate(trained_from(service, "v1"))  # v2: v0 is shown beside nothing any more
    join_warm_ups()
    assert service.cache.items_for("v0") == {}  # so its embeddings go
    assert len(service.cache.items_for("v1")) == service.store.pool_size()  # v1's stay: it is v2's "before"


def test_an_empty_pool_has_no_map(service):
    with pytest.raises(ValueError, match="pool is empty"):
        service.embedding_maps()


# ---------------------------------------------------------------- the "looks alike" view of suggestions


def suggestion_inputs(service, monkeypatch) -> tuple[list[str], torch.Tensor]:
    """The pool and the reference rows that suggest_pair hands the Suggester."""
    seen = {}
    suggest = service.suggester.suggest

    def spy(pool, embeddings, threshold, labeled, usage=None, reference=None, **rest):
        seen.update(pool=list(pool), reference=reference)
        return suggest(pool, embeddings, threshold, labeled, usage, reference, **rest)

    monkeypatch.setattr(service.suggester, "suggest", spy)
    service.suggest_pair()
    monkeypatch.setattr(service.suggester, "suggest", suggest)
    return seen["pool"], seen["reference"]


def test_looks_alike_is_thumbnails_when_v0_is_not_pretrained(service, items, monkeypatch):
    for _, data in items[::2][:12]:
        service.add_image(data)
    pool, reference = suggestion_inputs(service, monkeypatch)
    expected = thumbnail_vectors([load_image(service.image_path(d)).image for d in pool])
    torch.testing.assert_close(reference, expected)
    service.activate(trained_from(service, "v0"))  # whichever model is active
    pool, reference = suggestion_inputs(service, monkeypatch)
    torch.testing.assert_close(reference, expected)
    join_warm_ups()


@pytest.fixture
def pretrained_service(tmp_path):
    """A service whose v0 says it started from ImageNet weights (as a resnet18 with a TORCH_HOME cache would)."""
    data = tmp_path / "data"
    registry = ModelRegistry(data / "models")
    model = build_model(ModelConfig(backbone="small_cnn", pretrained=False))
    meta = model_metadata(model, threshold=0.5, metrics={}, parent=None)
    registry.set_active(registry.save(model, {**meta, "pretrained_init": True}).version)
    return make_service(data)


def test_looks_alike_is_the_pretrained_v0_when_there_is_one(pretrained_service, items, monkeypatch):
    service = pretrained_service
    assert service.model_info()["pretrained"] is True
    for _, data in items[::2][:12]:
        service.add_image(data)
    loads, alive = spy_loads(service, monkeypatch)
    pool, reference = suggestion_inputs(service, monkeypatch)
    assert loads == []  # v0 is active: its own embeddings are the reference, no second model
    # (served by ONNX Runtime when it is installed: equal to PyTorch's within float rounding)
    torch.testing.assert_close(reference, direct_embeddings(service, "v0", pool), atol=1e-4, rtol=0)

    service.activate(trained_from(service, "v0"))
    join_warm_ups()
    for _, data in items[1::2][:5]:  # new images: the reference needs v0's forwards
        service.add_image(data)
    service.cache.drop_version("v0")
    loads.clear(), alive.clear()
    pool, reference = suggestion_inputs(service, monkeypatch)
    join_warm_ups()
    assert loads == ["v0"] and len(pool) == 17
    gc.collect()
    assert all(ref() is None for ref in alive)  # loaded for the index update, then let go
    torch.testing.assert_close(reference, direct_embeddings(service, "v0", pool), atol=1e-5, rtol=0)
    active = direct_embeddings(service, "v1", pool)
    assert (reference - active).abs().max() > 0.01  # not the active model's view
    assert reference.shape[1] != thumbnail_vectors([]).shape[1]  # nor thumbnails
