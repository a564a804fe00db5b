"""The Gradio app: five tabs over one :class:`~siamese.service.ModelService`, and the named API.

:func:`build_ui` lays out Compare, Label, Train, Dataset and Models; every callback is a short adapter
that calls the service and formats its answer. The public endpoints of ``shared/API.md`` are wired
separately (:func:`_wire_api`) over hidden components, so their names, parameters and returns stay
fixed however the screens change; the screens' own events are private (not in ``view_api()``).
Service errors (ValueError, LookupError, RuntimeError) reach the user as ``gr.Error`` with the
service's message, never as a traceback.
"""

import base64
import functools
import html
from pathlib import Path

import gradio as gr
import pandas as pd
from PIL import Image, ImageDraw, ImageOps
from starlette.middleware import Middleware

from .embedmap import render
from .images import MAX_BYTES, load_image
from .loginguard import LoginPageGuard
from .rest import score_route
from .train import MODES, TrainConfig

STATIC = Path(__file__).parent / "static"
# The endpoints of shared/API.md, in its order.
API_NAMES = (
    "score",
    "label",
    "delete_pair",
    "train",
    "train_status",
    "cancel_training",
    "suggest_pair",
    "search",
    "explain",
    "export_dataset",
    "import_dataset",
    "models",
    "activate_model",
    "model_info",
)
# Screen-only events: callable by the page, neither listed nor named (so no API name is taken).
PRIVATE = {"api_visibility": "private", "api_name": False}
COMPARED = (  # rows of the before/after table: metric key, name
    ("auc", "validation AUC"),
    ("accuracy", "accuracy"),
    ("threshold", "threshold"),
    ("eer", "equal error rate"),
    ("tar_at_far_1e-2", "TAR at FAR 1%"),
)
SERVED = ("images", "exports", "models", "examples")  # data_dir folders Gradio may serve
PAGE_SIZE = 24  # labeled pairs per page in the Dataset tab
POLL_SECONDS = 1.0  # how often every open page asks for the training status


# ----------------------------------------------------------------------------- adapters


def _message(error: Exception) -> str:
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return html.escape(str(text) or type(error).__name__, quote=False)  # gr.Error renders HTML


def _guard(fn):
    """Turns the service's user errors into ``gr.Error`` (an AppError with that message for clients)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (ValueError, LookupError, RuntimeError) as error:
            raise gr.Error(_message(error), print_exception=False) from None

    return wrapper


def _user(request: gr.Request | None) -> str:
    """The logged-in user (with SIAMESE_AUTH), else ``anonymous``."""
    return getattr(request, "username", None) or "anonymous"


def _image_input(label: str, **kwargs) -> gr.Image:
    """An image drop zone (upload, paste, webcam). Its events use ``preprocess=False`` (see :func:`_upload`)."""
    return gr.Image(label=label, type="filepath", image_mode=None, sources=["upload", "clipboard", "webcam"], **kwargs)


def _upload(payload: dict | str | None) -> str | bytes | None:
    """The uploaded file, untouched: its path in Gradio's cache, or the bytes of an inline ``data:`` URL.

    Events with images skip Gradio's preprocessing, which opens every upload with PIL before our code
    runs (a text file fails there without a message) and re-encodes some; the service decodes the
    file safely and says what is wrong. Gradio still checks that the path is one it received.
    """
    if not payload or isinstance(payload, str):
        return payload or None
    if payload.get("path"):
        return payload["path"]
    url = payload.get("url") or ""
    if url.startswith("data:"):
        return base64.b64decode(url.partition(",")[2])
    raise ValueError("the image did not arrive; add it again")


RAW = {"preprocess": False}  # for events whose inputs include images: each adapter calls _upload


# ----------------------------------------------------------------------------- formatting


def _score_html(score: dict | None) -> str:
    if not score:
        return '<div class="sim-card sim-empty">Add two images (upload, paste or webcam) and press Compare.</div>'
    similarity, threshold = float(score["similarity"]), float(score["threshold"])
    fill, mark = (similarity + 1) * 50, (threshold + 1) * 50  # −1…1 onto 0…100 %
    verdict, kind = ("Same", "sim-same") if score["same"] else ("Different", "sim-different")
    version = html.escape(str(score["model_version"]))
    return (
        f'<div class="sim-card {kind}">'
        f'<div class="sim-top"><span class="sim-value">{similarity:.3f}</span>'
        f'<span class="sim-verdict">{verdict}</span></div>'
        f'<div class="sim-bar"><div class="sim-fill" style="width:{fill:.1f}%"></div>'
        f'<div class="sim-mark" style="left:{mark:.1f}%" title="threshold {threshold:.3f}"></div></div>'
        f'<div class="sim-meta">cosine similarity (−1…1) · distance {float(score["distance"]):.3f} (0…2) · '
        f"threshold {threshold:.3f} · model {version}</div></div>"
    )


def _counts_html(counts: dict) -> str:
    same, different, total = int(counts["same"]), int(counts["different"]), int(counts["total"])
    share = 100 * same / total if total else 50
    return (
        f'<div class="counts"><span class="count-same">{same} same</span>'
        f'<span class="count-total">{total} labeled</span>'
        f'<span class="count-different">{different} different</span></div>'
        f'<div class="balance" title="same : different">'
        f'<div class="balance-same" style="width:{share:.1f}%"></div></div>'
    )


def _status_markdown(service) -> str:
    try:
        service.wait_ready(timeout=0)  # never block a page (or the poll) on a model still loading
        info = service.model_info()
    except RuntimeError as error:  # still loading, or failed to load
        return f"_{_message(error)}_"
    runtime = info.get("runtime") or {}
    engine = {"onnx": "ONNX Runtime", "torch": "PyTorch"}.get(runtime.get("runtime"), "")
    line = (
        f"**Model {info['model_version']}** · {info['backbone']} · threshold {float(info['threshold']):.3f} · "
        f"{info['device']}" + (f" · {engine} {runtime.get('precision', '')}" if engine else "")
    )
    notice = info.get("notice") or ("" if info.get("pretrained") else "The backbone is not pretrained.")
    line += f"  \n⚠️ {html.escape(notice, quote=False)}" if notice else ""
    note = runtime.get("note")
    return line + (f"  \nℹ️ {html.escape(note, quote=False)}" if note else "")


def _progress_html(status: dict) -> str:
    state = status.get("state", "idle")
    percent = 100 * float(status.get("progress") or 0)
    parts = [f"<b>{html.escape(state)}</b>"]
    if status.get("epoch") is not None and state == "running":
        parts.append(f"epoch {status['epoch']}")
    if status.get("loss") is not None:
        parts.append(f"loss {float(status['loss']):.4f}")
    if status.get("model_version") and state == "succeeded":
        parts.append(f"new version <b>{html.escape(str(status['model_version']))}</b>")
    message = html.escape(str(status.get("message") or ""))
    return (
        f'<div class="train-progress train-{html.escape(state)}">'
        f'<div class="progress-bar"><div class="progress-fill" style="width:{percent:.0f}%"></div></div>'
        f'<div class="progress-text">{" · ".join(parts)} — {percent:.0f}%</div>'
        f'<div class="progress-message">{message}</div></div>'
    )


def _history_frame(status: dict) -> pd.DataFrame:
    rows = status.get("history") or []
    frame = pd.DataFrame(rows, columns=["epoch", "loss", "val_auc"]) if rows else None
    if frame is None:
        return pd.DataFrame({"epoch": pd.Series(dtype=float), "loss": [], "val_auc": []})
    return frame.astype({"epoch": float, "loss": float, "val_auc": float})


def _comparison_frame(status: dict) -> pd.DataFrame:
    comparison = status.get("comparison") or {}
    before, after = comparison.get("before") or {}, comparison.get("after") or {}
    rows = [[name, _fmt(before.get(key)), _fmt(after.get(key))] for key, name in COMPARED]
    rows = [row for row in rows if row[1] or row[2]]  # only what was measured
    for key, name in (("fixed", "pairs now right"), ("broke", "pairs now wrong")):
        if key in comparison:
            value = comparison[key]
            rows.append([name, "", str(len(value) if isinstance(value, (list, tuple)) else value)])
    return pd.DataFrame(rows, columns=["metric", "before", "after"])


def _histogram_frame(status: dict) -> pd.DataFrame:
    """Distances of the validation pairs under the new model, binned (bin centres as labels), by label.

    Before any training every bin is zero: the bar chart must start with both labels present, or it
    draws no bars when data arrives.
    """
    hist = (status.get("metrics") or {}).get("histograms") or {}
    edges = hist.get("bin_edges") or [i / 10 for i in range(21)]
    rows = [
        {"distance": f"{(lo + hi) / 2:.2f}", "pairs": int(count), "label": label}
        for label in ("same", "different")
        for lo, hi, count in zip(edges[:-1], edges[1:], hist.get(label) or [0] * (len(edges) - 1), strict=False)
    ]
    return pd.DataFrame(rows, columns=["distance", "pairs", "label"]).astype({"pairs": int})


def _results_markdown(status: dict) -> str:
    if status.get("state") != "succeeded":
        return ""
    metrics = status.get("metrics") or {}
    parts = [f"**New version {status.get('model_version')}**"]
    for key, name in (("threshold", "threshold"), ("auc", "validation AUC"), ("accuracy", "accuracy")):
        if isinstance(metrics.get(key), (int, float)):
            parts.append(f"{name} {metrics[key]:.3f}")
    return " · ".join(parts)


def _pair_thumbnail(path_a: str, path_b: str, side: int = 112) -> Image.Image:
    canvas = Image.new("RGB", (2 * side + 6, side), (255, 255, 255))
    for index, path in enumerate((path_a, path_b)):
        image = load_image(path).image
        small = max(image.size) < side  # tiny digits and shapes grow, crisp; photos shrink, smooth
        image = ImageOps.contain(image, (side, side), Image.Resampling.NEAREST if small else Image.Resampling.BILINEAR)
        canvas.paste(image, (index * (side + 6) + (side - image.width) // 2, (side - image.height) // 2))
    return canvas


def _models_frame(models: list[dict]) -> pd.DataFrame:
    rows = []
    for m in models:
        metrics = m.get("metrics") or {}
        rows.append(
            {
                "": "● active" if m.get("active") else "",
                "version": m["version"],
                "created": str(m.get("created_at", ""))[:19].replace("T", " "),
                "backbone": m.get("backbone", ""),
                "parent": m.get("parent") or "—",
                "AUC": _fmt(metrics.get("auc")),
                "accuracy": _fmt(metrics.get("accuracy")),
                "threshold": _fmt(metrics.get("threshold")),
                "train pairs": metrics.get("n_train_pairs", ""),
            }
        )
    return pd.DataFrame(
        rows, columns=["", "version", "created", "backbone", "parent", "AUC", "accuracy", "threshold", "train pairs"]
    )


def _map_titles(maps: list) -> list[str]:
    """Panel titles such as "v1 (before)" and "v2 (active)": the service lists the previous model's map first."""
    return [f"{m.version} ({'active' if i == len(maps) - 1 else 'before'})" for i, m in enumerate(maps)]


def _map_note(maps: list) -> str:
    active = maps[-1]
    if len(maps) == 1:
        return (
            f"Only **{active.version}** so far: there is no previous model to compare with. After training, "
            "the map of the model it was trained from appears beside it. Each point is a pool image (PCA "
            "of its embedding); labeled images are coloured by their same-group."
        )
    before = maps[0]
    return (
        f"The same {len(active.digests):,} pool images under **{before.version}** (before, left) and "
        f"**{active.version}** (active, right); each point is an image (PCA of its embedding), labeled images "
        f"coloured by their same-group. {before.version}'s map is rotated, reflected and scaled onto "
        f"{active.version}'s (orthogonal Procrustes), so what moved is what the model learned."
    )


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def _import_summary(result: dict) -> tuple[str, pd.DataFrame]:
    rejected = result.get("rejected") or []
    text = (
        f"**Imported** {result.get('images_added', 0)} images and {result.get('pairs_added', 0)} pairs; "
        f"{result.get('skipped', 0)} already there (skipped); {len(rejected)} rejected."
    )
    return text, pd.DataFrame(rejected, columns=["name", "reason"])


# ----------------------------------------------------------------------------- example images


def example_pairs(directory: Path) -> list[list[str]]:
    """A few small coloured-shape pairs to try, drawn once under ``directory`` (nothing committed)."""
    directory.mkdir(parents=True, exist_ok=True)
    shapes = {
        "red-circle-1": ("ellipse", (220, 40, 40), (20, 20, 100, 100)),
        "red-circle-2": ("ellipse", (200, 30, 60), (36, 30, 112, 106)),
        "blue-square-1": ("rectangle", (40, 70, 220), (24, 24, 100, 100)),
        "blue-square-2": ("rectangle", (60, 60, 200), (12, 30, 92, 110)),
        "green-triangle": ("polygon", (40, 170, 60), [(64, 14), (114, 110), (14, 110)]),
    }
    paths = {}
    for name, (kind, color, geometry) in shapes.items():
        path = directory / f"{name}.png"
        if not path.exists():
            image = Image.new("RGB", (128, 128), (245, 245, 240))
            getattr(ImageDraw.Draw(image), kind)(geometry, fill=color)
            image.save(path)
        paths[name] = str(path)
    pairs = [
        ("red-circle-1", "red-circle-2"),
        ("blue-square-1", "blue-square-2"),
        ("red-circle-1", "blue-square-1"),
        ("green-triangle", "red-circle-2"),
    ]
    return [[paths[a], paths[b]] for a, b in pairs]


# ----------------------------------------------------------------------------- tabs


def _compare_tab(service) -> None:
    with gr.Row(equal_height=True):
        image_a = _image_input("Image A", height=300, elem_id="compare-a")
        image_b = _image_input("Image B", height=300, elem_id="compare-b")
    with gr.Row():
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        same = gr.Button("Label: same", elem_id="compare-same")
        different = gr.Button("Label: different", elem_id="compare-different")
    result = gr.HTML(_score_html(None), elem_id="compare-result")
    note = gr.Markdown(elem_id="compare-note")
    examples = example_pairs(service.data_dir / "examples")
    gr.Examples(examples, [image_a, image_b], label="Example pairs", api_visibility="private")
    with gr.Accordion("Why? Heat maps of what drives the similarity", open=False):
        explain = gr.Button("Explain this pair")
        with gr.Row():
            heat_a = gr.Image(label="A: what matters", interactive=False, height=240)
            heat_b = gr.Image(label="B: what matters", interactive=False, height=240)
    with gr.Accordion("Find similar images in the pool (to image A)", open=False):
        find = gr.Button("Search")
        found = gr.Gallery(label="Most similar first", columns=6, height=220)

    @_guard
    def compare(a, b):
        return _score_html(service.score(_upload(a), _upload(b)))

    @_guard
    def score_when_both(a, b):  # every upload joins the pool at once; with both images, the score
        for image in (a, b):
            if image:
                service.add_image(_upload(image))
        return compare(a, b) if a and b else gr.skip()

    def label_with(label):
        @_guard
        def label_pair(a, b, request: gr.Request):
            r = service.label(_upload(a), _upload(b), label, annotator=_user(request))
            return f"Labeled **{label}** ({'new pair' if r['created'] else 'label replaced'}) — {_counts_text(r)}"

        return label_pair

    @_guard
    def search(a):
        hits = service.search(_upload(a), k=12)
        return [(str(service.image_path(h["image_id"])), f"{h['similarity']:.3f}") for h in hits]

    @_guard
    def explain_pair(a, b):
        return service.explain(_upload(a), _upload(b))[:2]

    pair = [image_a, image_b]
    run.click(compare, pair, result, **RAW, **PRIVATE)
    image_a.upload(score_when_both, pair, result, **RAW, **PRIVATE)
    image_b.upload(score_when_both, pair, result, **RAW, **PRIVATE)
    same.click(label_with("same"), pair, note, **RAW, **PRIVATE)
    different.click(label_with("different"), pair, note, **RAW, **PRIVATE)
    explain.click(explain_pair, pair, [heat_a, heat_b], **RAW, **PRIVATE)
    find.click(search, image_a, found, **RAW, **PRIVATE)


def _counts_text(counts: dict) -> str:
    return f"{counts['total']} labeled: {counts['same']} same, {counts['different']} different"


def _label_tab(service):
    gr.Markdown(
        "Are these the same? Keys: **S** same · **D** different · **Space** skip · **Z** undo "
        "(not while typing). Drop your own images on either side to judge them instead.",
        elem_classes="hint",
    )
    with gr.Row(equal_height=True):
        image_a = _image_input("A", height=320, elem_id="label-a")
        image_b = _image_input("B", height=320, elem_id="label-b")
    reason = gr.Markdown(elem_id="label-reason")
    with gr.Row():
        same = gr.Button("Same  [S]", variant="primary", elem_id="label-same")
        different = gr.Button("Different  [D]", variant="stop", elem_id="label-different")
        skip = gr.Button("Skip  [Space]", elem_id="label-skip")
        undo = gr.Button("Undo  [Z]", elem_id="label-undo")
    counts = gr.HTML(elem_id="label-counts")

    def next_pair():
        try:
            a, b, info = service.pair_to_judge()
        except (ValueError, LookupError, RuntimeError) as error:
            return None, None, f"_{_message(error)}_"
        why = html.escape(str(info.get("reason", "")), quote=False)
        return str(a), str(b), f"Model similarity {float(info['similarity']):.3f} — {why}"

    def judge(label):
        @_guard
        def judge_pair(a, b, request: gr.Request):
            result = service.label(_upload(a), _upload(b), label, annotator=_user(request))
            return (*next_pair(), _counts_html(result))

        return judge_pair

    @_guard
    def take_back(request: gr.Request):
        result = service.undo(annotator=_user(request))
        done = "Took back your last label." if result.get("pair_id") else "Nothing of yours to undo."
        return done, _counts_html(result)

    def refresh(a, b):
        shown = (gr.skip(), gr.skip(), gr.skip()) if a and b else next_pair()
        return (*shown, _counts_html(service.counts()))

    outputs = [image_a, image_b, reason, counts]
    common = {"trigger_mode": "once", **PRIVATE}
    same.click(judge("same"), [image_a, image_b], outputs, **RAW, **common)
    different.click(judge("different"), [image_a, image_b], outputs, **RAW, **common)
    skip.click(lambda: next_pair(), None, [image_a, image_b, reason], **common)
    undo.click(take_back, None, [reason, counts], **common)
    return refresh, [image_a, image_b], outputs


def _train_tab(service):
    defaults = TrainConfig()
    with gr.Row():
        epochs = gr.Number(
            defaults.epochs, label="epochs", precision=0, minimum=1, info="early stopping may end sooner"
        )
        learning_rate = gr.Number(defaults.learning_rate, label="learning rate", minimum=0, step=1e-4)
        margin = gr.Number(defaults.margin, label="margin", minimum=0, maximum=2, step=0.1, info="on the distance, 0…2")
        batch_size = gr.Number(defaults.batch_size, label="batch size", precision=0, minimum=2, info="pairs per step")
        mode = gr.Radio(list(MODES), value=defaults.mode, label="mode", info="head: projection only · full: all layers")
    with gr.Row():
        start = gr.Button("Start training", variant="primary", elem_id="train-start")
        cancel = gr.Button("Cancel", variant="stop", elem_id="train-cancel", interactive=False)
    progress = gr.HTML(_progress_html({"state": "idle"}), elem_id="train-progress")
    with gr.Row():
        loss_plot = gr.LinePlot(_history_frame({}), x="epoch", y="loss", title="Training loss", height=220)
        auc_plot = gr.LinePlot(
            _history_frame({}), x="epoch", y="val_auc", title="Validation AUC", y_lim=[0.0, 1.0], height=220
        )
    results = gr.Markdown(elem_id="train-results")
    with gr.Row():
        comparison = gr.Dataframe(
            _comparison_frame({}), label="Before → after (validation pairs)", interactive=False, max_height=260
        )
        histogram = gr.BarPlot(
            _histogram_frame({}),
            x="distance",
            y="pairs",
            color="label",
            title="Distances of validation pairs (new model)",
            color_map={"same": "#2f9e44", "different": "#e03131"},
            height=220,
        )

    @_guard
    def train(epochs, learning_rate, margin, batch_size, mode):
        service.train(epochs=epochs, learning_rate=learning_rate, margin=margin, batch_size=batch_size, mode=mode)
        return _progress_html(service.train_status())

    start.click(train, [epochs, learning_rate, margin, batch_size, mode], progress, **PRIVATE)
    cancel.click(
        _guard(lambda: _progress_html({**service.train_status(), **service.cancel_training()})),
        None,
        progress,
        **PRIVATE,
    )
    outputs = [progress, loss_plot, auc_plot, results, comparison, histogram, start, cancel]
    return outputs


def _train_view(status: dict) -> tuple:
    running = status.get("state") == "running"
    return (
        _progress_html(status),
        _history_frame(status),
        _history_frame(status),
        _results_markdown(status),
        _comparison_frame(status),
        _histogram_frame(status),
        gr.Button(interactive=not running),
        gr.Button(interactive=running),
    )


def _dataset_tab(service):
    with gr.Row():
        which = gr.Dropdown(["all", "same", "different"], value="all", label="label", scale=1)
        annotator = gr.Textbox(label="annotator", placeholder="anyone", scale=2)
        page = gr.Number(value=1, label="page", precision=0, minimum=1, scale=1)
        refresh = gr.Button("Refresh", scale=1)
    gallery = gr.Gallery(
        label="Labeled pairs (newest first)",
        columns=4,
        height=420,
        allow_preview=False,
        object_fit="contain",
        elem_id="dataset-gallery",
    )
    pairs = gr.State([])
    selected = gr.State(None)
    with gr.Row():
        chosen = gr.Markdown("Click a pair to relabel or delete it.", elem_id="dataset-selected")
        mark_same = gr.Button("Mark same", size="sm")
        mark_different = gr.Button("Mark different", size="sm")
        delete = gr.Button("Delete pair", variant="stop", size="sm")
    with gr.Row():
        with gr.Column():
            upload = gr.File(
                label="Import a zip (an export, or class folders class_name/image.png)",
                file_types=[".zip"],
                height=140,
                elem_id="dataset-import-file",
            )
            run_import = gr.Button("Import", variant="primary", elem_id="dataset-import")
            summary = gr.Markdown(elem_id="import-summary")
            rejected = gr.Dataframe(
                pd.DataFrame(columns=["name", "reason"]), label="Rejected files", interactive=False, max_height=200
            )
        with gr.Column():
            run_export = gr.Button("Export dataset (zip)", elem_id="dataset-export")
            download = gr.DownloadButton("Download export", visible=False, elem_id="dataset-download")
            gr.Markdown("The zip holds `images/`, `pairs.csv` and `metadata.json`; import it into another instance.")

    def listing(which, annotator, page):
        found = service.list_pairs(
            label=None if which == "all" else which,
            annotator=(annotator or "").strip() or None,
            offset=(max(1, int(page or 1)) - 1) * PAGE_SIZE,
            limit=PAGE_SIZE,
        )
        shown = [
            (_pair_thumbnail(p["image_a"], p["image_b"]), f"{p['label']} · {p['annotator']} · {p['created_at'][:10]}")
            for p in found
        ]
        return shown, found, None, "Click a pair to relabel or delete it."

    def select(found, event: gr.SelectData):
        pair = found[event.index]
        who = html.escape(pair["annotator"])
        text = f"Selected `{pair['pair_id']}`: **{pair['label']}** by {who}, {pair['created_at'][:19]}"
        return pair["pair_id"], text

    def change(action):
        @_guard
        def act(pair_id, which, annotator, page, request: gr.Request):
            if not pair_id:
                raise gr.Error("Click a pair first.")
            if action == "delete":
                service.delete_pair(pair_id)
            else:
                service.relabel(pair_id, action, annotator=_user(request))
            return listing(which, annotator, page)

        return act

    @_guard
    def import_zip(path, which, annotator, page, progress=gr.Progress(track_tqdm=True)):
        if not path:
            raise gr.Error("Choose a zip file to import first.")
        text, table = _import_summary(service.import_dataset(path))
        return text, table, *listing(which, annotator, page)

    filters = [which, annotator, page]
    shown = [gallery, pairs, selected, chosen]
    for trigger in (refresh.click, which.change, page.submit, annotator.submit):
        trigger(_guard(listing), filters, shown, **PRIVATE)
    gallery.select(select, pairs, [selected, chosen], **PRIVATE)
    mark_same.click(change("same"), [selected, *filters], shown, **PRIVATE)
    mark_different.click(change("different"), [selected, *filters], shown, **PRIVATE)
    delete.click(change("delete"), [selected, *filters], shown, **PRIVATE)
    run_import.click(import_zip, [upload, *filters], [summary, rejected, *shown], **PRIVATE)
    run_export.click(
        _guard(lambda: gr.DownloadButton(value=str(service.export_dataset()), visible=True)), None, download, **PRIVATE
    )
    return _guard(listing), filters, shown


def _models_tab(service):
    table = gr.Dataframe(
        _models_frame([]),
        label="Model versions (lineage: parent)",
        interactive=False,
        max_height=360,
        elem_id="models-table",
    )
    with gr.Row():
        version = gr.Dropdown([], label="version", scale=2, elem_id="models-version")
        activate = gr.Button("Activate (roll back / forward)", variant="primary", scale=1, elem_id="models-activate")
        download = gr.DownloadButton("Download checkpoint (.safetensors)", scale=1, elem_id="models-download")
    done = gr.Markdown()
    with gr.Accordion("Embedding maps of the pool: the previous model beside the active one", open=False):
        show_map = gr.Button("Draw the maps", elem_id="models-map-draw")
        map_note = gr.Markdown(elem_id="models-map-note")
        embedding_map = gr.Image(  # no label: it would cover the left panel's title
            label="Embedding maps", show_label=False, type="pil", interactive=False, elem_id="models-map"
        )

    @_guard
    def draw_map():
        maps = service.embedding_maps()
        return _map_note(maps), render(maps, titles=_map_titles(maps))

    show_map.click(draw_map, None, [map_note, embedding_map], **PRIVATE)

    def view(chosen=None):
        models = service.models()
        names = [m["version"] for m in models]
        active = next((m["version"] for m in models if m.get("active")), names[-1] if names else None)
        chosen = chosen if chosen in names else active
        return _models_frame(models), gr.Dropdown(choices=names, value=chosen), _checkpoint(chosen)

    def _checkpoint(name):
        return gr.DownloadButton(value=str(service.checkpoint_file(name)) if name else None)

    @_guard
    def make_active(name):
        result = service.activate(name)
        return *view(result["model_version"]), f"Now serving **{result['model_version']}**."

    version.input(_guard(_checkpoint), version, download, **PRIVATE)
    activate.click(make_active, version, [table, version, download, done], **PRIVATE)
    return _guard(view), [table, version, download], done


# ----------------------------------------------------------------------------- API


def _wire_api(service) -> None:
    """The named endpoints of shared/API.md, over components nobody sees (clients call them)."""
    with gr.Column(visible=False):
        image_a, image_b = _image_input("image_a"), _image_input("image_b")
        image, k = _image_input("image"), gr.Number(value=8, label="k", precision=0)
        label, pair_id, version = gr.Textbox(label="label"), gr.Textbox(label="pair_id"), gr.Textbox(label="version")
        epochs = gr.Number(value=None, label="epochs", precision=0)
        learning_rate, margin = gr.Number(value=None, label="learning_rate"), gr.Number(value=None, label="margin")
        batch_size = gr.Number(value=None, label="batch_size", precision=0)
        mode = gr.Textbox(value="auto", label="mode")
        archive = gr.File(label="file")
        result = gr.JSON(label="result")
        out_a, out_b = gr.Image(label="image_a", type="filepath"), gr.Image(label="image_b", type="filepath")
        out_file = gr.File(label="file")

    def score(image_a, image_b):
        return service.score(_upload(image_a), _upload(image_b))

    def label_pair(image_a, image_b, label, request: gr.Request):
        return service.label(_upload(image_a), _upload(image_b), label, annotator=_user(request))

    def delete_pair(pair_id):
        return service.delete_pair(pair_id)

    def train(epochs=None, learning_rate=None, margin=None, batch_size=None, mode="auto"):
        return service.train(
            epochs=epochs, learning_rate=learning_rate, margin=margin, batch_size=batch_size, mode=mode
        )

    def suggest_pair():
        a, b, info = service.suggest_pair()
        return str(a), str(b), info

    def search(image, k=8):
        return service.search(_upload(image), k=int(k if k is not None else 8))

    def explain(image_a, image_b):
        return service.explain(_upload(image_a), _upload(image_b))

    def export_dataset():
        return str(service.export_dataset())

    def import_dataset(file):
        if not file:
            raise ValueError("no file given: pass a zip (an export, or class folders) with handle_file(path)")
        return service.import_dataset(file)

    def activate_model(version):
        return service.activate(version)

    def endpoint(fn, inputs, outputs, *, api_name: str, raw: bool = False) -> None:
        gr.on(
            triggers=[],
            fn=_guard(fn),
            inputs=inputs,
            outputs=outputs,
            api_name=api_name,
            preprocess=not raw,
            concurrency_limit=None,
        )

    # raw=True: images arrive as uploaded (see _upload), and /train's options reach TrainConfig, whose
    # messages are clear (Gradio's Number fails on "abc" with an error clients see without its text).
    endpoint(score, [image_a, image_b], result, api_name="score", raw=True)
    endpoint(label_pair, [image_a, image_b, label], result, api_name="label", raw=True)
    endpoint(delete_pair, [pair_id], result, api_name="delete_pair")
    endpoint(train, [epochs, learning_rate, margin, batch_size, mode], result, api_name="train", raw=True)
    endpoint(service.train_status, [], result, api_name="train_status")
    endpoint(service.cancel_training, [], result, api_name="cancel_training")
    endpoint(suggest_pair, [], [out_a, out_b, result], api_name="suggest_pair")
    endpoint(search, [image, k], result, api_name="search", raw=True)
    endpoint(explain, [image_a, image_b], [out_a, out_b, result], api_name="explain", raw=True)
    endpoint(export_dataset, [], out_file, api_name="export_dataset")
    endpoint(import_dataset, [archive], result, api_name="import_dataset")
    endpoint(service.models, [], result, api_name="models")
    endpoint(activate_model, [version], result, api_name="activate_model")
    endpoint(service.model_info, [], result, api_name="model_info")


# ----------------------------------------------------------------------------- the app


def build_ui(service) -> gr.Blocks:
    """The app over ``service``; nothing runs until it is launched."""
    # Uploads are copied into the store when used; Gradio's own copies go after an hour (checked hourly).
    with gr.Blocks(title="siamese — what similar means to you", delete_cache=(3600, 3600)) as demo:
        _wire_api(service)  # first, so the contract's names are never taken by a screen event
        with gr.Row(elem_id="header"):
            gr.Markdown("## siamese\nTeach a model what *similar* means for your images.", elem_id="title")
            status = gr.Markdown(elem_id="model-status")
        with gr.Tabs():
            with gr.Tab("Compare", id="compare"):
                _compare_tab(service)
            with gr.Tab("Label", id="label") as label_tab:
                refresh_label, label_inputs, label_outputs = _label_tab(service)
            with gr.Tab("Train", id="train"):
                train_outputs = _train_tab(service)
            with gr.Tab("Dataset", id="dataset") as dataset_tab:
                listing, filters, listed = _dataset_tab(service)
            with gr.Tab("Models", id="models") as models_tab:
                models_view, models_outputs, _ = _models_tab(service)

        # Every open page polls: a job started anywhere shows its progress here, and a new active model
        # (trained or rolled back in another tab) updates the header and the Models tab.
        seen = gr.State((None, None))  # (training status key, header) last drawn: redraw only on change
        timer = gr.Timer(POLL_SECONDS)

        def poll(last):
            status, header = service.train_status(), _status_markdown(service)
            key = tuple(status.get(k) for k in ("state", "job_id", "epoch", "progress", "model_version"))
            train = _train_view(status) if key != last[0] else (gr.skip(),) * len(train_outputs)
            model = (header, *models_view()) if header != last[1] else (gr.skip(),) * (1 + len(models_outputs))
            return (*train, *model, (key, header))

        timer.tick(
            poll,
            seen,
            [*train_outputs, status, *models_outputs, seen],
            show_progress="hidden",
            concurrency_limit=None,
            **PRIVATE,
        )
        label_tab.select(_guard(refresh_label), label_inputs, label_outputs, **RAW, **PRIVATE)
        dataset_tab.select(listing, filters, listed, **PRIVATE)
        models_tab.select(models_view, None, models_outputs, **PRIVATE)
    return demo


def launch_options(service, settings) -> dict:
    """Arguments for ``demo.launch``: what may be served, the upload limit, login, and the page assets."""
    return {
        # What the app hands out (pool images, exports, checkpoints, examples), never the whole data
        # directory: labels.sqlite3 and the job records must not be downloadable.
        "allowed_paths": [str(Path(service.data_dir).resolve() / part) for part in SERVED],
        "max_file_size": MAX_BYTES,
        "auth": list(settings.auth) or None,
        "auth_message": "Log in to label: each label records who made it.",
        "css_paths": [STATIC / "app.css"],
        "js": (STATIC / "shortcuts.js").read_text(),
        "theme": gr.themes.Soft(primary_hue="indigo"),
        "ssr_mode": False,
        "app_kwargs": {
            "routes": [score_route(service, settings.auth)],  # POST /v1/score: one request per pair
            # Gradio embeds the API description in its login page; the guard takes it out.
            "middleware": [Middleware(LoginPageGuard)] if settings.auth else [],
        },
    }
