"""The pair store: dedup, labels with history, filters, splits, and no lost label under threads,
processes and SIGKILL."""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from siamese import store as store_module
from siamese.images import ImageError
from siamese.store import PairStore, pair_id_for
from tests import images_factory as factory

REPO = Path(__file__).resolve().parents[1]


def png(seed: int) -> bytes:
    """Distinct real PNG bytes per seed."""
    return factory.encode(factory.noise((8, 8), seed), "PNG")


def expected_pair_id(a: str, b: str) -> str:
    return hashlib.sha256(f"{min(a, b)}:{max(a, b)}".encode()).hexdigest()[:16]


@pytest.fixture
def store(tmp_path: Path) -> PairStore:
    with PairStore(tmp_path / "data") as opened:
        yield opened


@pytest.fixture
def images(store: PairStore) -> list[str]:
    return [store.add_image(png(seed)) for seed in range(12)]


# ----------------------------------------------------------------------------- schema


def test_creates_database_in_wal_mode_with_current_schema(tmp_path: Path):
    data = tmp_path / "data"
    PairStore(data).close()
    assert (data / "labels.sqlite3").is_file() and (data / "images").is_dir()
    conn = sqlite3.connect(data / "labels.sqlite3")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(store_module.MIGRATIONS) >= 1
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"images", "pairs", "events", "meta"} <= tables


def test_foreign_keys_are_enforced(store: PairStore, images: list[str]):
    conn = store._conn()
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO pairs VALUES ('0123456789abcdef', ?, ?, 'same', 'x', 't', 't', 'train')", (images[0], "f" * 64)
        )


def test_migrations_run_once_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    PairStore(tmp_path).close()
    calls = []

    def add_note_column(conn: sqlite3.Connection) -> None:
        calls.append(1)
        conn.execute("ALTER TABLE pairs ADD COLUMN note TEXT")

    monkeypatch.setattr(store_module, "MIGRATIONS", [*store_module.MIGRATIONS, add_note_column])
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 2)
    for _ in range(2):
        reopened = PairStore(tmp_path)
        assert reopened.schema_version == 2
        reopened.close()
    assert calls == [1]
    columns = [row[1] for row in sqlite3.connect(tmp_path / "labels.sqlite3").execute("PRAGMA table_info(pairs)")]
    assert "note" in columns


def test_refuses_a_database_from_newer_code(tmp_path: Path):
    PairStore(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "labels.sqlite3")
    conn.execute(f"PRAGMA user_version = {len(store_module.MIGRATIONS) + 5}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        PairStore(tmp_path)


# ----------------------------------------------------------------------------- images and the pool


def test_same_image_twice_is_stored_once(store: PairStore):
    data = png(1)
    first = store.add_image(data)
    second = store.add_image(data, source="score")
    assert first == second == hashlib.sha256(data).hexdigest()
    assert store.pool_size() == 1
    files = [p for p in store.images_dir.rglob("*") if p.is_file()]
    assert files == [store.image_path(first)]
    assert files[0].read_bytes() == data and files[0].suffix == ".png"
    assert store.put_image(data) == (first, False)


def test_rejected_image_leaves_nothing_behind(store: PairStore):
    for bad in (b"", b"not an image at all", factory.png_declaring(100_000, 100_000), factory.SVG):
        with pytest.raises(ImageError):
            store.add_image(bad)
    assert store.pool_size() == 0
    assert [p for p in store.images_dir.rglob("*") if p.is_file()] == []


def test_image_path_never_builds_paths_from_untrusted_text(store: PairStore, images: list[str]):
    for bad in ("../../etc/passwd", "A" * 64, images[0][:63], images[0] + "/", "/" + images[0][1:]):
        with pytest.raises(ValueError):
            store.image_path(bad)
        assert not store.has_image(bad)
    with pytest.raises(KeyError):
        store.image_path("0" * 64)
    assert store.image_path(images[0]).resolve().is_relative_to(store.images_dir.resolve())


def test_pool_is_every_image_oldest_first(store: PairStore):
    digests = [store.add_image(png(s), source=src) for s, src in enumerate(["upload", "score", "import"] * 3)]
    store.add_image(png(0))  # already known: does not move
    assert store.pool() == digests
    assert store.pool(limit=4, offset=2) == digests[2:6]
    assert store.pool_size() == 9


def test_jpeg_keeps_its_extension(store: PairStore):
    digest = store.add_image(factory.jpeg_bytes())
    assert store.image_path(digest).suffix == ".jpg"


# ----------------------------------------------------------------------------- pairs


def test_either_order_is_one_pair_and_relabel_keeps_history(store: PairStore, images: list[str]):
    a, b = images[0], images[1]
    first = store.add_pair(a, b, "same", "alice")
    assert first.created and first.pair_id == expected_pair_id(a, b) == pair_id_for(b, a)
    second = store.add_pair(b, a, "different", "bob")
    assert second.pair_id == first.pair_id and not second.created
    pair = store.get_pair(first.pair_id)
    assert (pair.image_a, pair.image_b, pair.label, pair.annotator) == (a, b, "different", "bob")
    assert pair.created_at < pair.updated_at
    assert store.counts() == store_module.Counts(same=0, different=1, total=1)
    history = store.history(first.pair_id)
    assert [(e.kind, e.label, e.annotator) for e in history] == [
        ("label", "same", "alice"),
        ("label", "different", "bob"),
    ]


@pytest.mark.parametrize(
    ("a", "b", "label", "message"),
    [
        (0, 1, "maybe", "same' or 'different"),
        (0, 0, "same", "two different images"),
        (0, "0" * 64, "same", "unknown image"),
        (0, "../x", "same", "not an image id"),
    ],
)
def test_bad_pairs_raise_clear_errors(store: PairStore, images: list[str], a, b, label, message):
    a = images[a] if isinstance(a, int) else a
    b = images[b] if isinstance(b, int) else b
    with pytest.raises(ValueError, match=message):
        store.add_pair(a, b, label)
    assert store.counts().total == 0
    assert store.events() == []


def test_labels_accept_booleans_and_digits(store: PairStore, images: list[str]):
    assert store.get_pair(store.add_pair(images[0], images[1], True).pair_id).label == "same"
    assert store.get_pair(store.add_pair(images[0], images[2], "0").pair_id).label == "different"


def test_delete_and_relabel(store: PairStore, images: list[str]):
    pair_id = store.add_pair(images[0], images[1], "same").pair_id
    store.add_pair(images[2], images[3], "same")
    store.relabel(pair_id, "different", "carol")
    assert store.get_pair(pair_id).label == "different" and store.get_pair(pair_id).annotator == "carol"
    assert store.counts() == store_module.Counts(same=1, different=1, total=2)
    assert store.delete_pair(pair_id) is True
    assert store.get_pair(pair_id) is None
    assert store.delete_pair(pair_id) is False
    assert store.counts() == store_module.Counts(same=1, different=0, total=1)
    with pytest.raises(ValueError, match="no pair"):
        store.relabel(pair_id, "same")
    with pytest.raises(ValueError, match="not a pair id"):
        store.delete_pair("'; DROP TABLE pairs; --")


def test_undo_restores_the_previous_label_per_annotator(store: PairStore, images: list[str]):
    a, b, c = images[:3]
    p1 = store.add_pair(a, b, "same", "alice").pair_id
    store.add_pair(a, b, "different", "bob")
    p2 = store.add_pair(a, c, "same", "alice").pair_id
    assert store.undo_last("bob") == p1
    assert store.get_pair(p1).label == "same" and store.get_pair(p1).annotator == "alice"
    assert store.undo_last("bob") is None  # bob has nothing left
    assert store.undo_last("alice") == p2
    assert store.get_pair(p2) is None  # that label created the pair
    assert store.undo_last("alice") == p1
    assert store.get_pair(p1) is None
    assert store.counts().total == 0
    assert [e.undone for e in store.history(p1) if e.kind == "label"] == [True, True]


def test_undo_skips_labels_of_deleted_pairs(store: PairStore, images: list[str]):
    keep = store.add_pair(images[0], images[1], "same", "dan").pair_id
    gone = store.add_pair(images[2], images[3], "same", "dan").pair_id
    store.delete_pair(gone)
    assert store.undo_last("dan") == keep
    assert store.get_pair(gone) is None and store.get_pair(keep) is None


def test_list_pairs_filters_and_pages(store: PairStore, images: list[str]):
    rng = random.Random(3)
    expected = []
    for i in range(40):
        a, b = rng.sample(images, 2)
        if store.get_pair(pair_id_for(a, b)):
            continue
        label, who = rng.choice(["same", "different"]), rng.choice(["ann", "bo"])
        at = f"2024-03-{1 + i % 28:02d}T{i % 24:02d}:00:00+00:00"
        expected.append((at, store.add_pair(a, b, label, who, at=at).pair_id, label, who))
    newest_first = sorted(expected, reverse=True)

    def ids(**filters):
        return [p.pair_id for p in store.list_pairs(limit=None, **filters)]

    assert ids() == [e[1] for e in newest_first]
    assert ids(label="same") == [e[1] for e in newest_first if e[2] == "same"]
    assert ids(annotator="bo") == [e[1] for e in newest_first if e[3] == "bo"]
    assert ids(since="2024-03-10", until="2024-03-20") == [
        e[1] for e in newest_first if "2024-03-10" <= e[0][:10] <= "2024-03-20"
    ]
    assert ids(label="different", annotator="ann", since="2024-03-05T00:00:00Z") == [
        e[1] for e in newest_first if e[2] == "different" and e[3] == "ann" and e[0] >= "2024-03-05"
    ]
    pages = [store.list_pairs(offset=offset, limit=7) for offset in range(0, len(expected), 7)]
    assert all(len(page) <= 7 for page in pages)
    assert [p.pair_id for page in pages for p in page] == ids()


def test_counts_and_all_pairs_match_a_plain_model_under_random_operations(store: PairStore, images: list[str]):
    rng = random.Random(7)
    model: dict[str, str] = {}
    for _ in range(300):
        a, b = rng.sample(images, 2)
        pid = expected_pair_id(a, b)
        if rng.random() < 0.2:
            assert store.delete_pair(pid) == (pid in model)
            model.pop(pid, None)
        else:
            label = rng.choice(["same", "different"])
            assert store.add_pair(a, b, label).created == (pid not in model)
            model[pid] = label
    tally = Counter(model.values())
    assert store.counts() == store_module.Counts(tally["same"], tally["different"], len(model))
    assert {p.pair_id: p.label for p in store.all_pairs()} == model


def test_disagreements_list_each_annotators_latest_vote(store: PairStore, images: list[str]):
    a, b, c, d = images[:4]
    split = store.add_pair(a, b, "same", "alice").pair_id
    store.add_pair(a, b, "different", "bob")
    agreed = store.add_pair(c, d, "same", "alice").pair_id
    store.add_pair(c, d, "same", "bob")
    changed_mind = store.add_pair(a, c, "same", "carol").pair_id
    store.add_pair(a, c, "different", "carol")  # one annotator changing their mind is no disagreement
    found = store.disagreements()
    assert [(x.pair_id, x.votes, x.label) for x in found] == [
        (split, {"alice": "same", "bob": "different"}, "different")
    ]
    assert agreed not in {x.pair_id for x in found} and changed_mind not in {x.pair_id for x in found}
    store.undo_last("bob")  # bob's agreeing vote on (c, d): the disagreement on (a, b) stands
    assert [x.pair_id for x in store.disagreements()] == [split]
    store.undo_last("bob")
    assert store.disagreements() == []


# ----------------------------------------------------------------------------- splits


def expected_split(pair_id: str, val_percent: int) -> str:
    return "val" if int(hashlib.sha256(pair_id.encode()).hexdigest(), 16) % 100 < val_percent else "train"


def test_sticky_splits_follow_the_documented_rule(tmp_path: Path):
    store = PairStore(tmp_path, val_percent=50)
    digests = [store.add_image(png(s)) for s in range(60)]
    assigned: dict[str, str] = {}
    rng = random.Random(0)
    for _ in range(120):
        a, b = rng.sample(digests, 2)
        pid = expected_pair_id(a, b)
        if store.get_pair(pid):
            continue
        if a not in assigned and b not in assigned:
            assigned[a] = assigned[b] = expected_split(pid, 50)
        elif a not in assigned:
            assigned[a] = assigned[b]
        elif b not in assigned:
            assigned[b] = assigned[a]
        store.add_pair(a, b, rng.choice(["same", "different"]))
        want = assigned[a] if assigned[a] == assigned[b] else "cross"
        assert store.get_pair(pid).split == want
    for digest in digests:
        assert store.image_split(digest) == assigned.get(digest)
    train = {d for p in store.pairs_for_split("train") for d in (p.image_a, p.image_b)}
    val = {d for p in store.pairs_for_split("val") for d in (p.image_a, p.image_b)}
    assert train and val and not train & val
    sizes = store.split_counts()
    assert sum(sizes.values()) == store.counts().total and sizes["cross"] == len(store.pairs_for_split("cross"))


def test_splits_are_stable_as_labels_arrive(store: PairStore, images: list[str]):
    for i in range(0, 10, 2):
        store.add_pair(images[i], images[i + 1], "same")
    before = {p.pair_id: p.split for p in store.all_pairs()}
    for i in range(9):
        store.add_pair(images[i], images[i + 2], "different")
    store.relabel(next(iter(before)), "different")
    after = {p.pair_id: p.split for p in store.all_pairs()}
    assert {k: after[k] for k in before} == before


@pytest.mark.parametrize(("percent", "split"), [(0, "train"), (100, "val")])
def test_val_percent_extremes(tmp_path: Path, percent: int, split: str):
    store = PairStore(tmp_path, val_percent=percent)
    digests = [store.add_image(png(s)) for s in range(6)]
    for a, b in itertools.pairwise(digests):
        store.add_pair(a, b, "same")
    assert {p.split for p in store.all_pairs()} == {split}
    with pytest.raises(ValueError, match="split must be"):
        store.pairs_for_split("test")


# ----------------------------------------------------------------------------- concurrency and crashes


def test_many_threads_lose_nothing(store: PairStore):
    digests = [store.add_image(png(s)) for s in range(40)]
    all_pairs = [(a, b) for i, a in enumerate(digests) for b in digests[i + 1 :]][:200]
    errors = []

    def label(worker: int) -> None:
        try:
            for a, b in all_pairs[worker::8]:
                store.add_pair(a, b, "same" if worker % 2 else "different", f"w{worker}")
                store.add_pair(digests[0], digests[1], "same", f"w{worker}")  # everyone fights over one pair
        except Exception as error:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(error)

    threads = [threading.Thread(target=label, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert {p.pair_id for p in store.all_pairs()} == {expected_pair_id(a, b) for a, b in all_pairs}
    assert len(store.history(expected_pair_id(digests[0], digests[1]))) == 1 + 200
    assert store.counts().total == len(all_pairs)


WRITER = """
import sys
from pathlib import Path
from siamese.store import PairStore
store = PairStore(Path(sys.argv[1]))
digests = store.pool()
worker, workers = int(sys.argv[2]), int(sys.argv[3])
pairs = [(a, b) for i, a in enumerate(digests) for b in digests[i + 1:]]
for a, b in pairs[worker::workers]:
    print(store.add_pair(a, b, "same", f"p{worker}").pair_id, flush=True)
"""


def _writer(data: Path, worker: int, workers: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data), str(worker), str(workers)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_several_processes_lose_nothing(tmp_path: Path):
    store = PairStore(tmp_path)
    digests = [store.add_image(png(s)) for s in range(16)]
    writers = [_writer(tmp_path, w, 4) for w in range(4)]
    printed = []
    for writer in writers:
        out, _ = writer.communicate(timeout=60)
        assert writer.returncode == 0
        printed += out.split()
    pairs = [(a, b) for i, a in enumerate(digests) for b in digests[i + 1 :]]
    expected = {expected_pair_id(a, b) for a, b in pairs}
    assert sorted(printed) == sorted(expected) and len(expected) == 120
    assert {p.pair_id for p in store.all_pairs()} == expected
    assert store.annotators() == {f"p{w}": len(pairs[w::4]) for w in range(4)}
    assert store.integrity_check() == "ok"


def _label_in_child(store: PairStore, a: str, b: str) -> None:
    store.add_pair(a, b, "same", "child")  # the parent's store object, used after a fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork start method")
def test_a_store_inherited_through_fork_opens_its_own_connection(store: PairStore, images: list[str]):
    import multiprocessing

    store.add_pair(images[0], images[1], "same", "parent")  # the parent has an open connection now
    child = multiprocessing.get_context("fork").Process(target=_label_in_child, args=(store, images[2], images[3]))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert store.add_pair(images[4], images[5], "different", "parent").created
    assert store.annotators() == {"parent": 2, "child": 1}
    assert store.integrity_check() == "ok"


def test_sigkill_mid_burst_keeps_every_returned_label(tmp_path: Path):
    store = PairStore(tmp_path)
    for s in range(60):  # 1,770 possible pairs: far more than are written before the kill
        store.add_image(png(s))
    writer = _writer(tmp_path, 0, 1)
    returned = []
    deadline = time.monotonic() + 30
    while len(returned) < 150 and time.monotonic() < deadline:
        returned.append(writer.stdout.readline().strip())
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    assert writer.returncode == -signal.SIGKILL
    returned += [line for line in writer.stdout.read().split() if len(line) == 16]  # printed before the kill
    assert len(returned) >= 150
    reopened = PairStore(tmp_path)
    assert reopened.integrity_check() == "ok"
    stored = {p.pair_id for p in reopened.all_pairs()}
    assert set(returned) <= stored
    assert reopened.counts().total == len(stored) >= len(returned)
    assert not [p for p in reopened.images_dir.rglob(".tmp-*")]


def test_last_event_seq_is_the_newest_events_seq(store: PairStore, images: list[str]):
    assert store.last_event_seq() == 0
    pair_id = store.add_pair(images[0], images[1], "same").pair_id
    store.relabel(pair_id, "different", "carol")
    store.delete_pair(pair_id)
    assert store.last_event_seq() == store.events()[-1].seq == max(e.seq for e in store.events())
    assert len(store.events()) == 3
