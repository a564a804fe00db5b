"""Crashes: the real ``python app.py`` killed with SIGKILL, restarted on the same data, and a full disk.

A kill during training must leave the previous model active, no partial version, and the job reported
failed; a kill during a burst of labels must lose none whose call had returned. A disk that fills while
a version is saved must fail the job with a clear message and keep the old version active: on a real
tmpfs of a few MB mounted over ``models/`` where the test may mount one (root), and always in-process
with the weights writer failing with ENOSPC half way.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest

from siamese.store import pair_id_for
from tests.appserver import class_folders_zip, run_app, shape_png

pytestmark = pytest.mark.slow

gradio_client = pytest.importorskip("gradio_client")
Client, handle_file = gradio_client.Client, gradio_client.handle_file


def wait_for(client, predicate, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = client.predict(api_name="/train_status")
        if predicate(status):
            return status
        assert time.monotonic() < deadline, f"{what} after {timeout:.0f} s: {status}"
        time.sleep(0.2)


def kill(server) -> None:
    server.process.kill()  # SIGKILL: no handler runs, nothing is flushed or cleaned up
    server.process.wait(timeout=30)


def version_dirs(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "models").iterdir() if p.is_dir())


def test_sigkill_during_training_keeps_the_previous_model(tmp_path):
    data_dir = tmp_path / "data"
    with run_app(data_dir) as first:
        client = Client(first.url, verbose=False)
        report = client.predict(handle_file(class_folders_zip(tmp_path / "seed.zip", 8)), api_name="/import_dataset")
        assert report["pairs_added"] >= 20
        started = client.predict(epochs=500, mode="full", api_name="/train")
        running = wait_for(client, lambda s: (s["progress"] or 0) > 0 or s["state"] != "running", 60, "no progress")
        assert running["state"] == "running" and running["job_id"] == started["job_id"]
        kill(first)
    assert version_dirs(data_dir) == ["v0"]
    # What a kill in the middle of saving leaves: a half-written temporary version directory.
    partial = data_dir / "models" / ".v1.k1ll3d"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\x00" * 1000)

    with run_app(data_dir) as second:
        client = Client(second.url, verbose=False)
        models = client.predict(api_name="/models")
        assert [(m["version"], m["active"]) for m in models] == [("v0", True)]
        assert client.predict(api_name="/model_info")["model_version"] == "v0"
        status = client.predict(api_name="/train_status")
        assert status["state"] == "failed" and status["job_id"] == started["job_id"]
        assert "interrupted" in status["message"]
        assert not partial.exists()  # swept at start, never listed
        # The store and the registry still work: a new job makes the next version.
        again = client.predict(epochs=2, api_name="/train")
        done = wait_for(client, lambda s: s["state"] != "running", 120, "still training")
        assert done["state"] == "succeeded" and done["job_id"] == again["job_id"], done["message"]
        assert done["model_version"] == "v1"
        assert [m["version"] for m in client.predict(api_name="/models") if m["active"]] == ["v1"]


def test_sigkill_during_a_burst_of_labels_loses_no_returned_label(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    paths = []
    for kind in ("circle", "square"):
        for seed in range(30):
            path = folder / f"{kind}-{seed}.png"
            path.write_bytes(shape_png(kind, 200 + seed))
            paths.append((kind, path))
    pairs = [(paths[i], paths[j]) for i in range(len(paths)) for j in range(i + 1, len(paths))][:600]
    returned: list[tuple[str, Path, Path, str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    data_dir = tmp_path / "data"
    with run_app(data_dir) as first:

        def burst(offset: int) -> None:
            client = Client(first.url, verbose=False)
            for (kind_a, a), (kind_b, b) in pairs[offset::4]:
                if stop.is_set():
                    return
                label = "same" if kind_a == kind_b else "different"
                try:
                    result = client.predict(handle_file(a), handle_file(b), label, api_name="/label")
                except Exception:  # the server died under this call: it never returned
                    return
                with lock:
                    returned.append((result["pair_id"], a, b, label))

        threads = [threading.Thread(target=burst, args=(i,), daemon=True) for i in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while len(returned) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        kill(first)  # with calls in flight on all four clients
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert len(returned) >= 60

    with run_app(data_dir) as second:
        client = Client(second.url, verbose=False)
        export = Path(client.predict(api_name="/export_dataset"))
        with zipfile.ZipFile(export) as archive:
            rows = archive.read("pairs.csv").decode().splitlines()[1:]
            names = set(archive.namelist())
        kept = {}
        for row in rows:
            image_a, image_b, label = row.split(",")[:3]
            assert f"images/{image_a}" in names and f"images/{image_b}" in names  # the files came through too
            kept[pair_id_for(image_a.split(".")[0], image_b.split(".")[0])] = label
        for pair_id, a, b, label in returned:
            assert pair_id == pair_id_for(*(hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)))
            assert kept.get(pair_id) == label, f"returned label {pair_id} lost by the crash"
        attempted = {pair_id_for(*(hashlib.sha256(p.read_bytes()).hexdigest() for _, p in pair)) for pair in pairs}
        assert set(kept) <= attempted  # and nothing else appeared
        counts = client.predict("0" * 16, api_name="/delete_pair")
        assert counts["total"] == len(kept) >= len(returned)


# ----------------------------------------------------------------------------- a full disk


@pytest.fixture
def tiny_models_disk(tmp_path):
    """``data/models`` on a 2.6 MB tmpfs: room for v0 (a 1.7 MB small_cnn), not for v1."""
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2600k", "tmpfs", str(models)], capture_output=True, text=True
    )
    if mounted.returncode != 0 or shutil.which("umount") is None:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not root'}); see the in-process test")
    try:
        yield tmp_path / "data"
    finally:
        subprocess.run(["umount", str(models)], check=False)


def test_disk_full_while_saving_a_version_on_a_real_tmpfs(tiny_models_disk, tmp_path):
    data_dir = tiny_models_disk
    with run_app(data_dir) as app:
        client = Client(app.url, verbose=False)
        assert client.predict(api_name="/model_info")["model_version"] == "v0"
        free = shutil.disk_usage(data_dir / "models").free
        weights = (data_dir / "models" / "v0" / "model.safetensors").stat().st_size
        assert free < weights  # the next version cannot fit
        client.predict(handle_file(class_folders_zip(tmp_path / "seed.zip", 8)), api_name="/import_dataset")
        client.predict(epochs=2, api_name="/train")
        status = wait_for(client, lambda s: s["state"] != "running", 120, "still training")
        assert status["state"] == "failed"
        assert "No space left on device" in status["message"]  # safetensors' own error, as it is
        assert client.predict(api_name="/model_info")["model_version"] == "v0"
        assert [(m["version"], m["active"]) for m in client.predict(api_name="/models")] == [("v0", True)]
        assert version_dirs(data_dir) == ["v0"]  # the half-written temporary directory is gone
        again = client.predict(handle_file(tmp_path / "seed.zip"), api_name="/import_dataset")
        assert again["pairs_added"] == 0 and again["rejected"] == []  # the app still answers, its store intact


def test_disk_full_while_saving_a_version_in_process(tmp_path, monkeypatch):
    import siamese.checkpoint
    from siamese.config import Settings
    from siamese.service import ModelService

    service = ModelService(
        Settings(data_dir=tmp_path / "data", backbone="small_cnn", pretrained=False), device="cpu", background=False
    )
    service.import_dataset(class_folders_zip(tmp_path / "seed.zip", 8))
    real_save = siamese.checkpoint.save_model

    def save_until_full(model, filename, metadata=None):
        real_save(model, filename, metadata=metadata)
        with open(filename, "r+b") as handle:  # half the file made it to disk, then the disk filled
            handle.truncate(Path(filename).stat().st_size // 2)
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(siamese.checkpoint, "save_model", save_until_full)
    service.train(epochs=2)
    status = service.jobs.wait(timeout=120)
    assert status["state"] == "failed"
    assert "could not save model version v1" in status["message"] and "No space left" in status["message"]
    assert service.model_info()["model_version"] == "v0"
    assert [(m["version"], m["active"]) for m in service.models()] == [("v0", True)]
    assert version_dirs(tmp_path / "data") == ["v0"]
    monkeypatch.setattr(siamese.checkpoint, "save_model", real_save)  # space again: the next save works
    service.train(epochs=2)
    assert service.jobs.wait(timeout=120)["state"] == "succeeded"
    assert service.model_info()["model_version"] == "v1"
