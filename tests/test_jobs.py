"""Background training jobs: one at a time, status transitions, failures, cancellation, crash recovery."""

from __future__ import annotations

import json
import threading
import time

import pytest

from siamese.jobs import INTERRUPTED, JobCancelled, JobContext, TrainingJobs


def _gated(gate: threading.Event, version: str = "v1"):
    """A job that reports progress, then waits for ``gate`` (or a cancel) before finishing."""

    def run(ctx: JobContext) -> str | None:
        ctx.report({"progress": 0.5, "epoch": 2, "loss": 0.25, "history": [{"epoch": 1, "loss": 0.3}], "junk": 1})
        while not gate.wait(0.01):
            if ctx.should_stop():
                raise JobCancelled
        return version

    return run


def test_fresh_state_is_idle(tmp_path):
    status = TrainingJobs(tmp_path).status()
    assert status["state"] == "idle" and status["job_id"] is None
    assert {
        "progress",
        "epoch",
        "loss",
        "metrics",
        "model_version",
        "message",
        "history",
        "comparison",
    } <= status.keys()


def test_status_transitions_and_record_on_disk(tmp_path):
    jobs = TrainingJobs(tmp_path)
    gate = threading.Event()
    job_id = jobs.start(_gated(gate))
    deadline = time.time() + 5
    while jobs.status()["progress"] != 0.5 and time.time() < deadline:
        time.sleep(0.01)
    running = jobs.status()
    assert running["state"] == "running" and running["job_id"] == job_id
    assert running["epoch"] == 2 and running["loss"] == 0.25 and running["history"] == [{"epoch": 1, "loss": 0.3}]
    assert "junk" not in running
    assert json.loads((tmp_path / f"{job_id}.json").read_text())["state"] == "running"
    running["history"].append("mutated")  # a snapshot is a copy
    assert len(jobs.status()["history"]) == 1
    gate.set()
    done = jobs.wait(timeout=5)
    assert done["state"] == "succeeded" and done["model_version"] == "v1" and done["progress"] == 1.0
    assert done["finished_at"] is not None
    on_disk = json.loads((tmp_path / f"{job_id}.json").read_text())
    assert on_disk["state"] == "succeeded" and on_disk["model_version"] == "v1"
    assert not list(tmp_path.glob(".job.*"))  # no temporary files left


def test_one_job_at_a_time(tmp_path):
    jobs = TrainingJobs(tmp_path)
    gate = threading.Event()
    first = jobs.start(_gated(gate))
    with pytest.raises(RuntimeError, match="already running"):
        jobs.start(_gated(gate))
    gate.set()
    jobs.wait(timeout=5)
    second = jobs.start(_gated(gate, "v2"))  # once finished, another may start
    assert second != first
    assert jobs.wait(timeout=5)["model_version"] == "v2"


def test_failure_gives_the_message(tmp_path, caplog):
    def run(ctx):
        raise ValueError("too few labels to train: label 2 more 'same' pair(s)")

    jobs = TrainingJobs(tmp_path)
    jobs.start(run)
    status = jobs.wait(timeout=5)
    assert status["state"] == "failed"
    assert status["message"] == "too few labels to train: label 2 more 'same' pair(s)"
    assert "Traceback" not in status["message"]
    assert any("failed" in record.message for record in caplog.records)  # logged with the traceback


def test_cancel(tmp_path):
    jobs = TrainingJobs(tmp_path)
    job_id = jobs.start(_gated(threading.Event()))
    jobs.cancel()
    status = jobs.wait(timeout=5)
    assert status["state"] == "cancelled" and status["model_version"] is None
    assert json.loads((tmp_path / f"{job_id}.json").read_text())["state"] == "cancelled"
    assert jobs.cancel()["state"] == "cancelled"  # nothing running: a no-op


def test_run_returning_none_after_cancel_is_cancelled(tmp_path):
    def run(ctx):
        while not ctx.should_stop():
            time.sleep(0.01)
        return None  # like train_model's result.cancelled: no model

    jobs = TrainingJobs(tmp_path)
    jobs.start(run)
    jobs.cancel()
    assert jobs.wait(timeout=5)["state"] == "cancelled"


def test_crash_recovery_marks_running_job_failed(tmp_path):
    record = {"state": "running", "job_id": "20240101T000000-abc123", "progress": 0.4, "started_at": "2024-01-01"}
    (tmp_path / "20240101T000000-abc123.json").write_text(json.dumps(record))
    (tmp_path / "garbage.json").write_text("{not json")
    jobs = TrainingJobs(tmp_path)
    status = jobs.status()
    assert status["state"] == "failed" and status["message"] == INTERRUPTED
    assert status["job_id"] == "20240101T000000-abc123"
    on_disk = json.loads((tmp_path / "20240101T000000-abc123.json").read_text())
    assert on_disk["state"] == "failed" and on_disk["message"] == INTERRUPTED
    gate = threading.Event()
    gate.set()
    jobs.start(_gated(gate))  # and a new job can start
    assert jobs.wait(timeout=5)["state"] == "succeeded"


def test_latest_finished_job_is_shown_after_restart(tmp_path):
    jobs = TrainingJobs(tmp_path)
    gate = threading.Event()
    gate.set()
    job_id = jobs.start(_gated(gate, "v7"))
    jobs.wait(timeout=5)
    again = TrainingJobs(tmp_path).status()
    assert again["state"] == "succeeded" and again["job_id"] == job_id and again["model_version"] == "v7"


def test_with_train_model(tmp_path):
    """The real trainer inside a job: progress flows into the status, cancel stops it."""
    from benchmarks.digits import load_digits_images, sample_pairs, split_indices
    from siamese.train import TrainConfig, train_model
    from tests.test_train import tiny_model

    digits = load_digits_images()
    images, val_images = split_indices(len(digits), [200, 60])
    train, val = sample_pairs(digits, images, 60, seed=1), sample_pairs(digits, val_images, 20, seed=2, prefix="v")

    def run(ctx: JobContext) -> str | None:
        config = TrainConfig(epochs=500, batch_size=8, mode="full")
        result = train_model(
            tiny_model(), train, val, digits.load_image, config, on_progress=ctx.report, should_stop=ctx.should_stop
        )
        return None if result.cancelled else "v1"

    jobs = TrainingJobs(tmp_path)
    jobs.start(run)
    deadline = time.time() + 10
    while (jobs.status()["epoch"] or 0) < 2 and time.time() < deadline:
        time.sleep(0.02)
    status = jobs.status()
    assert status["epoch"] >= 2 and 0 < status["progress"] < 1 and status["metrics"]["auc"] is not None
    asked = time.perf_counter()
    jobs.cancel()
    assert jobs.wait(timeout=5)["state"] == "cancelled"
    assert time.perf_counter() - asked < 2.0
