"""Datasets in and out of a :class:`~siamese.store.PairStore`: export zips, and imports of zips or folders.

Two layouts are read, from a zip or a directory (one enclosing folder is allowed):

* the export format, ``images/<sha256>.<ext>`` + ``pairs.csv`` (``image_a,image_b,label,annotator,
  created_at[,updated_at]``, image columns naming files in ``images/``) + ``metadata.json``;
* class folders, ``class_name/*.jpg``: the images join the pool and balanced, seeded same/different
  pairs are generated from the classes.

Archives are untrusted. Nothing is extracted: each entry is checked (name, type, declared sizes), read
into memory with a hard cap whatever its header says, decoded, and only then handed to the store,
which is the only thing that writes. Each refused entry is reported with its reason; the rest is
imported.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import random
import re
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path, PurePosixPath
from typing import NamedTuple
from zlib import error as zlib_error

from .images import MAX_BYTES, ImageError, content_hash
from .store import NewPair, PairStore, pair_id_for, parse_label, utc_timestamp

FORMAT_NAME = "siamese-pairs"
FORMAT_VERSION = 1
PAIRS_CSV = "pairs.csv"
METADATA_JSON = "metadata.json"
CSV_COLUMNS = ("image_a", "image_b", "label", "annotator", "created_at", "updated_at")
# Names that are archive formats: never opened, even if they would decode (no nested archives).
ARCHIVE_SUFFIXES = {".zip", ".jar", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".7z", ".rar", ".whl", ".apk"}
ARCHIVE_MAGIC = (b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b", b"7z\xbc\xaf", b"Rar!", b"BZh", b"\xfd7zXZ")
# Files operating systems leave behind; skipped without a complaint.
_JUNK_NAMES = {".DS_Store", "Thumbs.db", "desktop.ini"}
_HASH_NAME = re.compile(r"([0-9a-f]{64})\.[A-Za-z0-9]{1,5}")
_BATCH = 1000  # pairs per store transaction


@dataclass(frozen=True)
class ImportLimits:
    """What an import accepts; generous for real datasets, small enough to stop bombs."""

    max_entries: int = 50_000  # files and folders read from one archive or tree
    max_entry_bytes: int = MAX_BYTES  # one file, as declared and as read
    max_total_bytes: int = 4 * 1024**3  # all files together, as read
    max_ratio: float = 200.0  # declared size / compressed size of one zip entry (above 1 MiB)
    max_table_bytes: int = 64 * 1024**2  # pairs.csv and metadata.json
    max_depth: int = 16  # folder nesting in a directory import


@dataclass
class ImportReport:
    images_added: int = 0  # images new to the store
    pairs_added: int = 0
    skipped: int = 0  # fine but already there (images, pairs) or operating-system clutter
    rejected: list[dict] = field(default_factory=list)  # {"name": ..., "reason": ...}
    format: str = ""  # "export" or "class_folders"
    notes: list[str] = field(default_factory=list)

    def reject(self, name: str, reason: str) -> None:
        self.rejected.append({"name": name, "reason": reason})

    def to_dict(self) -> dict:
        return asdict(self)


class _Rejected(Exception):
    """An entry that is refused; the message is the reason shown to the user."""


class _Entry(NamedTuple):
    name: str  # normalized relative POSIX path
    read: Callable[[], bytes]  # the bytes, capped; raises _Rejected


# ----------------------------------------------------------------------------- export


def export_zip(store: PairStore, out_path: Path | str) -> Path:
    """Writes every pool image, every pair and a metadata file to ``out_path`` (atomically).

    Returns:
        ``out_path``.
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pairs = store.all_pairs()
    names = {digest: store.image_path(digest).name for digest in store.pool()}
    table = io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for pair in pairs:
        row = (names[pair.image_a], names[pair.image_b], pair.label, pair.annotator, pair.created_at, pair.updated_at)
        writer.writerow(row)
    counts = store.counts()
    metadata = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "exported_at": utc_timestamp(),
        "n_images": len(names),
        "n_pairs": len(pairs),
        "counts": counts.to_dict(),
        "val_percent": store.val_percent,
        "columns": list(CSV_COLUMNS),
        # Sticky per-image splits, so an import keeps the same train/validation split.
        "image_splits": {names[d]: s for d in names if (s := store.image_split(d)) is not None},
    }
    fd, tmp = tempfile.mkstemp(dir=out_path.parent, prefix=".tmp-", suffix=".zip")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w") as archive:
            for digest, name in names.items():  # already compressed formats: stored as they are
                archive.write(store.image_path(digest), f"images/{name}", compress_type=zipfile.ZIP_STORED)
            archive.writestr(PAIRS_CSV, table.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
            archive.writestr(METADATA_JSON, json.dumps(metadata, indent=1), compress_type=zipfile.ZIP_DEFLATED)
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out_path


# ----------------------------------------------------------------------------- import


def import_path(
    store: PairStore,
    path: Path | str,
    *,
    pairs_per_class: int | None = None,
    n_pairs: int | None = None,
    seed: int = 0,
    annotator: str = "import",
    limits: ImportLimits = ImportLimits(),
) -> ImportReport:
    """Imports a zip or a directory in the export format or as class folders (detected).

    Args:
        pairs_per_class: class folders only: ``same`` pairs per class (and as many ``different`` pairs
            in all); default: as many as the class has images.
        n_pairs: class folders only: total pairs instead, half ``same`` and half ``different``.
        seed: makes the generated pairs reproducible.
        annotator: recorded on generated pairs, and on exported rows that name none.
        limits: what is accepted.

    Raises:
        ValueError: ``path`` is neither a zip nor a directory, or the archive as a whole is unreadable
            or declares more entries than ``limits`` could ever take.
    """
    path = Path(path)
    report = ImportReport()
    with contextlib.ExitStack() as stack:
        if path.is_dir():
            entries = _folder_entries(path, limits, report)
        elif path.is_file() and zipfile.is_zipfile(path):
            archive = stack.enter_context(_open_zip(path, limits))
            entries = _zip_entries(archive, limits, report)
        elif path.exists():
            raise ValueError(f"{path.name} is neither a zip archive nor a folder; import a .zip or a directory")
        else:
            raise ValueError(f"{path} does not exist")
        entries = _strip_enclosing_folder(entries)
        if any(entry.name == PAIRS_CSV for entry in entries):
            report.format = "export"
            _import_export(store, entries, annotator, limits, report)
        else:
            report.format = "class_folders"
            _import_classes(store, entries, annotator, pairs_per_class, n_pairs, seed, report)
    return report


def _import_export(store: PairStore, entries: list[_Entry], annotator: str, limits, report: ImportReport) -> None:
    by_file: dict[str, str] = {}  # file name in images/ -> digest
    tables: dict[str, bytes] = {}
    for entry in entries:
        parts = entry.name.split("/")
        if entry.name in (PAIRS_CSV, METADATA_JSON):
            try:
                tables[entry.name] = _capped(entry, limits.max_table_bytes)
            except _Rejected as error:
                report.reject(entry.name, str(error))
        elif len(parts) == 2 and parts[0] == "images":
            digest = _add_image(store, entry, report)
            if digest is not None:
                by_file[parts[1]] = digest
        else:
            report.reject(entry.name, "not part of the export format (images/, pairs.csv, metadata.json)")
    splits = _read_splits(tables.get(METADATA_JSON), report)
    adopted = {by_file[name]: split for name, split in splits.items() if name in by_file}
    if adopted:
        store.adopt_splits(adopted)
    if PAIRS_CSV in tables:
        rows = _read_pairs_csv(tables[PAIRS_CSV], by_file, annotator, report)
        _add_pairs(store, rows, report)


def _read_splits(data: bytes | None, report: ImportReport) -> dict[str, str]:
    if data is None:
        return {}
    try:
        metadata = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        report.reject(METADATA_JSON, f"not valid JSON ({error}); imported without it")
        return {}
    splits = metadata.get("image_splits") if isinstance(metadata, dict) else None
    if not isinstance(splits, dict):
        return {}
    return {str(k): v for k, v in splits.items() if v in ("train", "val")}


def _read_pairs_csv(data: bytes, by_file: dict[str, str], annotator: str, report: ImportReport) -> list[NewPair]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        report.reject(PAIRS_CSV, "not UTF-8 text")
        return []
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = {"image_a", "image_b", "label"} - set(reader.fieldnames or ())
    if missing:
        report.reject(
            PAIRS_CSV, f"missing column(s) {', '.join(sorted(missing))}; expected {','.join(CSV_COLUMNS[:5])}"
        )
        return []
    rows: list[NewPair] = []
    seen: dict[str, int] = {}
    try:
        for line, record in enumerate(reader, start=2):
            name = f"{PAIRS_CSV}:{line}"
            try:
                a, b = (_resolve(record.get(column), by_file) for column in ("image_a", "image_b"))
                if a == b:
                    raise ValueError("both sides are the same image")
                pair_id = pair_id_for(a, b)
                if pair_id in seen:
                    raise ValueError(f"the same pair as line {seen[pair_id]}")
                created = (record.get("created_at") or "").strip() or None
                updated = (record.get("updated_at") or "").strip() or created
                row = NewPair(
                    a,
                    b,
                    parse_label(record.get("label")),
                    (record.get("annotator") or "").strip() or annotator,
                    utc_timestamp(created) if created else None,
                    utc_timestamp(updated) if updated else None,
                )
            except ValueError as error:
                report.reject(name, str(error))
                continue
            seen[pair_id] = line
            rows.append(row)
    except csv.Error as error:
        report.reject(PAIRS_CSV, f"malformed CSV after {len(rows)} rows ({error})")
    return rows


def _resolve(value: str | None, by_file: dict[str, str]) -> str:
    name = (value or "").strip().removeprefix("images/")
    if name not in by_file:
        raise ValueError(f"image {name[:80]!r} is not among the imported images/ (missing or rejected)")
    return by_file[name]


def _import_classes(store, entries, annotator, pairs_per_class, n_pairs, seed, report: ImportReport) -> None:
    classes: dict[str, list[str]] = {}
    home: dict[str, str] = {}  # digest -> its class
    for entry in entries:
        parts = entry.name.split("/")
        if len(parts) < 2:
            report.reject(entry.name, "not inside a class folder (expected class_name/image.ext)")
            continue
        digest = _add_image(store, entry, report)
        if digest is None:
            continue
        label = parts[0]
        if digest in home:
            if home[digest] != label:  # one picture in two classes: the labels would contradict
                report.reject(entry.name, f"the same image is already in class {home[digest]!r}")
            else:
                report.skipped += 1
            continue
        home[digest] = label
        classes.setdefault(label, []).append(digest)
    if len(classes) < 2:
        report.notes.append(f"{len(classes)} class folder(s): at least two are needed for 'different' pairs")
    generated = balanced_pairs(classes, pairs_per_class=pairs_per_class, n_pairs=n_pairs, seed=seed)
    _add_pairs(store, [NewPair(a, b, label, annotator) for a, b, label in generated], report)


def _add_image(store: PairStore, entry: _Entry, report: ImportReport) -> str | None:
    try:
        data = entry.read()
        if data.startswith(ARCHIVE_MAGIC):
            raise _Rejected("a nested archive (archives inside the archive are not opened)")
        named = _HASH_NAME.fullmatch(PurePosixPath(entry.name).name)
        if named and named.group(1) != content_hash(data):
            raise _Rejected("the content does not match the SHA-256 in its name (corrupt or edited)")
        digest, created = store.put_image(data, source="import")
    except (_Rejected, ImageError) as error:
        report.reject(entry.name, str(error))
        return None
    if created:
        report.images_added += 1
    else:
        report.skipped += 1
    return digest


def _add_pairs(store: PairStore, rows: list[NewPair], report: ImportReport) -> None:
    for start in range(0, len(rows), _BATCH):
        results = store.add_pairs(rows[start : start + _BATCH], replace=False)  # never overwrite a label
        added = sum(result is not None for result in results)
        report.pairs_added += added
        report.skipped += len(results) - added


# ----------------------------------------------------------------------------- pair generation


def balanced_pairs(
    classes: dict[str, list[str]],
    *,
    pairs_per_class: int | None = None,
    n_pairs: int | None = None,
    seed: int = 0,
) -> list[tuple[str, str, str]]:
    """Same/different pairs from images grouped by class, balanced and reproducible.

    ``same`` pairs are spread evenly over the classes (as far as each has pairs to give), ``different``
    pairs evenly over pairs of classes, and there are as many of each as possible up to the request.

    Args:
        classes: class name -> image ids.
        pairs_per_class: ``same`` pairs per class, and as many ``different`` pairs in all (default: the
            class's number of images).
        n_pairs: a total instead (half ``same``, the rest ``different``); wins over ``pairs_per_class``.

    Returns:
        ``(image_a, image_b, label)`` triples in a seeded random order, no pair twice.
    """
    rng = random.Random(seed)
    members = {name: sorted(set(ids)) for name, ids in sorted(classes.items()) if ids}  # order-independent
    capacity = {name: math.comb(len(ids), 2) for name, ids in members.items()}
    if n_pairs is not None:
        if n_pairs < 0:
            raise ValueError(f"n_pairs must not be negative, got {n_pairs}")
        quota = _spread(n_pairs // 2, capacity)
        different_wanted = n_pairs - sum(quota.values())
    else:
        if pairs_per_class is not None and pairs_per_class < 0:
            raise ValueError(f"pairs_per_class must not be negative, got {pairs_per_class}")
        quota = {
            n: min(capacity[n], len(ids) if pairs_per_class is None else pairs_per_class) for n, ids in members.items()
        }
        different_wanted = sum(quota.values())
    pairs = [(a, b, "same") for name in members for a, b in _sample_pairs(members[name], quota[name], rng)]
    pairs += [(a, b, "different") for a, b in _sample_cross(members, different_wanted, rng)]
    rng.shuffle(pairs)  # the order splits are assigned in: no bias by class or label
    return pairs


def _spread(total: int, capacity: dict[str, int]) -> dict[str, int]:
    """Splits ``total`` as evenly as the capacities allow (water-filling)."""
    quota = dict.fromkeys(capacity, 0)
    open_ = [name for name in capacity if capacity[name] > 0]
    while total > 0 and open_:
        share = max(1, total // len(open_))
        for name in list(open_):
            take = min(share, capacity[name] - quota[name], total)
            quota[name] += take
            total -= take
            if quota[name] == capacity[name]:
                open_.remove(name)
            if total == 0:
                break
    return quota


def _sample_pairs(ids: list[str], k: int, rng: random.Random) -> list[tuple[str, str]]:
    """``k`` distinct unordered pairs from ``ids``."""
    possible = math.comb(len(ids), 2)
    if k >= possible / 4:  # dense: enumerate (small)
        return rng.sample(list(combinations(ids, 2)), min(k, possible))
    chosen: dict[tuple[int, int], None] = {}  # insertion-ordered, so the result is reproducible
    while len(chosen) < k:
        i, j = sorted(rng.sample(range(len(ids)), 2))
        chosen[(i, j)] = None
    return [(ids[i], ids[j]) for i, j in chosen]


def _sample_cross(members: dict[str, list[str]], k: int, rng: random.Random) -> Iterator[tuple[str, str]]:
    """``k`` distinct pairs of images from two different classes, class pairs drawn uniformly."""
    names = list(members)
    possible = sum(len(members[x]) * len(members[y]) for x, y in combinations(names, 2))
    k = min(k, possible)
    if k >= possible / 4:
        every = [(a, b) for x, y in combinations(names, 2) for a in members[x] for b in members[y]]
        yield from rng.sample(every, k)
        return
    chosen: dict[tuple[str, str], None] = {}
    while len(chosen) < k:
        x, y = rng.sample(names, 2)
        a, b = rng.choice(members[x]), rng.choice(members[y])
        chosen[(min(a, b), max(a, b))] = None
    yield from chosen


# ----------------------------------------------------------------------------- reading untrusted trees


def _normalize(raw: str) -> str:
    """The entry's safe relative name; raises _Rejected for names that could point anywhere else."""
    if "\x00" in raw:
        raise _Rejected("the name contains a NUL byte")
    if "\\" in raw:
        raise _Rejected("backslashes in the name (a Windows path that could climb out)")
    if raw.startswith("/") or re.match(r"[A-Za-z]:", raw):
        raise _Rejected("an absolute path")
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _Rejected("the path climbs out of the archive (..)")
    if not parts:
        raise _Rejected("an empty name")
    return "/".join(parts)


def _is_junk(name: str) -> bool:
    parts = name.split("/")
    return parts[0] == "__MACOSX" or parts[-1] in _JUNK_NAMES or parts[-1].startswith("._")


def _capped(entry: _Entry, cap: int) -> bytes:
    data = entry.read()
    if len(data) > cap:
        raise _Rejected(f"{_size(len(data))}; the limit for this file is {_size(cap)}")
    return data


class _Budget:
    """Bytes read so far across an import, against ``max_total_bytes``."""

    def __init__(self, limit: int):
        self.left = limit

    def take(self, size: int) -> None:
        if size > self.left:
            raise _Rejected("the import has reached its total size limit; split it into smaller parts")
        self.left -= size


def _open_zip(path: Path, limits: ImportLimits) -> zipfile.ZipFile:
    declared = _declared_entry_count(path)
    if declared is not None and declared > 10 * limits.max_entries:
        raise ValueError(f"the archive declares {declared:,} entries; the limit is {limits.max_entries:,}")
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise ValueError(f"{path.name} is not a readable zip archive ({error})") from None


def _zip_entries(archive: zipfile.ZipFile, limits: ImportLimits, report: ImportReport) -> list[_Entry]:
    budget = _Budget(limits.max_total_bytes)
    declared_total = 0
    entries: list[_Entry] = []
    seen: set[str] = set()
    for index, info in enumerate(archive.infolist()):
        shown = info.filename[:200]
        try:
            if index >= limits.max_entries:
                raise _Rejected(f"too many entries in the archive (limit {limits.max_entries:,})")
            name = _normalize(info.filename)
            mode = info.external_attr >> 16
            if info.is_dir() or stat.S_ISDIR(mode):
                continue
            if stat.S_ISLNK(mode):
                raise _Rejected("a symbolic link")
            if mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                raise _Rejected("not a regular file")
            if _is_junk(name):
                report.skipped += 1
                continue
            if name in seen:
                raise _Rejected("a duplicate name (another entry has the same path)")
            seen.add(name)
            if info.flag_bits & 0x1:
                raise _Rejected("encrypted")
            if PurePosixPath(name).suffix.lower() in ARCHIVE_SUFFIXES:
                raise _Rejected("a nested archive (archives inside the archive are not opened)")
            if info.file_size > limits.max_entry_bytes:
                raise _Rejected(f"declares {_size(info.file_size)}; the limit is {_size(limits.max_entry_bytes)}")
            ratio = info.file_size / max(info.compress_size, 1)
            if info.file_size > 2**20 and ratio > limits.max_ratio:
                raise _Rejected(f"compressed {ratio:.0f}:1, which looks like a zip bomb")
            declared_total += info.file_size
            if declared_total > limits.max_total_bytes:
                raise _Rejected(f"the archive declares more than its limit of {_size(limits.max_total_bytes)} in all")
        except _Rejected as error:
            report.reject(shown, str(error))
            continue
        entries.append(_Entry(name, _zip_reader(archive, info, limits.max_entry_bytes, budget)))
    return entries


def _zip_reader(archive: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int, budget: _Budget) -> Callable[[], bytes]:
    def read() -> bytes:
        try:
            with archive.open(info) as handle:
                data = handle.read(cap + 1)  # never trust the header: stop one byte past the cap
        except (zipfile.BadZipFile, zlib_error, EOFError, OSError, NotImplementedError, ValueError) as error:
            raise _Rejected(f"corrupt or unsupported entry ({error})") from None
        if len(data) > cap:
            raise _Rejected(f"more than {_size(cap)} when decompressed")
        if len(data) != info.file_size:
            raise _Rejected("its size differs from what its header declares")
        budget.take(len(data))
        return data

    return read


def _declared_entry_count(path: Path) -> int | None:
    """Entries the central directory declares, read before ``zipfile`` builds one object per entry."""
    try:
        with open(path, "rb") as handle:
            end = zipfile._EndRecData(handle)  # stable since Python 2; a failure only skips this check
    except Exception:
        return None
    return None if not end else int(end[zipfile._ECD_ENTRIES_TOTAL])


def _folder_entries(root: Path, limits: ImportLimits, report: ImportReport) -> list[_Entry]:
    budget = _Budget(limits.max_total_bytes)
    entries: list[_Entry] = []
    count = 0

    def walk(folder: Path, prefix: str, depth: int) -> None:
        nonlocal count
        for item in sorted(os.scandir(folder), key=lambda e: e.name):
            name = f"{prefix}{item.name}"
            count += 1
            try:
                if count > limits.max_entries:
                    raise _Rejected(f"too many files in the folder (limit {limits.max_entries:,})")
                if item.is_symlink():
                    raise _Rejected("a symbolic link")
                if item.is_dir(follow_symlinks=False):
                    if depth >= limits.max_depth:
                        raise _Rejected(f"folders nested deeper than {limits.max_depth}")
                    walk(Path(item.path), f"{name}/", depth + 1)
                    continue
                if not item.is_file(follow_symlinks=False):
                    raise _Rejected("not a regular file")
                if _is_junk(name):
                    report.skipped += 1
                    continue
                if PurePosixPath(name).suffix.lower() in ARCHIVE_SUFFIXES:
                    raise _Rejected("a nested archive (archives inside the folder are not opened)")
                size = item.stat(follow_symlinks=False).st_size
                if size > limits.max_entry_bytes:
                    raise _Rejected(f"{_size(size)}; the limit is {_size(limits.max_entry_bytes)}")
            except _Rejected as error:
                report.reject(name, str(error))
                continue
            entries.append(_Entry(name, _file_reader(Path(item.path), limits.max_entry_bytes, budget)))

    walk(root, "", 0)
    return entries


def _file_reader(path: Path, cap: int, budget: _Budget) -> Callable[[], bytes]:
    def read() -> bytes:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)  # swapped for a link since the scan: refuse
        try:
            fd = os.open(path, flags)
        except OSError as error:
            raise _Rejected(f"cannot be opened ({error.strerror})") from None
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise _Rejected("not a regular file")
            data = handle.read(cap + 1)
        if len(data) > cap:
            raise _Rejected(f"more than {_size(cap)}")
        budget.take(len(data))
        return data

    return read


def _strip_enclosing_folder(entries: list[_Entry]) -> list[_Entry]:
    """``dataset/cat/1.jpg`` -> ``cat/1.jpg``, when one folder holds everything and stripping it leaves
    a recognizable layout (``pairs.csv`` at the top, or every file inside a class folder)."""
    tops = {entry.name.split("/")[0] for entry in entries}
    if len(tops) != 1 or any("/" not in entry.name for entry in entries):
        return entries
    stripped = [entry._replace(name=entry.name.split("/", 1)[1]) for entry in entries]
    names = [entry.name for entry in stripped]
    if PAIRS_CSV in names or all("/" in name for name in names):
        return stripped
    return entries


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MB" if size >= 2**20 else f"{size:,} bytes"
