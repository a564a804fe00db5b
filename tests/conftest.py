"""Shared test set-up: slow and browser tests run with --all (CI runs everything)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all", action="store_true", help="also run the slow and browser tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--all"):
        return
    skip = pytest.mark.skip(reason="slow or browser test: run with --all")
    for item in items:
        if "slow" in item.keywords or "browser" in item.keywords:
            item.add_marker(skip)
