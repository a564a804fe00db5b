"""Training in the background: one job at a time, a status snapshot, cancellation, and a record on disk.

The training itself is a plain function (``run(ctx) -> model_version``, see :mod:`siamese.train`); this
module only runs it on a thread, keeps a thread-safe snapshot of how it is going, and writes
``<state_dir>/<job_id>.json`` at every state change (atomically), so a restart can tell what happened.
A job still marked ``running`` when the process starts was killed with its server: it is marked failed.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger(__name__)

STATES = ("idle", "running", "succeeded", "failed", "cancelled")
INTERRUPTED = "interrupted: the server stopped during training"
# What ``JobContext.report`` may change in the snapshot.
_REPORTED = ("progress", "epoch", "epochs", "step", "total_steps", "loss", "metrics", "history", "comparison", "phase")


class JobCancelled(Exception):
    """Raised by a job's ``run`` when it stopped because it was asked to."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _idle() -> dict:
    return {
        "state": "idle",
        "job_id": None,
        "progress": 0.0,
        "epoch": None,
        "loss": None,
        "metrics": {},
        "model_version": None,
        "message": "",
        "history": [],
        "comparison": None,
        "started_at": None,
        "finished_at": None,
    }


class JobContext:
    """What a running job sees: its id, a way to report progress, and whether it should stop."""

    def __init__(self, jobs: TrainingJobs, job_id: str, stop: threading.Event):
        self.job_id = job_id
        self._jobs = jobs
        self._stop = stop

    def report(self, info: dict) -> None:
        """Updates the snapshot from a progress dict (progress, epoch, loss, metrics, history…)."""
        self._jobs._update(self.job_id, {k: v for k, v in info.items() if k in _REPORTED})

    def should_stop(self) -> bool:
        return self._stop.is_set()


class TrainingJobs:
    """Runs training jobs one at a time per process; see the module docstring."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._snapshot = self._recover()

    # ---- what is on disk from earlier processes

    def _recover(self) -> dict:
        """Marks jobs a killed process left running as failed; returns the latest job's record (or idle)."""
        latest: dict | None = None
        for path in sorted(self.state_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                log.warning("ignoring unreadable job record %s", path)
                continue
            if not isinstance(record, dict) or record.get("state") not in STATES:
                continue
            if record["state"] == "running":
                record.update(state="failed", message=INTERRUPTED, finished_at=_now())
                self._write(record)
            if latest is None or (record.get("started_at") or "") >= (latest.get("started_at") or ""):
                latest = record
        return {**_idle(), **latest} if latest else _idle()

    def _write(self, record: dict) -> None:
        """``<job_id>.json``, replaced atomically (a reader sees the old record or the new one)."""
        fd, tmp = tempfile.mkstemp(prefix=".job.", suffix=".tmp", dir=self.state_dir)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle, indent=1, default=str)
            os.replace(tmp, self.state_dir / f"{record['job_id']}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # ---- the public surface

    def start(self, run: Callable[[JobContext], str]) -> str:
        """Starts ``run(ctx)`` on a background thread; returns the job id.

        Raises:
            RuntimeError: a job is already running.
        """
        with self._lock:
            if self._snapshot["state"] == "running":
                raise RuntimeError(
                    f"a training job is already running (job {self._snapshot['job_id']}); "
                    "wait for it to finish or cancel it first"
                )
            job_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
            self._stop = threading.Event()
            self._snapshot = {**_idle(), "state": "running", "job_id": job_id, "started_at": _now()}
            self._write(self._snapshot)
            context = JobContext(self, job_id, self._stop)
            self._thread = threading.Thread(target=self._run, args=(run, context), name=f"train-{job_id}", daemon=True)
            self._thread.start()
        return job_id

    def status(self) -> dict:
        """A copy of the current snapshot (safe to hand out while the job keeps running)."""
        with self._lock:
            return copy.deepcopy(self._snapshot)

    def cancel(self) -> dict:
        """Asks the running job to stop (it does so within a step); a no-op when none runs."""
        with self._lock:
            if self._snapshot["state"] == "running":
                self._stop.set()
                self._snapshot["message"] = "cancelling…"
        return self.status()

    def wait(self, timeout: float | None = None) -> dict:
        """Waits until the current job (if any) finishes, or ``timeout`` seconds pass; returns the status."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.status()

    # ---- the worker thread

    def _update(self, job_id: str, changes: dict) -> None:
        with self._lock:
            if self._snapshot["job_id"] != job_id or self._snapshot["state"] != "running":
                return  # a late report from a job that has already ended
            self._snapshot.update(copy.deepcopy(changes))

    def _finish(self, job_id: str, **changes) -> None:
        with self._lock:
            self._snapshot.update(changes, finished_at=_now())
            self._write(self._snapshot)

    def _run(self, run: Callable[[JobContext], str], context: JobContext) -> None:
        try:
            version = run(context)
        except JobCancelled:
            self._finish(context.job_id, state="cancelled", message="cancelled")
        except Exception as error:
            log.exception("training job %s failed", context.job_id)
            self._finish(context.job_id, state="failed", message=str(error) or type(error).__name__)
        else:
            if version is None:
                if context.should_stop():
                    self._finish(context.job_id, state="cancelled", message="cancelled")
                else:
                    self._finish(context.job_id, state="failed", message="training ended without producing a model")
                return
            late = " (it finished before the cancellation took effect)" if context.should_stop() else ""
            self._finish(
                context.job_id, state="succeeded", progress=1.0, model_version=str(version), message=f"done{late}"
            )
