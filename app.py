"""Serves siamese: settings from the environment and flags (``python app.py --help``), then the app.

Gradio's own GRADIO_SERVER_NAME / GRADIO_SERVER_PORT choose the address. The model loads in a
background thread, so the page is served at once.
"""

import logging

from siamese.config import parse_settings
from siamese.service import ModelService
from siamese.ui import build_ui, launch_options


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up requests
    settings = parse_settings(argv)
    service = ModelService(settings)
    build_ui(service).launch(**launch_options(service, settings))


if __name__ == "__main__":
    main()
