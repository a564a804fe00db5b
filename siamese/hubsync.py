"""Hub sync: labeled data pushed to a Hugging Face dataset repo, and restored from it at start.

The store's label events are copied into a folder of append-only files that
``huggingface_hub.CommitScheduler`` uploads every few minutes::

    <data_dir>/hub/labels-<start time>-<id>.jsonl   one event per line (one file per app run)
    <data_dir>/hub/images/<sha256>.<ext>            each image an event names, once

Restoring downloads the repo and replays every event into the store, file by file in the order the
runs started. Events carry ids, so a replay is idempotent: restoring into a store that already holds
them changes nothing, and events that came from the Hub are never pushed back. Delivery is at least
once (a crash between writing lines and saving the cursor repeats them; the replay skips repeats).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .config import Settings
from .images import ImageError, content_hash
from .store import LabelEvent, PairStore, write_atomically

log = logging.getLogger(__name__)

HUB_DIR = "hub"  # under the data dir: what the scheduler uploads
RESTORE_DIR = "hub-restore"  # under the data dir: where a restore downloads to
CURSOR_KEY = "hub.cursor"  # store meta: the last event seq written to the hub folder
ALLOW_PATTERNS = ["labels-*.jsonl", "images/*"]
IGNORE_PATTERNS = ["**/.tmp-*", ".tmp-*"]  # half-written files (write_atomically's temporaries)
_BATCH = 2000  # events read from the store per query


@dataclass
class ReplayReport:
    events_applied: int = 0
    events_skipped: int = 0  # already in the store
    images_added: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "events_applied": self.events_applied,
            "events_skipped": self.events_skipped,
            "images_added": self.images_added,
            "errors": list(self.errors),
        }


class HubSync:
    """Pushes a store's labels to a Hub dataset repo periodically and restores them from it.

    Args:
        store: the store to mirror.
        repo_id: the dataset repo (``user/name``); created (private) if missing.
        token: a Hugging Face token with write access.
        every_minutes: how often the scheduler pushes.
        scheduler_factory: builds the scheduler (keyword arguments of ``CommitScheduler`` plus
            ``flush``); tests pass one over a stub ``hf_api``.
        download: fetches the repo into a folder (``huggingface_hub.snapshot_download``'s signature).
    """

    def __init__(
        self,
        store: PairStore,
        repo_id: str,
        *,
        token: str | None = None,
        every_minutes: float = 5.0,
        scheduler_factory: Callable[..., object] | None = None,
        download: Callable[..., str] | None = None,
    ):
        self.store = store
        self.repo_id = repo_id
        self.token = token
        self.every_minutes = every_minutes
        self.folder = store.data_dir / HUB_DIR
        self._scheduler_factory = scheduler_factory or _flushing_scheduler
        self._download = download
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        self.labels_file = self.folder / f"labels-{stamp}-{uuid.uuid4().hex[:8]}.jsonl"  # this run's file
        self._lock = threading.Lock()
        self._scheduler = None

    # -- pushing

    def flush(self, scheduler_lock: threading.Lock | None = None) -> int:
        """Copies local events not yet in the hub folder (and their images) there.

        Args:
            scheduler_lock: held while files change, so a push never sees half a line.

        Returns:
            The number of events written.
        """
        lock = scheduler_lock or (self._scheduler.lock if self._scheduler is not None else None)
        written = 0
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            while True:
                cursor = int(self.store.meta(CURSOR_KEY, "0") or 0)
                events = self.store.events(cursor, local_only=True, limit=_BATCH)
                if not events:
                    return written
                with lock if lock is not None else contextlib.nullcontext():
                    self._copy_images(events)  # before the lines that name them
                    with open(self.labels_file, "a", encoding="utf-8") as handle:
                        handle.writelines(json.dumps(event.to_dict(), sort_keys=True) + "\n" for event in events)
                        handle.flush()
                        os.fsync(handle.fileno())
                self.store.set_meta(CURSOR_KEY, str(events[-1].seq))
                written += len(events)

    def _copy_images(self, events: list[LabelEvent]) -> None:
        for event in events:
            for digest in (event.image_a, event.image_b):
                if digest is None:
                    continue
                source = self.store.image_path(digest)
                target = self.folder / "images" / source.name
                if not target.exists():
                    write_atomically(target, source.read_bytes())

    def start(self) -> None:
        """Starts pushing every ``every_minutes`` (and once now)."""
        if self._scheduler is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._scheduler = self._scheduler_factory(
            repo_id=self.repo_id,
            repo_type="dataset",
            folder_path=self.folder,
            every=self.every_minutes,
            token=self.token,
            private=True,
            allow_patterns=ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
            flush=self.flush,
        )
        log.info("pushing labels to the Hub dataset %s every %s minutes", self.repo_id, self.every_minutes)

    def push_now(self, timeout: float | None = 300) -> None:
        """Flushes and pushes at once, waiting for the commit (e.g. at shutdown)."""
        if self._scheduler is None:
            raise RuntimeError("the Hub sync is not started; call start() first")
        self._scheduler.trigger().result(timeout=timeout)

    def stop(self, *, push: bool = True, timeout: float | None = 300) -> None:
        """Pushes what is left (unless ``push`` is False) and stops the scheduler."""
        if self._scheduler is None:
            return
        try:
            if push:
                self.push_now(timeout)
        finally:
            self._scheduler.stop()
            self._scheduler = None

    # -- restoring

    def restore(self) -> ReplayReport:
        """Downloads the repo and replays it into the store; a missing or unreachable repo is reported,
        not raised, so the app still starts."""
        download = self._download
        if download is None:
            from huggingface_hub import snapshot_download as download
        target = self.store.data_dir / RESTORE_DIR
        try:
            folder = download(
                self.repo_id,
                repo_type="dataset",
                token=self.token,
                local_dir=target,
                allow_patterns=ALLOW_PATTERNS,
            )
        except Exception as error:  # not found, offline, no access: start with what is local
            log.warning("could not restore from the Hub dataset %s: %s", self.repo_id, error)
            return ReplayReport(errors=[f"download failed: {error}"])
        report = replay_folder(self.store, Path(folder))
        log.info("restored from %s: %s", self.repo_id, report.to_dict())
        return report


def replay_folder(store: PairStore, folder: Path) -> ReplayReport:
    """Replays a hub folder (``labels-*.jsonl`` + ``images/``) into ``store``; safe to repeat."""
    report = ReplayReport()
    images = folder / "images"
    for path in sorted(images.iterdir()) if images.is_dir() else []:
        if path.is_symlink() or not path.is_file() or path.name.startswith("."):
            continue
        data = path.read_bytes()
        if path.stem != content_hash(data):
            report.errors.append(f"images/{path.name}: content does not match its name")
            continue
        try:
            report.images_added += store.put_image(data, source="hub")[1]
        except ImageError as error:
            report.errors.append(f"images/{path.name}: {error}")
    waiting: list[tuple[str, LabelEvent]] = []  # undo events whose target comes in a later file
    for path in sorted(folder.glob("labels-*.jsonl")):  # names start with the run's start time
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            where = f"{path.name}:{number}"
            if not line.strip():
                continue
            try:
                event = LabelEvent.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, AttributeError) as error:
                report.errors.append(f"{where}: not an event ({error})")
                continue
            if not _apply(store, event, where, report) and event.kind == "undo":
                waiting.append((where, event))
    for where, event in waiting:
        report.errors = [e for e in report.errors if not e.startswith(f"{where}:")]
        _apply(store, event, where, report)
    return report


def _apply(store: PairStore, event: LabelEvent, where: str, report: ReplayReport) -> bool:
    try:
        applied = store.apply_event(event, origin="hub")
    except ValueError as error:
        report.errors.append(f"{where}: {error}")
        return False
    if applied:
        report.events_applied += 1
    else:
        report.events_skipped += 1
    return True


def _flushing_scheduler(*, flush: Callable[[threading.Lock], int], **kwargs):
    """A ``CommitScheduler`` that copies new events into its folder (under its lock) before each push."""
    from huggingface_hub import CommitScheduler

    class FlushingScheduler(CommitScheduler):
        def push_to_hub(self):
            flush(self.lock)
            return super().push_to_hub()

    return FlushingScheduler(**kwargs)


def from_settings(settings: Settings, store: PairStore, env: Mapping[str, str] | None = None) -> HubSync | None:
    """A :class:`HubSync` when ``SIAMESE_HUB_DATASET`` (``settings.hub_dataset``) and ``HF_TOKEN`` are set."""
    env = os.environ if env is None else env
    token = env.get("HF_TOKEN") or None
    hub_dataset = settings.hub_dataset
    if not hub_dataset:
        return None
    if token is None:
        log.warning("SIAMESE_HUB_DATASET is set but HF_TOKEN is not: labels stay local")
        return None
    return HubSync(store, hub_dataset, token=token)
