"""The pages' browser: Debian's headless Chromium driven by Playwright, one per module, and a page on the
module's `server` that fails its test if it asks another origin or logs an error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.server_process import ServerProcess
from tests.service.api.web.browser import CHROMIUM, CHROMIUM_ARGS, Watched


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium package (.ci/run installs it)")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def watched(browser: Any, server: ServerProcess) -> Iterator[Watched]:
    watched = Watched(browser, server.base_url)
    yield watched
    watched.check_and_close()
