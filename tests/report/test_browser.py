"""Open real reports in headless Chromium: every image decodes, no request leaves the file.

Chromium is driven over its DevTools pipe (`tests.report.browser`), which sees every
request the page makes, including the ones its Content-Security-Policy blocks.
Skipped only when Chromium is missing and ``CI`` is not set; in CI it must run
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .browser import find_chromium, inspect_page
from .conftest import EVIL_NAME

CHROMIUM = find_chromium()
if CHROMIUM is None and not os.environ.get("CI"):
    pytestmark = pytest.mark.skip(reason="Chromium not installed (apt-get install -y chromium); "
                                         "this test runs whenever CI is set")


def test_report_in_a_real_browser(known_report, tmp_path):
    # REPORT_SCREENSHOT=path keeps the screenshot (e.g. as a CI artifact)
    shot = Path(os.environ.get("REPORT_SCREENSHOT") or tmp_path / "report.png")
    page = inspect_page(known_report.index, screenshot=shot, height=1400)
    assert page.requests and page.requests[0] == known_report.index.resolve().as_uri()
    assert page.external_requests == []
    assert page.blocked == [] and page.failed == []
    assert page.console == []  # a CSP violation would be logged here
    assert len(page.images) == 4 and page.decoded_images == 4
    assert all(i["width"] >= 400 and i["height"] >= 200 for i in page.images)
    assert page.scripts == 0
    assert page.title == "LMS tuning report: known"
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and shot.stat().st_size > 20_000


def test_script_in_a_study_name_is_text(evil_report):
    page = inspect_page(evil_report.index)
    assert page.h1 == f"LMS tuning report: {EVIL_NAME}"
    assert page.title == f"LMS tuning report: {EVIL_NAME}"
    assert page.scripts == 0 and page.console == []
    assert page.external_requests == [] and page.decoded_images == len(page.images) == 3


def test_the_check_catches_a_page_that_reaches_out(tmp_path):
    """The same inspection on a page that asks for a remote image: it must see the attempt."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; img-src data:\"></head><body>"
        '<img src="http://192.0.2.1/x.png"><img src="data:image/gif;base64,'
        'R0lGODlhAQABAIAAAP///wAAACH5BAEAAAAALAAAAAABAAEAAAICRAEAOw=="></body></html>')
    page = inspect_page(bad)
    assert page.external_requests == ["http://192.0.2.1/x.png"]
    assert page.blocked == [("http://192.0.2.1/x.png", "csp")]
    assert any("Content Security Policy" in line for line in page.console)
    assert len(page.images) == 2 and page.decoded_images == 1
