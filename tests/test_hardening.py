"""Hostile input, hostile archives and access control, against the real ``python app.py``.

Every bad request must end in an ``AppError`` that says what was wrong (or, for inputs that are odd
but valid, a correct answer), store nothing, and leave the server answering the next request. What is
stored is read straight from the data directory's SQLite file, read-only, so the app's own counts are
checked against the truth on disk.
"""

from __future__ import annotations

import hashlib
import http.cookiejar
import io
import json
import pickle
import sqlite3
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from tests import images_factory as factory
from tests.appserver import run_app, shape_png

pytestmark = pytest.mark.slow

gradio_client = pytest.importorskip("gradio_client")
Client, handle_file = gradio_client.Client, gradio_client.handle_file
AppError = gradio_client.exceptions.AppError

UNKNOWN_PAIR = "0" * 16
MB = 2**20


# ----------------------------------------------------------------------------- the app and what it stored


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with run_app(tmp_path_factory.mktemp("hardening") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def client(app):
    return Client(app.url, verbose=False)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[Path, Path]:
    """Two ordinary images: the control request after every bad one."""
    folder = tmp_path_factory.mktemp("good")
    a, b = folder / "circle.png", folder / "square.png"
    a.write_bytes(shape_png("circle", 100))
    b.write_bytes(shape_png("square", 100))
    return a, b


def stored(data_dir: Path) -> dict:
    """What is on disk: image rows (digest -> (width, height)), pair ids, and the image files."""
    uri = f"file:{data_dir / 'labels.sqlite3'}?mode=ro"
    with sqlite3.connect(uri, uri=True, timeout=10) as conn:
        images = {d: (w, h) for d, w, h in conn.execute("SELECT digest, width, height FROM images")}
        pairs = {row[0] for row in conn.execute("SELECT pair_id FROM pairs")}
    files = {p.name.split(".")[0] for p in (data_dir / "images").rglob("*") if p.is_file()}
    return {"images": images, "pairs": pairs, "files": files}


def settled(data_dir: Path) -> dict:
    """:func:`stored` once scored images have finished joining the pool (they do so off the request)."""
    last = stored(data_dir)
    for _ in range(20):
        time.sleep(0.15)
        now = stored(data_dir)
        if now == last:
            return now
        last = now
    return last


def counts(client) -> dict:
    result = client.predict(UNKNOWN_PAIR, api_name="/delete_pair")
    return {key: result[key] for key in ("same", "different", "total")}


def assert_still_serving(client, good: tuple[Path, Path]) -> None:
    result = client.predict(handle_file(good[0]), handle_file(good[1]), api_name="/score")
    assert -1.0 <= result["similarity"] <= 1.0


def write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def call_raw(url: str, name: str, data: list, opener=None) -> tuple[str, object]:
    """POSTs ``data`` to an endpoint without gradio_client (which would upload local paths itself).

    Returns:
        The last server-sent event's type (``complete`` or ``error``) and its data.
    """
    opener = opener or urllib.request.build_opener()
    request = urllib.request.Request(
        f"{url}/gradio_api/call/{name}",
        data=json.dumps({"data": data}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with opener.open(request, timeout=30) as response:
        event_id = json.load(response)["event_id"]
    with opener.open(f"{url}/gradio_api/call/{name}/{event_id}", timeout=60) as response:
        lines = response.read().decode().splitlines()
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    payloads = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return events[-1], json.loads(payloads[-1])


def get(url: str, opener=None) -> tuple[int, bytes]:
    opener = opener or urllib.request.build_opener()
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def file_data(path: str) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


def multipart(path: Path, boundary: str = "siamese-test-boundary") -> tuple[bytes, str]:
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{path.name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    body = head.encode() + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def upload(url: str, path: Path) -> str:
    """Uploads ``path`` the way a browser does; returns its path in Gradio's upload cache."""
    body, content_type = multipart(path)
    request = urllib.request.Request(f"{url}/gradio_api/upload", data=body, headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)[0]


# ----------------------------------------------------------------------------- images, odd and hostile


def _png(image: Image.Image, **kwargs) -> bytes:
    return factory.encode(image, "PNG", **kwargs)


def _palette_with_transparency() -> bytes:
    image = Image.new("P", (12, 10), 0)
    image.putpalette([255, 255, 255, 200, 30, 30] + [0] * 762)
    image.paste(1, (3, 3, 9, 7))
    return _png(image, transparency=0)


REJECTED = {  # name: (file name, bytes, what the message must say)
    "zero-byte": ("empty.png", b"", "empty"),
    "text-as-png": ("notes.png", b"these are notes, not pixels\n" * 20, "not a recognized image"),
    "html-as-png": ("page.png", factory.HTML, "HTML"),
    "svg": ("drawing.svg", factory.SVG, "SVG"),
    "truncated-jpeg": ("cut.jpg", factory.encode(factory.noise((64, 64), 1), "JPEG")[:900], "truncated"),
    "truncated-png": ("cut.png", _png(factory.noise((64, 64), 2))[:2000], "truncated"),
    "decompression-bomb": ("bomb.png", factory.png_declaring(100_000, 100_000), "pixels"),
    "heic": ("photo.heic", b"\x00\x00\x00\x18ftypheic" + bytes(64), "HEIC"),
}

ACCEPTED = {  # name: (file name, bytes, (width, height) once decoded upright)
    "png-16-bit": ("deep.png", _png(Image.new("I;16", (12, 10), 40_000)), (12, 10)),
    "cmyk-jpeg": ("print.jpg", factory.encode(Image.new("CMYK", (12, 10), (0, 200, 200, 0)), "JPEG"), (12, 10)),
    "palette-transparent-png": ("palette.png", _palette_with_transparency(), (12, 10)),
    "animated-gif": ("anim.gif", factory.animated_gif(), (8, 8)),
    "animated-webp": ("anim.webp", factory.animated_webp(), (8, 8)),
    "exif-rotated-jpeg": ("rotated.jpg", factory.exif_rotated_jpeg(), (20, 40)),  # stored 40×20, shown 20×40
    "1x1": ("dot.png", factory.png_bytes((1, 1)), (1, 1)),
    "1x10000": ("strip.png", factory.png_bytes((1, 10_000), factory.BLUE), (1, 10_000)),
}


@pytest.mark.parametrize("kind", list(REJECTED))
def test_bad_images_are_refused_with_a_reason_and_nothing_is_stored(client, app, good, tmp_path, kind):
    name, data, reason = REJECTED[kind]
    bad = write(tmp_path, name, data)
    before, labeled = settled(app.data_dir), counts(client)
    for call in (
        lambda: client.predict(handle_file(bad), handle_file(good[0]), api_name="/score"),
        lambda: client.predict(handle_file(good[0]), handle_file(bad), "same", api_name="/label"),
        lambda: client.predict(handle_file(bad), handle_file(good[1]), "different", api_name="/label"),
    ):
        with pytest.raises(AppError) as caught:
            call()
        assert reason in str(caught.value), str(caught.value)
        assert "Traceback" not in str(caught.value)
    after = settled(app.data_dir)
    assert sha(data) not in after["images"] and sha(data) not in after["files"]
    assert after["pairs"] == before["pairs"] and counts(client) == labeled
    assert set(after["images"]) - set(before["images"]) <= {sha(good[0].read_bytes()), sha(good[1].read_bytes())}
    assert_still_serving(client, good)


@pytest.mark.parametrize("kind", list(ACCEPTED))
def test_odd_but_valid_images_score_and_label_correctly(client, app, good, tmp_path, kind):
    name, data, size = ACCEPTED[kind]
    odd = write(tmp_path, name, data)
    score = client.predict(handle_file(odd), handle_file(good[0]), api_name="/score")
    assert -1.0 <= score["similarity"] <= 1.0 and 0.0 <= score["distance"] <= 2.0
    assert score["same"] is (score["similarity"] >= score["threshold"])
    labeled = counts(client)
    result = client.predict(handle_file(odd), handle_file(good[1]), "different", api_name="/label")
    assert result["created"] is True and result["total"] == labeled["total"] + 1
    assert stored(app.data_dir)["images"][sha(data)] == size  # decoded upright, at its real size
    assert result["pair_id"] in stored(app.data_dir)["pairs"]


def test_a_file_above_the_upload_limit_is_refused_before_it_is_read(client, app, good, tmp_path):
    big = tmp_path / "huge.png"
    with open(big, "wb") as handle:  # a real PNG, then padding past 32 MB: cheap to make
        handle.write(shape_png("circle", 7))
        handle.truncate(33 * MB)
    before = settled(app.data_dir)
    with pytest.raises(Exception, match=r"exceeds the maximum file size") as caught:
        client.predict(handle_file(big), handle_file(good[0]), api_name="/score")
    assert str(32 * MB) in str(caught.value)  # names the limit

    # Without the client's own check, the server refuses the upload itself.
    with pytest.raises(urllib.error.HTTPError) as refused:
        upload(app.url, big)
    assert refused.value.code == 413
    assert b"size" in refused.value.read().lower()
    assert settled(app.data_dir) == before
    assert_still_serving(client, good)


# ----------------------------------------------------------------------------- bad values


def fresh_pair(tmp_path: Path, seed: int) -> tuple[Path, Path]:
    a = write(tmp_path, "a.png", factory.encode(factory.noise((16, 16), seed), "PNG"))
    b = write(tmp_path, "b.png", factory.encode(factory.noise((16, 16), seed + 1), "PNG"))
    return a, b


@pytest.mark.parametrize("label", ["maybe", "", "   ", "same\x00", "similar", "x" * 10_000])
def test_invalid_labels_store_nothing(client, app, good, tmp_path, label):
    a, b = fresh_pair(tmp_path, 1000 + len(label))
    before, labeled = settled(app.data_dir), counts(client)
    with pytest.raises(AppError, match="label must be 'same' or 'different'") as caught:
        client.predict(handle_file(a), handle_file(b), label, api_name="/label")
    assert len(str(caught.value)) < 500  # a huge label is not echoed back whole
    after = settled(app.data_dir)
    assert sha(a.read_bytes()) not in after["images"] and sha(b.read_bytes()) not in after["images"]
    assert after["pairs"] == before["pairs"] and counts(client) == labeled
    assert_still_serving(client, good)


@pytest.mark.parametrize(
    "pair_id", ["", "   ", "../../etc/passwd", "'; DROP TABLE pairs; --", "g" * 16, "0" * 17, "x" * 10_000]
)
def test_invalid_pair_ids_are_refused(client, app, good, tmp_path, pair_id):
    a, b = fresh_pair(tmp_path, 2000)
    kept = client.predict(handle_file(a), handle_file(b), "same", api_name="/label")
    before = settled(app.data_dir)
    with pytest.raises(AppError, match="pair") as caught:
        client.predict(pair_id, api_name="/delete_pair")
    assert len(str(caught.value)) < 500
    assert settled(app.data_dir)["pairs"] == before["pairs"] and kept["pair_id"] in before["pairs"]
    assert counts(client)["total"] == kept["total"]
    assert_still_serving(client, good)


@pytest.mark.parametrize(
    "version", ["", " ", "../", "../../etc/passwd", "/etc/passwd", "v0/../v0", "v0/", "V0", "v-1", "v99999999"]
)
def test_invalid_model_versions_are_refused(client, app, good, version):
    with pytest.raises(AppError, match="version") as caught:
        client.predict(version, api_name="/activate_model")
    assert "Traceback" not in str(caught.value)
    assert client.predict(api_name="/model_info")["model_version"] == "v0"
    assert [m["version"] for m in client.predict(api_name="/models") if m["active"]] == ["v0"]
    assert_still_serving(client, good)


def test_an_absolute_path_to_a_real_version_is_not_a_version(client, app):
    real = app.data_dir / "models" / "v0"
    assert real.is_dir()
    with pytest.raises(AppError, match="not a model version name"):
        client.predict(str(real), api_name="/activate_model")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": -1}, "epochs"),
        ({"epochs": "abc"}, "epochs"),
        ({"epochs": 10**9}, "epochs"),
        ({"epochs": 2.5}, "epochs"),
        ({"learning_rate": -0.01}, "learning_rate"),
        ({"learning_rate": "fast"}, "learning_rate"),
        ({"margin": 3}, "margin"),
        ({"margin": 0}, "margin"),
        ({"mode": "banana"}, "mode"),
        ({"batch_size": 0}, "batch_size"),
    ],
    ids=lambda value: json.dumps(value) if isinstance(value, dict) else value,
)
def test_invalid_training_options_say_which_option_and_start_nothing(client, good, options, named):
    before = client.predict(api_name="/train_status")
    with pytest.raises(AppError) as caught:
        client.predict(**options, api_name="/train")
    message = str(caught.value)
    assert named in message and "must" in message, message  # checked before the labels are counted
    after = client.predict(api_name="/train_status")
    assert (after["state"], after["job_id"]) == (before["state"], before["job_id"])
    assert_still_serving(client, good)


# ----------------------------------------------------------------------------- hostile archives


class _Marker:
    """Unpickling this creates ``path`` (via ``open(path, "w")``): proof that something unpickled it."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _zip_bytes(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def hostile_zip(path: Path, sentinel: Path, marker: Path, n_tiny: int) -> tuple[dict[str, str], int]:
    """A class-folder zip: four valid images per class, and one of each kind of hostile entry.

    Returns:
        hostile entry name -> a word its rejection reason must contain; the number of valid images.
    """
    payload = pickle.dumps(_Marker(marker))
    bomb = zipfile.ZipInfo("circle/bomb.png")
    bomb.compress_type = zipfile.ZIP_DEFLATED
    link = zipfile.ZipInfo("circle/link.png")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    hostile = {
        "../../escape.png": "climbs out",
        f"../../{sentinel.name}/escape.png": "climbs out",
        f"{sentinel}/absolute.png": "absolute path",
        "..\\..\\windows.png": "backslashes",
        "circle/link.png": "symbolic link",
        "circle/inner.zip": "nested archive",
        "square/disguised.png": "nested archive",
        "circle/bomb.png": "zip bomb",
        "square/huge.png": "limit",
        "circle/0.png": "duplicate",
        "circle/readme.txt": "not a recognized image",
        "circle/model.safetensors": "not a recognized image",
        "square/weights.pt": "not a recognized image",
        "square/weights.pkl": "not a recognized image",
    }
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore", UserWarning)  # the duplicate name is the point
        for kind in ("circle", "square"):
            for seed in range(4):
                archive.writestr(f"{kind}/{seed}.png", shape_png(kind, seed))
        archive.writestr("../../escape.png", shape_png("circle", 50))
        archive.writestr(f"../../{sentinel.name}/escape.png", shape_png("circle", 51))
        archive.writestr(f"{sentinel}/absolute.png", shape_png("circle", 52))
        archive.writestr("..\\..\\windows.png", shape_png("circle", 53))
        archive.writestr(link, "/etc/passwd")
        archive.writestr("circle/inner.zip", _zip_bytes({"circle/9.png": shape_png("circle", 9)}))
        archive.writestr("square/disguised.png", _zip_bytes({"square/9.png": shape_png("square", 9)}))
        archive.writestr(bomb, bytes(8 * MB))  # ~8 KB compressed: a ratio no image has
        archive.writestr("square/huge.png", shape_png("square", 60) + bytes(33 * MB), zipfile.ZIP_DEFLATED)
        archive.writestr("circle/0.png", shape_png("circle", 99))  # a second entry with the same name
        archive.writestr("circle/readme.txt", b"a text file among the images\n")
        archive.writestr("circle/model.safetensors", payload)
        archive.writestr("square/weights.pt", payload)
        archive.writestr("square/weights.pkl", payload)
        for index in range(n_tiny):
            archive.writestr(f"tiny/{index}.png", b"%d" % index)
    return hostile, 8


def test_a_hostile_zip_is_rejected_entry_by_entry_and_the_rest_imported(client, app, tmp_path):
    sentinel, marker = tmp_path / "sentinel", tmp_path / "unpickled-marker"
    sentinel.mkdir()
    pickle.loads(pickle.dumps(_Marker(tmp_path / "proof")))  # the payload works when unpickled…
    assert (tmp_path / "proof").exists()
    n_tiny = 2500
    hostile, n_valid = hostile_zip(tmp_path / "hostile.zip", sentinel, marker, n_tiny)
    around = sorted(p.name for p in app.data_dir.parent.iterdir())
    before, labeled = settled(app.data_dir), counts(client)

    started = time.monotonic()
    report = client.predict(handle_file(tmp_path / "hostile.zip"), api_name="/import_dataset")
    assert time.monotonic() - started < 60

    reasons = {row["name"]: row["reason"] for row in report["rejected"]}
    for name, word in hostile.items():
        assert name in reasons, f"{name} was not rejected"
        assert word in reasons[name], (name, reasons[name])
    tiny = [name for name in reasons if name.startswith("tiny/")]
    assert len(tiny) == n_tiny and all("not a recognized image" in reasons[n] for n in tiny)
    assert len(report["rejected"]) == len(hostile) + n_tiny
    assert report["images_added"] == n_valid
    assert report["pairs_added"] > 0 and counts(client)["total"] == labeled["total"] + report["pairs_added"]

    after = settled(app.data_dir)
    assert len(after["images"]) == len(before["images"]) + n_valid
    assert after["files"] == set(after["images"])  # one file per image row, nothing else under images/
    assert list(sentinel.iterdir()) == []  # nothing written outside the data directory
    assert sorted(p.name for p in app.data_dir.parent.iterdir()) == around
    assert not (app.data_dir.parent.parent / "escape.png").exists()
    assert not list(app.data_dir.rglob("*escape*")) and not list(app.data_dir.rglob("*absolute*"))
    assert not marker.exists()  # …and nothing in the import unpickled it


def test_an_export_with_hostile_rows_imports_only_what_is_sound(client, app, tmp_path):
    marker = tmp_path / "unpickled-marker"
    images = [shape_png("triangle", seed) for seed in (70, 71, 72)]
    files = {f"images/{sha(data)}.png": data for data in images}
    da, db, dc = (sha(data) for data in images)
    rows = [
        "image_a,image_b,label,annotator,created_at",
        f"{da}.png,{db}.png,same,ann,2024-01-01T00:00:00Z",
        f"../../etc/passwd,{db}.png,same,ann,2024-01-01T00:00:00Z",
        f"{da}.png,/etc/passwd,different,ann,2024-01-01T00:00:00Z",
        f"{da}.png,{dc}.png,maybe,ann,2024-01-01T00:00:00Z",
    ]
    export = {
        **files,
        f"images/{'0' * 64}.png": shape_png("triangle", 73),  # content does not match its name
        "images/model.pt": pickle.dumps(_Marker(marker)),
        "pairs.csv": "\n".join(rows).encode(),
        "metadata.json": b'{"format": "siamese-pairs", "version": 1}',
    }
    path = write(tmp_path, "export.zip", _zip_bytes(export))
    labeled = counts(client)
    report = client.predict(handle_file(path), api_name="/import_dataset")
    reasons = {row["name"]: row["reason"] for row in report["rejected"]}
    assert report["pairs_added"] == 1 and counts(client)["total"] == labeled["total"] + 1
    assert "SHA-256" in reasons[f"images/{'0' * 64}.png"]
    assert "not a recognized image" in reasons["images/model.pt"]
    assert set(reasons) >= {"pairs.csv:3", "pairs.csv:4", "pairs.csv:5"}
    assert "not among the imported images" in reasons["pairs.csv:3"] + reasons["pairs.csv:4"]
    assert "label must be" in reasons["pairs.csv:5"]
    assert not marker.exists()


# ----------------------------------------------------------------------------- what is served


def test_the_file_route_serves_pool_images_but_nothing_else(client, app, good):
    assert_still_serving(client, good)
    pool_image = next(p for p in (app.data_dir / "images").rglob("*.png"))
    assert get(f"{app.url}/gradio_api/file={pool_image}")[0] == 200  # the route itself works
    secrets = [
        "/etc/passwd",
        "../../../../../../etc/passwd",
        "%2E%2E/%2E%2E/%2E%2E/%2E%2E/etc/passwd",
        str(app.data_dir / "labels.sqlite3"),
        f"{app.data_dir / 'images'}/../labels.sqlite3",
        str(app.data_dir / "jobs"),
        str(app.log_path),
        str(Path(__file__).resolve()),
    ]
    for secret in secrets:
        status, body = get(f"{app.url}/gradio_api/file={secret}")
        assert status in (403, 404), (secret, status)
        assert b"root:" not in body and b"SQLite format" not in body


@pytest.mark.parametrize(
    "payload",
    [
        file_data("/etc/passwd"),
        "/etc/passwd",
        "PLACEHOLDER-db",
        "PLACEHOLDER-image",
        file_data("http://127.0.0.1:1/secret.png"),
        {"path": None, "url": "file:///etc/passwd", "meta": {"_type": "gradio.FileData"}},
    ],
    ids=["filedata-etc-passwd", "plain-path", "filedata-label-db", "filedata-pool-image", "local-url", "file-url"],
)
def test_a_path_instead_of_an_upload_is_refused(client, app, good, tmp_path, payload):
    outside = write(tmp_path, "outside.png", shape_png("square", 80))  # a real image nobody uploaded
    if payload == "PLACEHOLDER-db":
        payload = file_data(str(app.data_dir / "labels.sqlite3"))
    elif payload == "PLACEHOLDER-image":
        payload = file_data(str(outside))
    uploaded = file_data(upload(app.url, good[0]))  # the other side is a genuine upload
    event, result = call_raw(app.url, "score", [uploaded, file_data(upload(app.url, good[1]))])
    assert event == "complete" and -1.0 <= result[0]["similarity"] <= 1.0  # the raw call itself works
    before = settled(app.data_dir)
    for name, data in (
        ("score", [payload, uploaded]),
        ("label", [uploaded, payload, "same"]),
        ("import_dataset", [payload]),
    ):
        event, result = call_raw(app.url, name, data)
        assert event == "error", (name, result)
    after = settled(app.data_dir)
    assert after == before and sha(outside.read_bytes()) not in after["images"]
    assert_still_serving(client, good)


# ----------------------------------------------------------------------------- login


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("hardening-auth") / "data"
    with run_app(data_dir, env={"SIAMESE_AUTH": "ann:s3cret,bob:pw"}) as server:
        yield server


def test_nothing_is_reachable_without_logging_in(guarded, good):
    routes = ["/config", "/gradio_api/info", "/gradio_api/queue/status", "/gradio_api/file=/etc/passwd"]
    routes.append(f"/gradio_api/file={guarded.data_dir / 'models' / 'v0' / 'model.safetensors'}")
    for route in routes:
        status, body = get(guarded.url + route)
        assert status == 401, (route, status)
        assert b"Not authenticated" in body
    status, page = get(guarded.url + "/")
    assert status == 200 and b'"auth_required":true' in page  # the login page, not the app
    assert b"Teach a model" not in page and b"compare-run" not in page  # none of the app's components
    assert b"/score" not in page and b"label_pair" not in page  # nor the API description Gradio embeds
    assert b"window.gradio_api_info = {};" in page
    with pytest.raises(urllib.error.HTTPError) as refused:
        call_raw(guarded.url, "score", [file_data(str(good[0])), file_data(str(good[1]))])
    assert refused.value.code == 401
    with pytest.raises(Exception):  # noqa: B017 - wrong password: refused at the door
        Client(guarded.url, auth=("ann", "wrong"), verbose=False)


def test_a_logged_in_session_reaches_the_app_but_still_not_the_database(guarded, good):
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = urllib.parse.urlencode({"username": "bob", "password": "pw"}).encode()
    with opener.open(urllib.request.Request(f"{guarded.url}/login", data=form), timeout=10) as response:
        assert response.status == 200
    assert get(f"{guarded.url}/config", opener)[0] == 200
    status, page = get(f"{guarded.url}/", opener)
    assert status == 200 and b"/score" in page  # logged in: the page keeps its API description
    assert get(f"{guarded.url}/gradio_api/file={guarded.data_dir / 'labels.sqlite3'}", opener)[0] in (403, 404)
    assert get(f"{guarded.url}/gradio_api/file=/etc/passwd", opener)[0] in (403, 404)
    checkpoint = guarded.data_dir / "models" / "v0" / "model.safetensors"
    assert get(f"{guarded.url}/gradio_api/file={checkpoint}", opener)[0] == 200  # the Models tab's download

    ann = Client(guarded.url, auth=("ann", "s3cret"), verbose=False)
    result = ann.predict(handle_file(good[0]), handle_file(good[1]), "different", api_name="/label")
    assert result["created"] is True and result["total"] == 1
    uri = f"file:{guarded.data_dir / 'labels.sqlite3'}?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        assert conn.execute("SELECT annotator FROM pairs").fetchall() == [("ann",)]
