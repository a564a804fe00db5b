"""The app in a real browser: Debian's Chromium driven by Playwright against ``python app.py``.

Screenshots of every tab go to ``$SIAMESE_SCREENSHOTS`` (default: a temporary folder). Tests run in
file order against one server: the pool is seeded first, then labels, training, export.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import pytest

from tests.appserver import class_folders_zip, run_app, shape_png

pytestmark = [pytest.mark.slow, pytest.mark.browser]

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with run_app(tmp_path_factory.mktemp("browser") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("SIAMESE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(app.url)
    page.locator("#model-status").get_by_text(re.compile(r"Model v\d+")).wait_for()  # the model has loaded
    yield page
    context.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("files")
    made = {
        "circle": folder / "circle.png",
        "square": folder / "square.png",
        "notes": folder / "notes.txt",
        "broken": folder / "broken.png",
        "classes": class_folders_zip(folder / "classes.zip"),
    }
    made["circle"].write_bytes(shape_png("circle", 100))
    made["square"].write_bytes(shape_png("square", 100))
    made["notes"].write_text("these are notes, not a picture\n")
    made["broken"].write_text("these are notes too, named like a picture\n")
    return made


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def counts(page) -> tuple[int, int, int]:
    text = page.locator("#label-counts").inner_text()
    same, total, different = (int(n) for n in re.findall(r"(\d+) (?:same|labeled|different)", text))
    return same, different, total


def test_upload_two_images_and_see_a_score(page, files, shots):
    page.locator("#compare-a input[type=file]").set_input_files(files["circle"])
    page.locator("#compare-b input[type=file]").set_input_files(files["square"])
    value = page.locator("#compare-result .sim-value")
    value.wait_for()  # scored as soon as both are there
    assert -1.0 <= float(value.inner_text()) <= 1.0
    verdict = page.locator("#compare-result .sim-verdict").inner_text()
    assert verdict in ("Same", "Different")
    assert "model v" in page.locator("#compare-result .sim-meta").inner_text()
    page.screenshot(path=shots / "1-compare.png", full_page=True)


def test_a_bad_file_shows_a_readable_error(page, files, shots):
    page.locator("#compare-a input[type=file]").set_input_files(files["notes"])
    page.get_by_text("Invalid file type: notes.txt").wait_for()  # the page refuses what is not an image
    page.locator("#compare-a input[type=file]").set_input_files(files["broken"])
    page.locator("#compare-b input[type=file]").set_input_files(files["square"])
    page.get_by_text(re.compile("not a recognized image; supported formats")).first.wait_for()  # the server's
    page.screenshot(path=shots / "2-compare-error.png", full_page=True)
    expect(page.locator("#compare-result .sim-value")).to_have_count(0)


def test_import_class_folders_in_the_dataset_tab(page, files, shots):
    open_tab(page, "Dataset")
    page.locator("#dataset-import-file input[type=file]").set_input_files(files["classes"])
    page.locator("#dataset-import").click()
    summary = page.locator("#import-summary")
    summary.get_by_text(re.compile(r"Imported 18 images")).wait_for()
    page.locator("#dataset-gallery img").first.wait_for()
    page.screenshot(path=shots / "3-dataset.png", full_page=True)


def shown_pair(page) -> tuple[str | None, str | None]:
    return page.locator("#label-a img").get_attribute("src"), page.locator("#label-b img").get_attribute("src")


def wait_for_another_pair(page, before: tuple[str | None, str | None], what: str) -> None:
    for _ in range(100):
        if shown_pair(page) != before:
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"{what}: the pair on screen did not change")


def test_label_ten_pairs_with_the_keyboard(page, shots):
    open_tab(page, "Label")
    page.locator("#label-a img").wait_for()  # a suggested pair is showing
    total = page.locator("#label-counts .count-total")
    total.wait_for()
    start = counts(page)
    labeled, reviews = start[2], 0
    for index in range(10):
        before = shown_pair(page)
        # a contradiction offered for review is a pair labeled before: judging it replaces its label
        reviewing = "review:" in page.locator("#label-reason").inner_text()
        page.keyboard.press("s" if index % 2 == 0 else "d")
        labeled += 0 if reviewing else 1
        reviews += reviewing
        expect(total).to_have_text(f"{labeled} labeled")
        wait_for_another_pair(page, before, f"key {index}")  # the next pair is up before the next key
    same, different, now = counts(page)
    assert now == start[2] + 10 - reviews and same + different == now
    page.screenshot(path=shots / "4-label.png", full_page=True)
    page.keyboard.press("z")  # undo takes the last label back (a replaced label returns: no pair goes)
    labeled -= 0 if reviewing else 1
    expect(total).to_have_text(f"{labeled} labeled")
    before = shown_pair(page)
    page.keyboard.press(" ")  # skip shows another pair and labels nothing
    wait_for_another_pair(page, before, "skip")
    expect(total).to_have_text(f"{labeled} labeled")


def test_train_shows_progress_and_a_new_version_in_every_open_page(page, app, shots):
    watcher = page.context.new_page()  # another tab, open before the job starts
    watcher.goto(app.url)
    open_tab(watcher, "Train")
    open_tab(page, "Train")
    page.get_by_label("epochs").fill("4")
    page.locator("#train-start").click()
    progress = page.locator("#train-progress")
    progress.get_by_text(re.compile("running|succeeded")).wait_for()
    progress.get_by_text("succeeded").wait_for(timeout=120_000)
    version = re.search(r"new version (v\d+)", progress.inner_text()).group(1)
    assert version != "v0"
    page.locator("#model-status").get_by_text(f"Model {version}").wait_for()
    page.locator("#train-results").get_by_text(f"New version {version}").wait_for()
    expect(page.locator("#train-start")).to_be_enabled()
    expect(page.locator("#train-cancel")).to_be_disabled()
    page.wait_for_timeout(500)  # let the progress bar finish its transition
    page.screenshot(path=shots / "5-train.png", full_page=True)
    watcher.locator("#train-progress").get_by_text(f"new version {version}").wait_for()
    watcher.locator("#model-status").get_by_text(f"Model {version}").wait_for()
    watcher.close()


def test_export_downloads_a_zip(page, tmp_path, shots):
    open_tab(page, "Dataset")
    page.locator("#dataset-export").click()
    button = page.locator("#dataset-download")
    button.wait_for()
    with page.expect_download() as download:
        button.click()
    saved = tmp_path / "export.zip"
    download.value.save_as(saved)
    with zipfile.ZipFile(saved) as archive:
        names = archive.namelist()
    assert "pairs.csv" in names and "metadata.json" in names
    assert any(name.startswith("images/") for name in names)


def test_models_tab_draws_the_previous_map_beside_the_active_one(page, shots):
    open_tab(page, "Models")
    page.get_by_text("Embedding maps of the pool").click()  # the accordion
    page.locator("#models-map-draw").click()
    note = page.locator("#models-map-note")
    note.get_by_text(re.compile(r"v0 \(before, left\) and v1 \(active, right\)")).wait_for()
    picture = page.locator("#models-map img")
    expect(picture).to_be_visible()
    assert picture.evaluate("img => img.naturalWidth / img.naturalHeight") > 1.5  # two panels side by side
    page.screenshot(path=shots / "6-models-maps.png", full_page=True)


def test_models_tab_lists_versions_and_rolls_back(page, shots):
    open_tab(page, "Models")
    table = page.locator("#models-table")
    table.get_by_text("v1").first.wait_for()
    page.screenshot(path=shots / "6-models.png", full_page=True)
    page.locator("#models-version input").fill("v0")
    page.keyboard.press("Enter")
    page.locator("#models-activate").click()
    page.locator("#model-status").get_by_text("Model v0").wait_for()
