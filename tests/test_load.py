"""Eight real ``gradio_client`` clients labeling and scoring at once while a training job runs.

Each client labels ``LABELS_PER_CLIENT`` pairs (some shared with every other client) and scores every
few labels. Afterwards every returned label must be stored exactly once: the store holds exactly the
distinct pairs, each created by exactly one call, with the label every client agreed on.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from siamese.store import pair_id_for
from tests.appserver import SHAPES, class_folders_zip, run_app, shape_png

pytestmark = pytest.mark.slow

gradio_client = pytest.importorskip("gradio_client")
Client, handle_file = gradio_client.Client, gradio_client.handle_file

N_CLIENTS = 8
LABELS_PER_CLIENT = 200  # 8 × 200 = 1,600 labels (1,460 distinct pairs), plus a score every few labels
SHARED = 20  # of each client's pairs, this many come from one list every client labels
SCORE_EVERY = 4  # a /score after every fourth label
PER_CLASS = 20  # images per shape class for the load (seeds 100+, apart from the training seed images)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with run_app(tmp_path_factory.mktemp("load") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("load-images")
    made = []
    for kind in SHAPES:
        for seed in range(100, 100 + PER_CLASS):
            path = folder / f"{kind}-{seed}.png"
            path.write_bytes(shape_png(kind, seed))
            made.append((kind, path))
    return made


def plans(images: list[tuple[str, Path]]) -> list[list[tuple[Path, Path, str]]]:
    """Each client's labels: its own pairs plus the shared ones, in a shuffled order."""
    rng = random.Random(0)
    every = [(i, j) for i in range(len(images)) for j in range(i + 1, len(images))]
    rng.shuffle(every)
    own_count = LABELS_PER_CLIENT - SHARED
    shared, rest = every[:SHARED], every[SHARED:]
    result = []
    for client in range(N_CLIENTS):
        own = rest[client * own_count : (client + 1) * own_count]
        picks = own + shared
        rng.shuffle(picks)
        plan = []
        for i, j in picks:
            (kind_a, a), (kind_b, b) = images[i], images[j]
            a, b = (a, b) if rng.random() < 0.5 else (b, a)  # shared pairs arrive in either order
            plan.append((a, b, "same" if kind_a == kind_b else "different"))
        result.append(plan)
    return result


def stored_pairs(data_dir: Path) -> dict[str, str]:
    uri = f"file:{data_dir / 'labels.sqlite3'}?mode=ro"
    with sqlite3.connect(uri, uri=True, timeout=10) as conn:
        return dict(conn.execute("SELECT pair_id, label FROM pairs"))


def test_concurrent_clients_while_training(app, images, tmp_path):
    setup = Client(app.url, verbose=False)
    seed = class_folders_zip(tmp_path / "seed.zip", per_class=8)  # enough labels to train on
    seeded = setup.predict(handle_file(seed), api_name="/import_dataset")
    assert seeded["rejected"] == [] and seeded["pairs_added"] >= 20
    before = stored_pairs(app.data_dir)
    assert len(before) == seeded["pairs_added"]

    started = setup.predict(epochs=40, mode="full", api_name="/train")
    assert started["state"] == "running"

    todo = plans(images)
    results: list[list[dict]] = [[] for _ in todo]
    scores: list[list[dict]] = [[] for _ in todo]
    errors: list[str] = []
    go = threading.Barrier(N_CLIENTS + 1)

    def work(index: int) -> None:
        try:
            client = Client(app.url, verbose=False)
            go.wait()
            for step, (a, b, label) in enumerate(todo[index]):
                results[index].append(client.predict(handle_file(a), handle_file(b), label, api_name="/label"))
                if step % SCORE_EVERY == 0:
                    scores[index].append(client.predict(handle_file(a), handle_file(b), api_name="/score"))
        except Exception as error:  # every failure is reported below, with its client
            errors.append(f"client {index}: {type(error).__name__}: {error}")
            if go.n_waiting:
                go.abort()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(N_CLIENTS)]
    for thread in threads:
        thread.start()
    go.wait(timeout=120)
    began = time.monotonic()
    states_during = []
    while any(thread.is_alive() for thread in threads) and time.monotonic() - began < 900:
        states_during.append(setup.predict(api_name="/train_status")["state"])
        time.sleep(0.5)
    for thread in threads:
        thread.join(timeout=60)
    elapsed = time.monotonic() - began
    assert not any(thread.is_alive() for thread in threads), "clients still running after 15 minutes"
    assert errors == []
    assert "running" in states_during  # the labels really arrived while the job trained

    # Every call answered, with sane scores and counts that never went backwards for one client.
    assert [len(r) for r in results] == [LABELS_PER_CLIENT] * N_CLIENTS
    for client_scores in scores:
        assert all(-1.0 <= s["similarity"] <= 1.0 and 0.0 <= s["distance"] <= 2.0 for s in client_scores)
    for client_results in results:
        totals = [r["total"] for r in client_results]
        assert totals == sorted(totals)
        assert all(r["same"] + r["different"] == r["total"] for r in client_results)

    # Every returned label is stored, exactly once, under the id of its two images.
    expected = {}
    for plan, client_results in zip(todo, results, strict=True):
        for (a, b, label), result in zip(plan, client_results, strict=True):
            assert result["pair_id"] == pair_id_for(sha(a), sha(b))
            expected[result["pair_id"]] = label
    assert len(expected) == N_CLIENTS * (LABELS_PER_CLIENT - SHARED) + SHARED
    created = [r["pair_id"] for client_results in results for r in client_results if r["created"]]
    assert sorted(created) == sorted(expected)  # each distinct pair created by exactly one call
    after = stored_pairs(app.data_dir)
    assert after == {**before, **expected}
    final = setup.predict("0" * 16, api_name="/delete_pair")
    assert final["total"] == len(before) + len(expected)
    assert final["same"] == sum(label == "same" for label in after.values())
    assert final["different"] == sum(label == "different" for label in after.values())

    # The job was not disturbed: it finishes and its model is served.
    deadline = time.monotonic() + 240
    while (status := setup.predict(api_name="/train_status"))["state"] == "running":
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    assert status["state"] == "succeeded", status["message"]
    assert status["job_id"] == started["job_id"]
    trained_on = status["metrics"]["n_train_pairs"] + status["metrics"]["n_val_pairs"]
    assert 0 < trained_on <= len(before)  # the labels as they were when it started
    assert setup.predict(api_name="/model_info")["model_version"] == status["model_version"]
    print(f"{N_CLIENTS} clients × {LABELS_PER_CLIENT} labels in {elapsed:.1f} s")
