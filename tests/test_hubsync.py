"""Hub sync: events and images reach the folder the scheduler uploads, a real CommitScheduler pushes them
(only the Hub API is stubbed), and a restore replays them into an empty store exactly."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from siamese.config import Settings
from siamese.hubsync import CURSOR_KEY, HubSync, from_settings, replay_folder
from siamese.store import PairStore
from tests import images_factory as factory


def png(seed: int) -> bytes:
    return factory.encode(factory.noise((8, 8), seed), "PNG")


class FakeHubApi:
    """The part of ``HfApi`` a CommitScheduler calls, keeping committed files in memory."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.commits: list[list[str]] = []
        self.repos: list[dict] = []
        self._pool = ThreadPoolExecutor(max_workers=1)  # like HfApi: one commit at a time

    def create_repo(self, repo_id, *, private=None, repo_type=None, exist_ok=False, **_):
        self.repos.append({"repo_id": repo_id, "private": private, "repo_type": repo_type, "exist_ok": exist_ok})
        return SimpleNamespace(repo_id=repo_id)

    def run_as_future(self, fn, *args, **kwargs) -> Future:
        return self._pool.submit(fn, *args, **kwargs)

    def create_commit(self, repo_id, *, operations, repo_type=None, commit_message="", revision=None, **_):
        assert repo_type == "dataset"
        for operation in operations:
            with operation.as_file() as handle:
                self.files[operation.path_in_repo] = handle.read()
        self.commits.append(sorted(op.path_in_repo for op in operations))
        return SimpleNamespace(oid=str(len(self.commits)))

    def download(self, repo_id, *, repo_type=None, token=None, local_dir=None, allow_patterns=None):
        """``snapshot_download`` over what was committed."""
        assert repo_type == "dataset"
        for name, data in self.files.items():
            path = Path(local_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return str(local_dir)


def scheduler_over(api: FakeHubApi):
    from siamese.hubsync import _flushing_scheduler

    def factory_(**kwargs):
        return _flushing_scheduler(hf_api=api, **kwargs)

    return factory_


def label_session(store: PairStore) -> list[str]:
    """A history with every kind of event: relabels, two annotators, a delete and undos."""
    digests = [store.add_image(png(s)) for s in range(8)]
    store.add_pair(digests[0], digests[1], "same", "alice")
    store.add_pair(digests[1], digests[0], "different", "bob")  # a disagreement
    store.add_pair(digests[2], digests[3], "same", "alice")
    store.add_pair(digests[2], digests[3], "different", "alice")
    store.undo_last("alice")  # back to "same"
    gone = store.add_pair(digests[4], digests[5], "different", "carol").pair_id
    store.delete_pair(gone, "carol")
    store.add_pair(digests[6], digests[7], "same", "carol")
    store.add_pair(digests[5], digests[6], "different", "bob")
    store.undo_last("bob")  # removes (5, 6)
    return digests


def snapshot(store: PairStore):
    return store.all_pairs(), store.disagreements(), store.counts()


def test_flush_writes_each_local_event_once_with_its_images(tmp_path: Path):
    store = PairStore(tmp_path / "data")
    digests = label_session(store)
    sync = HubSync(store, "me/labels")
    assert sync.flush() == len(store.events())
    lines = [json.loads(line) for line in sync.labels_file.read_text().splitlines()]
    assert [line["event_id"] for line in lines] == [e.event_id for e in store.events()]
    assert {line["kind"] for line in lines} == {"label", "delete", "undo"}
    images = {p.name for p in (sync.folder / "images").iterdir()}
    assert images == {store.image_path(d).name for d in digests}
    assert sync.flush() == 0  # the cursor moved: nothing is written twice
    store.add_pair(digests[0], digests[7], "same", "dora")
    assert sync.flush() == 1 and len(sync.labels_file.read_text().splitlines()) == len(lines) + 1
    assert store.meta(CURSOR_KEY) == str(store.events()[-1].seq)


def test_replay_into_an_empty_store_is_exact_and_idempotent(tmp_path: Path):
    source = PairStore(tmp_path / "a")
    label_session(source)
    sync = HubSync(source, "me/labels")
    sync.flush()
    target = PairStore(tmp_path / "b")
    report = replay_folder(target, sync.folder)
    assert report.errors == [] and report.events_applied == len(source.events()) and report.images_added == 8
    assert snapshot(target) == snapshot(source)
    assert [(e.event_id, e.kind, e.undone) for e in target.events()] == [
        (e.event_id, e.kind, e.undone) for e in source.events()
    ]
    again = replay_folder(target, sync.folder)
    assert (again.events_applied, again.events_skipped) == (0, len(source.events()))
    assert snapshot(target) == snapshot(source)
    # replayed events came from the Hub: a sync of the target pushes nothing back
    assert HubSync(target, "me/labels").flush() == 0


def test_replay_reports_bad_lines_and_images_and_applies_the_rest(tmp_path: Path):
    source = PairStore(tmp_path / "a")
    digests = [source.add_image(png(s)) for s in range(3)]
    source.add_pair(digests[0], digests[1], "same")
    source.add_pair(digests[1], digests[2], "different")
    sync = HubSync(source, "me/labels")
    sync.flush()
    with open(sync.labels_file, "a") as handle:
        handle.write("{not json\n")
        handle.write(json.dumps({"event_id": "x1", "kind": "label", "pair_id": "0" * 16, "annotator": "m",
                                 "at": "2024-01-01T00:00:00Z", "image_a": "a" * 64, "image_b": "b" * 64,
                                 "label": "same"}) + "\n")  # fmt: skip
    (sync.folder / "images" / f"{'c' * 64}.png").write_bytes(png(9))  # name and content disagree
    target = PairStore(tmp_path / "b")
    report = replay_folder(target, sync.folder)
    assert report.events_applied == 2 and len(report.errors) == 3
    assert any("not an event" in e for e in report.errors) and any("does not match" in e for e in report.errors)
    assert any("unknown image" in e or "pair id" in e for e in report.errors)
    assert target.all_pairs() == source.all_pairs()


def test_commit_scheduler_pushes_and_a_fresh_store_restores(tmp_path: Path):
    api = FakeHubApi()
    store = PairStore(tmp_path / "a")
    sync = HubSync(store, "me/labels", token="hf_x", every_minutes=60, scheduler_factory=scheduler_over(api))
    sync.start()
    assert api.repos == [{"repo_id": "me/labels", "private": True, "repo_type": "dataset", "exist_ok": True}]
    label_session(store)
    threads = [
        threading.Thread(target=lambda: [store.add_image(png(100 + i)) for i in range(3)]) for _ in range(2)
    ]  # pool-only images are not label data: they stay local
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sync.stop()  # pushes what is left
    names = set(api.files)
    assert any(n.startswith("labels-") and n.endswith(".jsonl") for n in names)
    assert {n for n in names if n.startswith("images/")} == {
        f"images/{store.image_path(d).name}" for e in store.events() for d in (e.image_a, e.image_b) if d
    }
    assert not any(".tmp-" in n for n in names)

    fresh = PairStore(tmp_path / "b")
    report = HubSync(fresh, "me/labels", token="hf_x", download=api.download).restore()
    assert report.errors == [] and report.events_applied == len(store.events())
    assert snapshot(fresh) == snapshot(store)
    assert (tmp_path / "b" / "hub-restore").is_dir()  # downloads stay inside the data dir


def test_restore_survives_an_unreachable_hub(tmp_path: Path):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    store = PairStore(tmp_path)
    report = HubSync(store, "me/labels", download=offline).restore()
    assert report.errors == ["download failed: no network"] and store.counts().total == 0


@pytest.mark.parametrize(
    ("dataset", "env", "enabled"),
    [("me/labels", {"HF_TOKEN": "hf_x"}, True), ("me/labels", {}, False), (None, {"HF_TOKEN": "hf_x"}, False)],
)
def test_enabled_only_with_dataset_and_token(tmp_path: Path, dataset, env, enabled):
    sync = from_settings(Settings(hub_dataset=dataset), PairStore(tmp_path), env=env)
    assert (sync is not None) == enabled
    if enabled:
        assert (sync.repo_id, sync.token) == ("me/labels", "hf_x")
