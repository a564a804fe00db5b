"""The pair store: every label, its history, and the pool of known images, in SQLite under the data dir.

Layout under ``data_dir``::

    labels.sqlite3                  pairs, label events, the image pool and per-image splits (WAL mode)
    images/<ab>/<sha256>.<ext>      each image once, named by the SHA-256 of its bytes

Every change is one label *event* (``label``, ``delete`` or ``undo``) appended to the ``events`` table in
the same short ``BEGIN IMMEDIATE`` transaction that updates the current state in ``pairs``; the events
are the history (undo, disagreements) and what the Hub sync replays. Each thread uses its own
connection, so many threads and processes can label at once; image files are written atomically and
fsynced before any row names them, so a crash at any point leaves a consistent store.

Splits are by image and sticky: an image gets ``train`` or ``val`` the first time it enters a labeled
pair and keeps it, so no image is ever in both and the split is stable as labels arrive.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

from PIL import Image

from .images import ALLOWED_FORMATS, content_hash, decode_bytes

LABELS = ("same", "different")
SPLITS = ("train", "val", "cross")
DB_NAME = "labels.sqlite3"
IMAGES_DIR = "images"
# File extension per decoded format; the store names files by hash, so this is only for humans and viewers.
EXTENSIONS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "GIF": "gif", "WEBP": "webp", "BMP": "bmp",
              "TIFF": "tif", "PPM": "ppm", "ICO": "ico"}  # fmt: skip
_DIGEST = re.compile(r"[0-9a-f]{64}")
_PAIR_ID = re.compile(r"[0-9a-f]{16}")
_BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for the lock before giving up
_MAX_ANNOTATOR = 200


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Pair:
    """A labeled pair as it stands now. ``split`` is ``train``, ``val`` or ``cross`` (in neither)."""

    pair_id: str
    image_a: str
    image_b: str
    label: str
    annotator: str
    created_at: str  # when the pair was first labeled (ISO-8601, UTC)
    updated_at: str  # when its current label was given
    split: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PairResult:
    pair_id: str
    created: bool  # False when the pair was already labeled and its label was replaced


@dataclass(frozen=True)
class Counts:
    same: int
    different: int
    total: int

    @property
    def balance(self) -> float:
        """Fraction of ``same`` labels (0.5 is balanced); 0.0 for an empty store."""
        return self.same / self.total if self.total else 0.0

    def to_dict(self) -> dict:
        return {"same": self.same, "different": self.different, "total": self.total}


@dataclass(frozen=True)
class LabelEvent:
    """One entry of the history. ``target`` is the undone event for ``undo``; ``created_at`` is set on
    label events that kept an imported creation time."""

    event_id: str
    kind: str  # "label", "delete" or "undo"
    pair_id: str
    annotator: str
    at: str
    image_a: str | None = None
    image_b: str | None = None
    label: str | None = None
    created_at: str | None = None
    target: str | None = None
    undone: bool = False
    seq: int = 0  # position in this store's history (not portable between stores)

    def to_dict(self) -> dict:
        """The portable part (what the Hub sync writes): no ``seq``, no ``undone`` (undo events say that)."""
        data = asdict(self)
        del data["seq"], data["undone"]
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict) -> LabelEvent:
        portable = {f.name for f in fields(cls)} - {"seq", "undone"}
        return cls(**{k: v for k, v in data.items() if k in portable and v is not None})


@dataclass(frozen=True)
class Disagreement:
    """A pair whose annotators' latest labels differ; ``votes`` maps annotator to label."""

    pair_id: str
    image_a: str
    image_b: str
    label: str  # the current label (the most recent one given)
    votes: dict[str, str]


class NewPair(NamedTuple):
    """One row for :meth:`PairStore.add_pairs`; timestamps default to now."""

    image_a: str
    image_b: str
    label: str
    annotator: str = "anonymous"
    created_at: str | datetime | None = None
    updated_at: str | datetime | None = None


# ----------------------------------------------------------------------------- helpers


def pair_id_for(digest_a: str, digest_b: str) -> str:
    """The id of the unordered pair {a, b}: the same two images in either order are one pair."""
    low, high = sorted((digest_a, digest_b))
    return hashlib.sha256(f"{low}:{high}".encode()).hexdigest()[:16]


def parse_label(value: object) -> str:
    """``"same"``/``"different"`` (also accepts booleans and 1/0); raises ValueError otherwise."""
    if isinstance(value, bool):
        return "same" if value else "different"
    text = str(value).strip().lower()
    if text in ("same", "1", "true"):
        return "same"
    if text in ("different", "0", "false"):
        return "different"
    raise ValueError(f"label must be 'same' or 'different', got {value!r}")


def check_digest(digest: object) -> str:
    """Returns ``digest`` if it is an image id (64 lowercase hex chars); raises ValueError otherwise."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"not an image id (expected 64 hex characters of SHA-256): {str(digest)[:80]!r}")
    return digest


def _check_pair_id(pair_id: object) -> str:
    if not isinstance(pair_id, str) or not _PAIR_ID.fullmatch(pair_id):
        raise ValueError(f"not a pair id (expected 16 hex characters): {str(pair_id)[:80]!r}")
    return pair_id


def _check_annotator(annotator: object) -> str:
    name = str(annotator).strip() if annotator is not None else ""
    if not name or len(name) > _MAX_ANNOTATOR or any(ord(c) < 32 for c in name):
        raise ValueError(f"annotator must be a non-empty name of at most {_MAX_ANNOTATOR} printable characters")
    return name


def utc_timestamp(value: str | datetime | date | None = None) -> str:
    """ISO-8601 UTC with microseconds (sorts as text). Naive datetimes and strings are taken as UTC."""
    if value is None:
        moment = datetime.now(timezone.utc)
    elif isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    else:
        text = str(value).strip()
        try:
            moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            raise ValueError(f"not an ISO-8601 time: {text[:60]!r} (e.g. 2024-05-01T12:00:00+00:00)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _end_bound(value: str | datetime | date) -> str:
    """``until`` is exclusive, except that a bare date means the whole of that day."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return utc_timestamp(value + timedelta(days=1))
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
        return utc_timestamp(date.fromisoformat(value.strip()) + timedelta(days=1))
    return utc_timestamp(value)


def image_extension(data: bytes) -> str:
    """File extension for already validated image bytes (reads the header only)."""
    with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as image:
        return EXTENSIONS.get(image.format or "", "img")


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return  # directories cannot be opened for fsync on Windows; NTFS journals the rename
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that a reader (or a crash) sees the old file or the whole new one."""
    created = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    if created:
        _fsync_dir(path.parent.parent)


# ----------------------------------------------------------------------------- schema


def _migration_1(conn: sqlite3.Connection) -> None:
    statements = [
        """CREATE TABLE images (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,          -- pool order: oldest first
            digest TEXT NOT NULL UNIQUE CHECK (length(digest) = 64),
            ext TEXT NOT NULL,
            source TEXT NOT NULL,                            -- upload, score, label, import, hub...
            width INTEGER NOT NULL,
            height INTEGER NOT NULL,
            added_at TEXT NOT NULL,
            split TEXT CHECK (split IN ('train', 'val'))     -- set once, when it first enters a pair
        )""",
        """CREATE TABLE pairs (
            pair_id TEXT PRIMARY KEY,
            image_a TEXT NOT NULL REFERENCES images (digest),
            image_b TEXT NOT NULL REFERENCES images (digest),
            label TEXT NOT NULL CHECK (label IN ('same', 'different')),
            annotator TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            split TEXT NOT NULL CHECK (split IN ('train', 'val', 'cross')),
            CHECK (image_a <> image_b)
        )""",
        "CREATE INDEX pairs_by_time ON pairs (updated_at, pair_id)",
        "CREATE INDEX pairs_by_label ON pairs (label, updated_at, pair_id)",
        "CREATE INDEX pairs_by_annotator ON pairs (annotator, updated_at, pair_id)",
        "CREATE INDEX pairs_by_split ON pairs (split, created_at, pair_id)",
        "CREATE INDEX pairs_by_image_a ON pairs (image_a)",
        "CREATE INDEX pairs_by_image_b ON pairs (image_b)",
        """CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            event_id TEXT NOT NULL UNIQUE,                   -- portable: replays are idempotent
            kind TEXT NOT NULL CHECK (kind IN ('label', 'delete', 'undo')),
            pair_id TEXT NOT NULL,
            image_a TEXT,
            image_b TEXT,
            label TEXT CHECK (label IN ('same', 'different')),
            annotator TEXT NOT NULL,
            at TEXT NOT NULL,
            created_at TEXT,                                 -- an imported pair's original creation time
            target TEXT,                                     -- undo: the event_id undone
            undone INTEGER NOT NULL DEFAULT 0,
            origin TEXT NOT NULL DEFAULT 'local'             -- 'hub' for replayed events (not pushed back)
        )""",
        "CREATE INDEX events_by_pair ON events (pair_id, kind, seq)",
        "CREATE INDEX events_by_annotator ON events (annotator, kind, undone, seq)",
        # Counts kept by triggers in the same transaction: O(1) however many pairs there are.
        "CREATE TABLE label_counts (label TEXT PRIMARY KEY, n INTEGER NOT NULL)",
        "INSERT INTO label_counts VALUES ('same', 0), ('different', 0)",
        """CREATE TRIGGER pairs_count_insert AFTER INSERT ON pairs BEGIN
            UPDATE label_counts SET n = n + 1 WHERE label = NEW.label; END""",
        """CREATE TRIGGER pairs_count_delete AFTER DELETE ON pairs BEGIN
            UPDATE label_counts SET n = n - 1 WHERE label = OLD.label; END""",
        """CREATE TRIGGER pairs_count_update AFTER UPDATE OF label ON pairs BEGIN
            UPDATE label_counts SET n = n - 1 WHERE label = OLD.label;
            UPDATE label_counts SET n = n + 1 WHERE label = NEW.label; END""",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ]
    for statement in statements:
        conn.execute(statement)


# Append only: migration i takes user_version i to i + 1. Never edit one that has shipped.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migration_1]
SCHEMA_VERSION = len(MIGRATIONS)


# ----------------------------------------------------------------------------- the store

_PAIR_COLUMNS = "pair_id, image_a, image_b, label, annotator, created_at, updated_at, split"
_EVENT_COLUMNS = "event_id, kind, pair_id, annotator, at, image_a, image_b, label, created_at, target, undone, seq"


_DISAGREEMENTS = """WITH live AS (
    SELECT e.pair_id, e.annotator, e.label, e.seq FROM events e
    WHERE e.kind = 'label' AND e.undone = 0
      AND e.seq > coalesce((SELECT max(d.seq) FROM events d
                            WHERE d.pair_id = e.pair_id AND d.kind = 'delete'), 0)),
latest AS (
    SELECT pair_id, annotator, label,
           row_number() OVER (PARTITION BY pair_id, annotator ORDER BY seq DESC) AS rank
    FROM live),
votes AS (SELECT pair_id, annotator, label FROM latest WHERE rank = 1)
SELECT p.pair_id, p.image_a, p.image_b, p.label, v.annotator, v.label
FROM votes v JOIN pairs p ON p.pair_id = v.pair_id
WHERE v.pair_id IN (SELECT pair_id FROM votes GROUP BY pair_id HAVING count(DISTINCT label) > 1)
ORDER BY p.updated_at DESC, p.pair_id, v.annotator"""


def _pair(row: tuple) -> Pair:
    return Pair(*row)


def _event(row: tuple) -> LabelEvent:
    values = list(row)
    values[10] = bool(values[10])
    return LabelEvent(*values)


class PairStore:
    """Labeled pairs and the image pool under ``data_dir``; safe to share between threads and processes.

    Args:
        data_dir: where ``labels.sqlite3`` and ``images/`` live (created if missing).
        val_percent: share of new images (by pair hash) that go to the validation split.
    """

    def __init__(self, data_dir: Path | str, val_percent: int = 20):
        if not 0 <= int(val_percent) <= 100:
            raise ValueError(f"val_percent must be between 0 and 100, got {val_percent}")
        self.data_dir = Path(data_dir)
        self.val_percent = int(val_percent)
        self.db_path = self.data_dir / DB_NAME
        self.images_dir = self.data_dir / IMAGES_DIR
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[tuple[int, sqlite3.Connection]] = []
        self._migrate()

    def __repr__(self) -> str:
        return f"PairStore({str(self.data_dir)!r}, val_percent={self.val_percent})"

    def __enter__(self) -> PairStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- connections and transactions

    def _connect(self) -> sqlite3.Connection:
        # check_same_thread=False only so close() can close every thread's connection; each thread
        # still uses its own (see _conn).
        conn = sqlite3.connect(self.db_path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)  # fmt: skip
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        # FULL: the WAL is fsynced at each commit, so a returned label survives a power cut too
        # (about 0.3 ms on an SSD; NORMAL would survive only a process crash).
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (a fresh one after a fork: SQLite connections must not cross one)."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = self._connect()
            local.conn, local.pid = conn, os.getpid()
            with self._lock:
                self._connections.append((os.getpid(), conn))
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction; takes the write lock up front so it never fails half way."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Closes this process's connections; the store reopens them if used again."""
        with self._lock:
            mine = [conn for pid, conn in self._connections if pid == os.getpid()]
            self._connections = [(pid, conn) for pid, conn in self._connections if pid != os.getpid()]
        for conn in mine:
            conn.close()
        self._local = threading.local()

    def _migrate(self) -> None:
        conn = self._conn()
        for attempt in range(100):
            try:  # switching to WAL needs a moment alone with the file; another process may be opening it
                conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError:
                if attempt == 99:
                    raise
                time.sleep(0.05)
        with self._write() as conn:  # re-read under the write lock: concurrent openers migrate once
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.db_path} has schema version {version}, newer than this code ({SCHEMA_VERSION}); "
                    "upgrade siamese to open it"
                )
            for number in range(version, SCHEMA_VERSION):
                MIGRATIONS[number](conn)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @property
    def schema_version(self) -> int:
        return self._conn().execute("PRAGMA user_version").fetchone()[0]

    # -- images and the pool

    def put_image(self, data: bytes, *, source: str = "upload") -> tuple[str, bool]:
        """:meth:`add_image`, also saying whether the image was new to the store."""
        data = bytes(data)
        digest = content_hash(data)
        if self.has_image(digest):  # known bytes were validated when they came in
            return digest, False
        image = decode_bytes(data)  # ImageError propagates: nothing is stored
        ext = image_extension(data)
        path = self._file_for(digest, ext)
        if not (path.is_file() and path.stat().st_size == len(data)):  # content-addressed: same name, same bytes
            write_atomically(path, data)
        with self._write() as conn:  # the file is durable before any row names it
            cursor = conn.execute(
                "INSERT OR IGNORE INTO images (digest, ext, source, width, height, added_at) VALUES (?, ?, ?, ?, ?, ?)",
                (digest, ext, str(source)[:40], image.width, image.height, utc_timestamp()),
            )
        return digest, cursor.rowcount == 1

    def add_image(self, data: bytes, *, source: str = "upload") -> str:
        """Validates (``ImageError`` propagates), stores the bytes once and adds them to the pool.

        Returns:
            The image's id: the SHA-256 hex digest of its bytes.
        """
        return self.put_image(data, source=source)[0]

    def has_image(self, digest: str) -> bool:
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            return False
        return self._conn().execute("SELECT 1 FROM images WHERE digest = ?", (digest,)).fetchone() is not None

    def _file_for(self, digest: str, ext: str) -> Path:
        return self.images_dir / digest[:2] / f"{digest}.{ext}"

    def image_path(self, digest: str) -> Path:
        """The stored file of an image; KeyError for an unknown one, ValueError for a malformed id."""
        check_digest(digest)
        row = self._conn().execute("SELECT ext FROM images WHERE digest = ?", (digest,)).fetchone()
        if row is None:
            raise KeyError(f"no image {digest[:12]}… in the store")
        return self._file_for(digest, row[0])

    def image_bytes(self, digest: str) -> bytes:
        return self.image_path(digest).read_bytes()

    def image_split(self, digest: str) -> str | None:
        """``train``/``val`` once the image has been in a labeled pair, else None."""
        row = self._conn().execute("SELECT split FROM images WHERE digest = ?", (check_digest(digest),)).fetchone()
        if row is None:
            raise KeyError(f"no image {digest[:12]}… in the store")
        return row[0]

    def adopt_splits(self, splits: dict[str, str]) -> int:
        """Gives images a known split (``train``/``val``, e.g. from an export) unless they have one.

        Returns:
            How many images took the given split.
        """
        rows = [(split, check_digest(digest)) for digest, split in splits.items() if split in ("train", "val")]
        with self._write() as conn:
            return sum(
                conn.execute("UPDATE images SET split = ? WHERE digest = ? AND split IS NULL", row).rowcount
                for row in rows
            )

    def pool(self, limit: int | None = None, offset: int = 0) -> list[str]:
        """Image ids of the pool (everything scored, labeled or imported), oldest first."""
        rows = self._conn().execute(
            "SELECT digest FROM images ORDER BY seq LIMIT ? OFFSET ?",
            (-1 if limit is None else int(limit), int(offset)),
        )
        return [row[0] for row in rows]

    def pool_size(self) -> int:
        return self._conn().execute("SELECT count(*) FROM images").fetchone()[0]

    # -- labeling

    def add_pair(
        self,
        digest_a: str,
        digest_b: str,
        label: str,
        annotator: str = "anonymous",
        *,
        at: str | datetime | None = None,
    ) -> PairResult:
        """Labels the pair {a, b}; labeling it again (either order) replaces the label and keeps the history.

        Raises:
            ValueError: a bad label, a malformed or unknown image id, or the same image on both sides.
        """
        item = NewPair(digest_a, digest_b, label, annotator, None, at)
        with self._write() as conn:
            result = self._label(conn, *self._checked(item))
        assert result is not None
        return result

    def add_pairs(self, items: Iterable[NewPair | tuple], *, replace: bool = True) -> list[PairResult | None]:
        """Labels many pairs in one transaction (imports, benchmarks); all or nothing.

        Args:
            items: :class:`NewPair` rows (or tuples in its field order).
            replace: when False, pairs already labeled are left alone and give None.
        """
        checked = [self._checked(NewPair(*item)) for item in items]
        with self._write() as conn:
            return [self._label(conn, *args, replace=replace) for args in checked]

    def _checked(self, item: NewPair) -> tuple[str, str, str, str, str, str | None]:
        a, b = check_digest(item.image_a), check_digest(item.image_b)
        if a == b:
            raise ValueError("a pair needs two different images; both sides are the same image")
        updated = utc_timestamp(item.updated_at)
        created = utc_timestamp(item.created_at) if item.created_at is not None else None
        return a, b, parse_label(item.label), _check_annotator(item.annotator), updated, created

    def _label(
        self,
        conn: sqlite3.Connection,
        a: str,
        b: str,
        label: str,
        annotator: str,
        at: str,
        created_at: str | None,
        *,
        replace: bool = True,
        event_id: str | None = None,
        origin: str = "local",
    ) -> PairResult | None:
        pair_id = pair_id_for(a, b)
        exists = conn.execute("SELECT 1 FROM pairs WHERE pair_id = ?", (pair_id,)).fetchone() is not None
        if exists and not replace:
            return None
        known = conn.execute("SELECT count(*) FROM images WHERE digest IN (?, ?)", (a, b)).fetchone()[0]
        if known < 2:
            missing = next(
                d for d in (a, b) if not conn.execute("SELECT 1 FROM images WHERE digest = ?", (d,)).fetchone()
            )
            raise ValueError(f"unknown image {missing[:12]}…: add it to the store (add_image) before labeling")
        conn.execute(
            "INSERT INTO events (event_id, kind, pair_id, image_a, image_b, label, annotator, at, created_at, origin) "
            "VALUES (?, 'label', ?, ?, ?, ?, ?, ?, ?, ?)",
            (event_id or uuid.uuid4().hex, pair_id, a, b, label, annotator, at, None if exists else created_at, origin),
        )
        if exists:
            conn.execute(
                "UPDATE pairs SET label = ?, annotator = ?, updated_at = ? WHERE pair_id = ?",
                (label, annotator, at, pair_id),
            )
            return PairResult(pair_id, False)
        split = self._assign_split(conn, pair_id, a, b)
        conn.execute(
            f"INSERT INTO pairs ({_PAIR_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (pair_id, a, b, label, annotator, created_at or at, at, split),
        )
        return PairResult(pair_id, True)

    def _assign_split(self, conn: sqlite3.Connection, pair_id: str, a: str, b: str) -> str:
        """Sticky per-image splits: new images follow their partner, or the pair's hash if both are new."""
        split_a, split_b = (
            conn.execute("SELECT split FROM images WHERE digest = ?", (d,)).fetchone()[0] for d in (a, b)
        )
        if split_a is None and split_b is None:
            bucket = int(hashlib.sha256(pair_id.encode()).hexdigest(), 16) % 100
            split_a = split_b = "val" if bucket < self.val_percent else "train"
            conn.execute("UPDATE images SET split = ? WHERE digest IN (?, ?)", (split_a, a, b))
        elif split_a is None:
            split_a = split_b
            conn.execute("UPDATE images SET split = ? WHERE digest = ?", (split_a, a))
        elif split_b is None:
            split_b = split_a
            conn.execute("UPDATE images SET split = ? WHERE digest = ?", (split_b, b))
        return split_a if split_a == split_b else "cross"

    def relabel(self, pair_id: str, label: str, annotator: str = "anonymous") -> None:
        """Gives an existing pair a new label (kept in its history); ValueError for an unknown pair."""
        label, annotator = parse_label(label), _check_annotator(annotator)
        with self._write() as conn:
            row = conn.execute("SELECT image_a, image_b FROM pairs WHERE pair_id = ?", (_check_pair_id(pair_id),))
            images = row.fetchone()
            if images is None:
                raise ValueError(f"no pair {pair_id} in the store (it may have been deleted)")
            self._label(conn, images[0], images[1], label, annotator, utc_timestamp(), None)

    def delete_pair(self, pair_id: str, annotator: str = "anonymous") -> bool:
        """Removes a pair (its history stays). False if there was no such pair."""
        _check_pair_id(pair_id)
        with self._write() as conn:
            return self._delete(conn, pair_id, _check_annotator(annotator), utc_timestamp())

    def _delete(self, conn, pair_id: str, annotator: str, at: str, event_id=None, origin="local") -> bool:
        if conn.execute("DELETE FROM pairs WHERE pair_id = ?", (pair_id,)).rowcount == 0:
            return False
        conn.execute(
            "INSERT INTO events (event_id, kind, pair_id, annotator, at, origin) VALUES (?, 'delete', ?, ?, ?, ?)",
            (event_id or uuid.uuid4().hex, pair_id, annotator, at, origin),
        )
        return True

    def undo_last(self, annotator: str) -> str | None:
        """Takes back ``annotator``'s most recent label that still counts, restoring the label before it.

        Returns:
            The affected pair's id (now deleted if that label had created it), or None if nothing to undo.
        """
        annotator = _check_annotator(annotator)
        with self._write() as conn:
            row = conn.execute(
                """SELECT e.event_id, e.pair_id FROM events e
                   WHERE e.annotator = ? AND e.kind = 'label' AND e.undone = 0
                     AND NOT EXISTS (SELECT 1 FROM events d
                                     WHERE d.pair_id = e.pair_id AND d.kind = 'delete' AND d.seq > e.seq)
                   ORDER BY e.seq DESC LIMIT 1""",
                (annotator,),
            ).fetchone()
            if row is None:
                return None
            self._undo(conn, row[0], annotator, utc_timestamp())
            return row[1]

    def _undo(self, conn, target: str, annotator: str, at: str, event_id=None, origin="local") -> None:
        found = conn.execute("SELECT pair_id FROM events WHERE event_id = ? AND kind = 'label'", (target,)).fetchone()
        if found is None:
            raise ValueError(f"cannot undo {target}: no such label event")
        pair_id = found[0]
        conn.execute("UPDATE events SET undone = 1 WHERE event_id = ?", (target,))
        conn.execute(
            "INSERT INTO events (event_id, kind, pair_id, annotator, at, target, origin) "
            "VALUES (?, 'undo', ?, ?, ?, ?, ?)",
            (event_id or uuid.uuid4().hex, pair_id, annotator, at, target, origin),
        )
        self._settle(conn, pair_id)

    def _settle(self, conn: sqlite3.Connection, pair_id: str) -> None:
        """Re-derives a pair from its live label events: those not undone, after its last delete."""
        live = conn.execute(
            """SELECT label, annotator, at, created_at FROM events
               WHERE pair_id = ? AND kind = 'label' AND undone = 0
                 AND seq > coalesce((SELECT max(seq) FROM events WHERE pair_id = ? AND kind = 'delete'), 0)
               ORDER BY seq""",
            (pair_id, pair_id),
        ).fetchall()
        if not live:
            conn.execute("DELETE FROM pairs WHERE pair_id = ?", (pair_id,))
            return
        first, last = live[0], live[-1]
        conn.execute(
            "UPDATE pairs SET label = ?, annotator = ?, updated_at = ?, created_at = ? WHERE pair_id = ?",
            (last[0], last[1], last[2], first[3] or first[2], pair_id),
        )

    # -- events (history, Hub sync)

    def history(self, pair_id: str) -> list[LabelEvent]:
        """Every event of one pair, oldest first (undone labels included, flagged)."""
        rows = self._conn().execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE pair_id = ? ORDER BY seq", (_check_pair_id(pair_id),)
        )
        return [_event(row) for row in rows]

    def events(self, after_seq: int = 0, *, local_only: bool = False, limit: int | None = None) -> list[LabelEvent]:
        """Events with ``seq > after_seq`` in order; ``local_only`` leaves out those replayed from the Hub."""
        origin = "AND origin <> 'hub'" if local_only else ""
        rows = self._conn().execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE seq > ? {origin} ORDER BY seq LIMIT ?",
            (int(after_seq), -1 if limit is None else int(limit)),
        )
        return [_event(row) for row in rows]

    def last_event_seq(self) -> int:
        """The ``seq`` of the newest event (0 when there is none): one look-up of the primary key's end."""
        row = self._conn().execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        return int(row[0])

    def apply_event(self, event: LabelEvent, *, origin: str = "hub") -> bool:
        """Replays one portable event (see :meth:`LabelEvent.to_dict`); False if it was already applied.

        Raises:
            ValueError: a malformed event, or a label event naming an image the store lacks.
        """
        if not isinstance(event.event_id, str) or not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", event.event_id):
            raise ValueError(f"malformed event id {str(event.event_id)[:80]!r}")
        at, annotator = utc_timestamp(event.at), _check_annotator(event.annotator)
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM events WHERE event_id = ?", (event.event_id,)).fetchone():
                return False
            if event.kind == "label":
                a, b, label, annotator, at, created = self._checked(
                    NewPair(event.image_a, event.image_b, event.label, annotator, event.created_at, at)
                )
                if pair_id_for(a, b) != event.pair_id:
                    raise ValueError(f"event {event.event_id}: pair id does not match its images")
                self._label(conn, a, b, label, annotator, at, created, event_id=event.event_id, origin=origin)
            elif event.kind == "delete":
                pair_id = _check_pair_id(event.pair_id)
                if not self._delete(conn, pair_id, annotator, at, event.event_id, origin):
                    conn.execute(  # keep it: the history must match the source's
                        "INSERT INTO events (event_id, kind, pair_id, annotator, at, origin) "
                        "VALUES (?, 'delete', ?, ?, ?, ?)",
                        (event.event_id, pair_id, annotator, at, origin),
                    )
            elif event.kind == "undo":
                self._undo(conn, str(event.target), annotator, at, event.event_id, origin)
            else:
                raise ValueError(f"unknown event kind {event.kind!r}")
        return True

    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as conn:
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?",
                         (key, value, value))  # fmt: skip

    # -- reading pairs

    def get_pair(self, pair_id: str) -> Pair | None:
        if not isinstance(pair_id, str) or not _PAIR_ID.fullmatch(pair_id):
            return None
        row = self._conn().execute(f"SELECT {_PAIR_COLUMNS} FROM pairs WHERE pair_id = ?", (pair_id,)).fetchone()
        return None if row is None else _pair(row)

    def list_pairs(
        self,
        *,
        label: str | None = None,
        annotator: str | None = None,
        since: str | datetime | date | None = None,
        until: str | datetime | date | None = None,
        offset: int = 0,
        limit: int | None = 50,
    ) -> list[Pair]:
        """Pairs, most recently labeled first, filtered by current label, annotator and label time.

        Args:
            since: inclusive lower bound on the time of the current label.
            until: exclusive upper bound; a bare date (``"2024-05-01"``) includes that whole day.
            limit: page size (None: everything after ``offset``).
        """
        where, params = [], []
        if label is not None:
            where.append("label = ?")
            params.append(parse_label(label))
        if annotator is not None:
            where.append("annotator = ?")
            params.append(str(annotator))
        if since is not None:
            where.append("updated_at >= ?")
            params.append(utc_timestamp(since))
        if until is not None:
            where.append("updated_at < ?")
            params.append(_end_bound(until))
        if int(offset) < 0 or (limit is not None and int(limit) < 0):
            raise ValueError("offset and limit must not be negative")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._conn().execute(
            f"SELECT {_PAIR_COLUMNS} FROM pairs {clause} ORDER BY updated_at DESC, pair_id DESC LIMIT ? OFFSET ?",
            (*params, -1 if limit is None else int(limit), int(offset)),
        )
        return [_pair(row) for row in rows]

    def counts(self) -> Counts:
        """Current labels by class (the class balance is ``Counts.balance``)."""
        found = dict(self._conn().execute("SELECT label, n FROM label_counts").fetchall())
        same, different = found.get("same", 0), found.get("different", 0)
        return Counts(same=same, different=different, total=same + different)

    def split_counts(self) -> dict[str, int]:
        """Pairs per split: ``train``, ``val`` and ``cross``."""
        found = dict(self._conn().execute("SELECT split, count(*) FROM pairs GROUP BY split").fetchall())
        return {split: found.get(split, 0) for split in SPLITS}

    def annotators(self) -> dict[str, int]:
        """Current labels per annotator."""
        return dict(self._conn().execute("SELECT annotator, count(*) FROM pairs GROUP BY annotator").fetchall())

    def disagreements(self) -> list[Disagreement]:
        """Pairs whose annotators' latest live labels differ, most recently labeled first."""
        rows = self._conn().execute(_DISAGREEMENTS).fetchall()
        found: dict[str, Disagreement] = {}
        for pair_id, a, b, label, who, vote in rows:
            found.setdefault(pair_id, Disagreement(pair_id, a, b, label, {})).votes[who] = vote
        return list(found.values())

    def pairs_for_split(self, split: str) -> list[Pair]:
        """Pairs whose two images are both in ``split`` (``train``, ``val``, or ``cross`` for the rest)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
        rows = self._conn().execute(
            f"SELECT {_PAIR_COLUMNS} FROM pairs WHERE split = ? ORDER BY created_at, pair_id", (split,)
        )
        return [_pair(row) for row in rows]

    def all_pairs(self) -> list[Pair]:
        """Every pair, oldest first."""
        rows = self._conn().execute(f"SELECT {_PAIR_COLUMNS} FROM pairs ORDER BY created_at, pair_id")
        return [_pair(row) for row in rows]

    def pairs_with_image(self, digest: str) -> list[Pair]:
        """The labeled pairs an image is in (e.g. for a search result's label hint)."""
        rows = self._conn().execute(
            f"SELECT {_PAIR_COLUMNS} FROM pairs WHERE image_a = ? UNION SELECT {_PAIR_COLUMNS} FROM pairs "
            "WHERE image_b = ? ORDER BY updated_at DESC",
            (check_digest(digest), digest),
        )
        return [_pair(row) for row in rows]

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``"ok"`` for a sound database."""
        return self._conn().execute("PRAGMA integrity_check").fetchone()[0]
