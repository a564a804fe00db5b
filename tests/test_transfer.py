"""Import and export: the round trip is exact, class folders give balanced pairs, hostile archives and
folders are refused entry by entry and nothing lands outside the data dir."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import os
import stat
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from siamese.store import PairStore
from siamese.transfer import ImportLimits, balanced_pairs, export_zip, import_path
from tests import images_factory as factory


def png(seed: int) -> bytes:
    return factory.encode(factory.noise((8, 8), seed), "PNG")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_zip(path: Path, entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return path


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


@pytest.fixture
def store(tmp_path: Path) -> PairStore:
    with PairStore(tmp_path / "data") as opened:
        yield opened


def class_entries(classes: dict[str, int], first_seed: int = 0) -> list[tuple[str, bytes]]:
    seeds = itertools.count(first_seed)
    return [(f"{name}/{i}.png", png(next(seeds))) for name, n in classes.items() for i in range(n)]


# ----------------------------------------------------------------------------- export round trip


def test_export_then_import_reproduces_pairs_and_images(tmp_path: Path, store: PairStore):
    digests = [store.add_image(png(s)) for s in range(8)]
    digests.append(store.add_image(factory.jpeg_bytes(color=(10, 200, 30)), source="score"))  # pool only
    store.add_pair(digests[0], digests[1], "same", "alice", at="2024-01-02T03:04:05.123456+00:00")
    store.add_pair(digests[1], digests[0], "different", "bob", at="2024-01-03T00:00:00Z")  # relabel
    store.add_pair(digests[2], digests[3], "different", "alice", at="2024-02-01T00:00:00+00:00")
    store.add_pair(digests[4], digests[5], "same", "carol")
    gone = store.add_pair(digests[6], digests[7], "same", "carol").pair_id
    store.delete_pair(gone)
    store.add_pair(digests[3], digests[4], "same", "bob")  # images from two different pairs: maybe "cross"

    out = export_zip(store, tmp_path / "out" / "export.zip")
    with zipfile.ZipFile(out) as archive:
        names = set(archive.namelist())
        table = list(csv.reader(io.StringIO(archive.read("pairs.csv").decode())))
        metadata = json.loads(archive.read("metadata.json"))
        for name in names - {"pairs.csv", "metadata.json"}:
            assert name.startswith("images/") and sha(archive.read(name)) == Path(name).stem
    assert table[0][:5] == ["image_a", "image_b", "label", "annotator", "created_at"]
    assert len(table) - 1 == store.counts().total == 4 and metadata["n_pairs"] == 4
    assert {f"images/{row[0]}" for row in table[1:]} <= names and len(names) == 9 + 2

    fresh = PairStore(tmp_path / "fresh")
    report = import_path(fresh, out)
    assert (report.images_added, report.pairs_added, report.rejected) == (9, 4, [])
    assert fresh.all_pairs() == store.all_pairs()  # ids, order, labels, annotators, timestamps, splits
    assert sorted(fresh.pool()) == sorted(store.pool())
    for digest in store.pool():
        assert fresh.image_path(digest).read_bytes() == store.image_path(digest).read_bytes()

    again = import_path(fresh, out)  # importing twice changes nothing
    assert (again.images_added, again.pairs_added, again.skipped) == (0, 0, 9 + 4)
    assert fresh.counts() == store.counts()


def test_import_of_an_extracted_export_folder(tmp_path: Path, store: PairStore):
    a, b = store.add_image(png(1)), store.add_image(png(2))
    store.add_pair(a, b, "same", "eve")
    with zipfile.ZipFile(export_zip(store, tmp_path / "e.zip")) as archive:
        archive.extractall(tmp_path / "unpacked" / "my-export")  # our own trusted zip
    fresh = PairStore(tmp_path / "fresh")
    report = import_path(fresh, tmp_path / "unpacked")  # one enclosing folder is fine
    assert report.format == "export" and report.pairs_added == 1
    assert fresh.all_pairs() == store.all_pairs()


def test_export_format_rows_are_checked_one_by_one(tmp_path: Path, store: PairStore):
    one, two, three = png(1), png(2), png(3)
    rows = [
        "image_a,image_b,label,annotator,created_at",
        "one.png,two.png,same,zoe,2024-05-01T10:00:00Z",  # fine (names need not be hashes)
        "one.png,three.png,DIFFERENT,,",  # fine: annotator defaults, time is now
        "one.png,missing.png,same,zoe,",
        "two.png,two.png,same,zoe,",
        "two.png,three.png,maybe,zoe,",
        "three.png,two.png,same,zoe,not-a-time",
        "two.png,one.png,different,zoe,",  # the pair of line 2 again
    ]
    bad_hash = f"images/{'0' * 64}.png"
    zipped = make_zip(
        tmp_path / "x.zip",
        [
            ("images/one.png", one),
            ("images/two.png", two),
            ("images/three.png", three),
            (bad_hash, png(4)),
            ("notes.txt", b"hello"),
            ("pairs.csv", "\n".join(rows).encode()),
        ],
    )
    report = import_path(store, zipped, annotator="importer")
    reasons = {r["name"]: r["reason"] for r in report.rejected}
    assert set(reasons) == {
        "pairs.csv:4",
        "pairs.csv:5",
        "pairs.csv:6",
        "pairs.csv:7",
        "pairs.csv:8",
        bad_hash,
        "notes.txt",
    }
    assert "missing" in reasons["pairs.csv:4"] and "same image" in reasons["pairs.csv:5"]
    assert "same' or 'different" in reasons["pairs.csv:6"] and "ISO-8601" in reasons["pairs.csv:7"]
    assert "line 2" in reasons["pairs.csv:8"] and "SHA-256" in reasons[bad_hash]
    assert (report.images_added, report.pairs_added) == (3, 2)
    pairs = {frozenset((p.image_a, p.image_b)): p for p in store.all_pairs()}
    first = pairs[frozenset((sha(one), sha(two)))]
    assert (first.label, first.annotator, first.created_at) == ("same", "zoe", "2024-05-01T10:00:00.000000+00:00")
    second = pairs[frozenset((sha(one), sha(three)))]
    assert (second.label, second.annotator) == ("different", "importer")
    assert not store.has_image(sha(png(4)))


# ----------------------------------------------------------------------------- class folders


def test_balanced_pairs_are_balanced_distinct_and_seeded():
    classes = {name: [f"{name}{i:02d}" for i in range(n)] for name, n in {"a": 6, "b": 9, "c": 4, "d": 1}.items()}
    pairs = balanced_pairs(classes, pairs_per_class=5, seed=1)
    home = {image: name for name, ids in classes.items() for image in ids}
    same = [(x, y) for x, y, label in pairs if label == "same"]
    different = [(x, y) for x, y, label in pairs if label == "different"]
    assert all(home[x] == home[y] for x, y in same) and all(home[x] != home[y] for x, y in different)
    # a, b and c can each give 5 (c: C(4, 2) = 6 pairs); d's single image gives none
    assert Counter(home[x] for x, _ in same) == Counter({"a": 5, "b": 5, "c": 5})
    assert len(different) == len(same) == 15
    assert len({frozenset(p) for p in same + different}) == 30
    assert balanced_pairs(classes, pairs_per_class=5, seed=1) == pairs
    assert balanced_pairs(dict(reversed(list(classes.items()))), pairs_per_class=5, seed=1) == pairs
    assert balanced_pairs(classes, pairs_per_class=5, seed=2) != pairs


def test_balanced_pairs_total_and_capacity():
    classes = {"x": ["x1", "x2", "x3"], "y": ["y1", "y2"]}  # 3 + 1 same pairs possible, 6 different
    pairs = balanced_pairs(classes, n_pairs=6, seed=0)
    assert Counter(label for *_, label in pairs) == Counter({"same": 3, "different": 3})
    everything = balanced_pairs(classes, n_pairs=1000, seed=0)
    assert Counter(label for *_, label in everything) == Counter({"same": 4, "different": 6})  # all there are
    assert sorted(balanced_pairs({"only": ["a", "b", "c"]})) == [
        ("a", "b", "same"),
        ("a", "c", "same"),
        ("b", "c", "same"),
    ]


def test_class_folder_zip_imports_images_and_generated_pairs(tmp_path: Path, store: PairStore):
    entries = class_entries({"cats": 5, "dogs": 5, "owls": 4})
    zipped = make_zip(tmp_path / "classes.zip", [(f"dataset/{name}", data) for name, data in entries])
    report = import_path(store, zipped, n_pairs=20, seed=3)
    assert report.format == "class_folders" and report.rejected == []
    assert (report.images_added, report.pairs_added) == (14, 20)
    assert store.counts().same == store.counts().different == 10
    home = {sha(data): name.split("/")[0] for name, data in entries}
    for pair in store.all_pairs():
        assert (home[pair.image_a] == home[pair.image_b]) == (pair.label == "same")
        assert pair.annotator == "import"
    again = import_path(store, zipped, n_pairs=20, seed=3)
    assert (again.images_added, again.pairs_added) == (0, 0) and again.skipped == 14 + 20


def test_class_folder_directory_import(tmp_path: Path, store: PairStore):
    root = tmp_path / "folders"
    for name, data in class_entries({"red": 3, "blue": 3}):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "stray.png").write_bytes(png(99))
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    report = import_path(store, root, pairs_per_class=2)
    assert report.rejected == [
        {"name": "stray.png", "reason": "not inside a class folder (expected class_name/image.ext)"}
    ]
    assert (report.images_added, report.pairs_added) == (6, 8)
    assert store.pool_size() == 6


# ----------------------------------------------------------------------------- hostile input


def symlink_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # unix
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def inner_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as inner:
        inner.writestr("cat/9.png", png(9))
    return buffer.getvalue()


def test_hostile_zip_entries_are_rejected_with_reasons(tmp_path: Path):
    store = PairStore(tmp_path / "data")
    good = class_entries({"cat": 3, "dog": 3})
    truncated = png(50)[:134]
    hostile = [
        ("../evil.png", png(40)),
        ("cat/../../evil2.png", png(41)),
        ("/etc/evil3.png", png(42)),
        ("C:/evil4.png", png(43)),
        ("cat\\..\\..\\evil5.png", png(44)),
        (symlink_info("cat/link.png"), b"/etc/passwd"),
        ("cat/inner.zip", inner_zip()),
        ("cat/disguised.png", inner_zip()),
        ("cat/bomb.png", b"\0" * (3 * 2**20)),  # 3 MB of zeros deflate to a few KB
        ("cat/huge.png", os.urandom(5 * 2**20)),  # over the per-file limit
        ("cat/readme.txt", b"just text"),
        ("cat/pixels.png", factory.png_declaring(200_000, 200_000)),
        ("cat/truncated.png", truncated),
        ("cat/0.png", png(45)),  # a second entry with the name of a good one
    ]
    zipped = tmp_path / "hostile.zip"
    with pytest.warns(UserWarning, match="Duplicate name"):
        make_zip(zipped, good + hostile)
    before = files_under(tmp_path)
    report = import_path(store, zipped, limits=ImportLimits(max_entry_bytes=4 * 2**20, max_ratio=100))
    reasons = {r["name"]: r["reason"] for r in report.rejected}
    expected = {
        "../evil.png": "climbs out",
        "cat/../../evil2.png": "climbs out",
        "/etc/evil3.png": "absolute",
        "C:/evil4.png": "absolute",
        "cat\\..\\..\\evil5.png": "backslash",
        "cat/link.png": "symbolic link",
        "cat/inner.zip": "nested archive",
        "cat/disguised.png": "nested archive",
        "cat/bomb.png": "zip bomb",
        "cat/huge.png": "limit",
        "cat/readme.txt": "not a recognized image",
        "cat/pixels.png": "too many pixels",
        "cat/truncated.png": "truncated",
        "cat/0.png": "duplicate",
    }
    assert set(reasons) == set(expected)
    for name, words in expected.items():
        assert words in reasons[name], (name, reasons[name])
    assert report.images_added == 6 and store.pool_size() == 6
    assert sorted(store.pool()) == sorted(sha(data) for _, data in good)
    created = files_under(tmp_path) - before
    data_dir = (tmp_path / "data").resolve()
    assert created and all(p.resolve().is_relative_to(data_dir) for p in created)
    assert not any("evil" in p.name for p in files_under(tmp_path.parent))


def test_header_that_lies_about_its_size_is_not_trusted(tmp_path: Path, store: PairStore):
    zipped = make_zip(tmp_path / "lie.zip", [*class_entries({"a": 2, "b": 2}), ("a/liar.bmp", b"\0" * 200_000)])
    raw = bytearray(zipped.read_bytes())
    with zipfile.ZipFile(zipped) as archive:
        info = archive.getinfo("a/liar.bmp")
    tiny = (1000).to_bytes(4, "little")
    raw[info.header_offset + 22 : info.header_offset + 26] = tiny  # local header: uncompressed size
    central = raw.rfind(b"a/liar.bmp") - 46  # its central directory record: 46 fixed bytes, then the name
    assert raw[central : central + 4] == b"PK\x01\x02"
    raw[central + 24 : central + 28] = tiny
    zipped.write_bytes(bytes(raw))
    with zipfile.ZipFile(zipped) as archive:
        assert archive.getinfo("a/liar.bmp").file_size == 1000  # the lie is what a reader sees
    report = import_path(store, zipped)
    assert [r["name"] for r in report.rejected] == ["a/liar.bmp"]
    assert "CRC" in report.rejected[0]["reason"]  # the 1,000 bytes read do not check out
    assert report.images_added == 4


def test_entry_count_and_total_size_caps(tmp_path: Path, store: PairStore):
    entries = class_entries({"a": 4, "b": 4})
    zipped = make_zip(tmp_path / "many.zip", entries)
    report = import_path(store, zipped, limits=ImportLimits(max_entries=5))
    assert report.images_added == 5
    assert [r["reason"] for r in report.rejected] == ["too many entries in the archive (limit 5)"] * 3
    with pytest.raises(ValueError, match="declares 8 entries"):
        import_path(store, zipped, limits=ImportLimits(max_entries=0))
    fresh = PairStore(tmp_path / "fresh")
    budget = sum(len(data) for _, data in entries[:3])
    report = import_path(fresh, zipped, limits=ImportLimits(max_total_bytes=budget))
    assert report.images_added == 3 and len(report.rejected) == 5
    assert all("limit" in r["reason"] for r in report.rejected)


def test_encrypted_and_macos_clutter(tmp_path: Path, store: PairStore):
    zipped = make_zip(
        tmp_path / "x.zip",
        [*class_entries({"a": 2, "b": 2}), ("a/secret.png", png(77)), ("__MACOSX/a/._0.png", b"\0\5\26\7")],
    )
    raw = bytearray(zipped.read_bytes())  # zipfile cannot write encrypted entries: set the flag by hand
    with zipfile.ZipFile(zipped) as archive:
        local = archive.getinfo("a/secret.png").header_offset
    central = raw.rfind(b"a/secret.png") - 46
    raw[local + 6] |= 0x1
    raw[central + 8] |= 0x1
    zipped.write_bytes(bytes(raw))
    report = import_path(store, zipped)
    assert report.rejected == [{"name": "a/secret.png", "reason": "encrypted"}]
    assert report.skipped == 1 and report.images_added == 4


@pytest.mark.skipif(os.name != "posix", reason="symlinks and FIFOs")
def test_hostile_folder_entries(tmp_path: Path, store: PairStore):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(png(70))
    root = tmp_path / "folders"
    for name, data in class_entries({"a": 2, "b": 2}):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    os.symlink(outside / "secret.png", root / "a" / "link.png")
    os.symlink(outside, root / "linked_dir")
    os.mkfifo(root / "b" / "pipe.png")
    (root / "b" / "nested.zip").write_bytes(inner_zip())
    (root / "b" / "big.png").write_bytes(os.urandom(3000))
    report = import_path(store, root, limits=ImportLimits(max_entry_bytes=2000))
    reasons = {r["name"]: r["reason"] for r in report.rejected}
    assert reasons == {
        "a/link.png": "a symbolic link",
        "linked_dir": "a symbolic link",
        "b/pipe.png": "not a regular file",
        "b/nested.zip": "a nested archive (archives inside the folder are not opened)",
        "b/big.png": "3,000 bytes; the limit is 2,000 bytes",
    }
    assert report.images_added == 4 and not store.has_image(sha(png(70)))


def test_not_an_archive(tmp_path: Path, store: PairStore):
    text = tmp_path / "x.zip"
    text.write_bytes(b"hello")
    with pytest.raises(ValueError, match="neither a zip"):
        import_path(store, text)
    with pytest.raises(ValueError, match="does not exist"):
        import_path(store, tmp_path / "missing.zip")
