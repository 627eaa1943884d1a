"""A real headless Chromium (Debian ``chromium``, PyPI ``playwright``) drives the UI: launch a
tiny job that really trains, watch it finish, open a sample's coloured tokens, compare two
versions, then launch a compare job and view its prompts side by side.

Screenshots go to the test's ``tmp_path``; with ``RLWB_UPDATE_SCREENSHOTS=1`` the best are
copied to ``docs/screenshots/`` for the README. Chromium is required when ``CI=true``.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.ui.conftest import new_repository
from tests.ui.threaded import ThreadQueue
from ui.app import build_app

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
JOB_TIMEOUT_MS = 90_000

pytestmark = pytest.mark.slow


def _require_browser():
    """The playwright module; fails under CI=true, else skips, when the browser is missing."""
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is missing (apt-get install chromium)"
    try:
        from playwright import sync_api
    except ImportError:
        missing = "the playwright package is missing (pip install playwright)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}; required because CI=true", pytrace=False)
        pytest.skip(missing)
    return sync_api


@pytest.fixture
def app(tmp_path):
    """The UI over a fresh database, whose jobs run the real trainer in threads, with a
    tiny checkpoint under the model root."""
    from core_engine.toy import save_tiny_checkpoint

    models = tmp_path / "models"
    checkpoint = save_tiny_checkpoint(models / "tiny", alphabet="0123456789?=+")
    repo = new_repository(tmp_path)
    queue = ThreadQueue(repo, tmp_path / "data")
    demo = build_app(queue.services((models,)))
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        yield demo.local_url, checkpoint
    finally:
        demo.close()
        queue.join(timeout=60)
        repo.close()


def _choose(page, elem_id: str, option: str | re.Pattern) -> None:
    """Pick an option of a Gradio dropdown."""
    page.locator(f"#{elem_id} input").click()
    page.locator(f"#{elem_id}").get_by_role("option", name=option).first.click()


def _shot(page, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    if os.environ.get("RLWB_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, SCREENSHOTS / path.name)


def _data_rows(page, elem_id: str):
    """The body rows of a Gradio 6 Dataframe (an ARIA grid; the first row is the header)."""
    return page.locator(f"#{elem_id}").get_by_role("row").filter(has=page.get_by_role("gridcell"))


def test_launch_watch_inspect_compare(app, tmp_path):
    sync_api = _require_browser()
    expect = sync_api.expect
    url, checkpoint = app
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(20_000)
            page.goto(url)

            # Launch: a tiny always-7 job on the checkpoint under the model root.
            _choose(page, "launch-model", str(checkpoint))
            _choose(page, "launch-task", re.compile("^always7"))
            for elem_id, value in (
                ("launch-steps", "3"),
                ("launch-batch", "4"),
                ("launch-group", "4"),
                ("launch-lr", "0.003"),
                ("launch-max-tokens", "3"),
            ):
                page.locator(f"#{elem_id} input").fill(value)
            page.wait_for_timeout(300)  # let the dropdown lists fade out
            _shot(page, tmp_path, "launch")
            page.locator("#launch-button").click()
            status = page.locator("#launch-status")
            expect(status).to_contain_text(re.compile(r"Job #1 is (queued|running)"))

            # Jobs: the live table shows it succeed; open it.
            page.get_by_role("tab", name="Jobs").click()
            done = _data_rows(page, "jobs-table").filter(has_text="succeeded")
            expect(done).to_have_count(1, timeout=JOB_TIMEOUT_MS)
            expect(done).to_contain_text("3/3")
            done.get_by_role("gridcell").first.click()
            expect(page.locator("#job-summary")).to_contain_text("Job #1 · train · succeeded")
            expect(_data_rows(page, "job-batches")).not_to_have_count(0)
            page.wait_for_timeout(500)  # let the plots draw
            _shot(page, tmp_path, "jobs")

            # Samples: search the job, open the first sample, check its coloured tokens.
            page.get_by_role("tab", name="Samples").click()
            _choose(page, "samples-job", re.compile(r"^#1 train"))
            page.locator("#samples-search").click()
            expect(page.locator("#samples-info")).to_contain_text("Page 1")
            rows = _data_rows(page, "samples-table")
            expect(rows.first).to_be_visible()
            rows.first.get_by_role("gridcell").first.click()
            tokens = page.locator("#sample-detail .tok")
            expect(tokens.first).to_be_visible()
            for i in range(tokens.count()):
                token = tokens.nth(i)
                assert re.match(r"token id \d+ · log-prob -?\d", token.get_attribute("title"))
                assert "hsl(" in token.get_attribute("style")
                assert not re.fullmatch(r"⟨\d+⟩", token.inner_text())  # decoded, not ids
            expect(page.locator("#sample-detail .facts")).to_contain_text("policy version")
            tokens.first.hover()
            _shot(page, tmp_path, "sample")

            # Compare: version 0 against the last version of the training job.
            page.get_by_role("tab", name="Compare").click()
            _choose(page, "compare-job", re.compile(r"^#1 train"))
            expect(page.locator("#compare-b input")).to_have_value("3")
            page.locator("#compare-button").click()
            expect(_data_rows(page, "compare-metrics").first).to_contain_text("samples")
            expect(page.locator("#compare-pairs")).to_contain_text("answered by both")

            # ... and on held-out prompts: a compare job answers the same prompts with both.
            page.get_by_text("Compare on held-out prompts").click()
            page.locator("#compare-launch").click()
            expect(page.locator("#compare-launched")).to_contain_text("Compare job #2")
            page.get_by_role("tab", name="Jobs").click()
            finished = _data_rows(page, "jobs-table").filter(has_text="succeeded")
            expect(finished).to_have_count(2, timeout=JOB_TIMEOUT_MS)
            page.get_by_role("tab", name="Compare").click()
            _choose(page, "compare-job", re.compile(r"^#2 compare"))
            expect(page.locator("#compare-b input")).to_have_value("3")
            page.locator("#compare-button").click()
            expect(page.locator("#compare-pairs tr.pair").first).to_be_visible()
            page.wait_for_timeout(500)
            _shot(page, tmp_path, "compare")

            page.get_by_role("tab", name="Queue").click()
            expect(page.locator("#queue-summary")).to_contain_text("worker(s) online")
        finally:
            browser.close()
