"""A real headless Chromium over Launch's algorithm presets: choosing one fills in the fields
it sets and links its paper; the Jobs table shows each train job's algorithm. (Browser setup:
`tests.ui.test_browser`.)"""

import re

import pytest

from tests.ui.conftest import new_repository
from tests.ui.helpers import FakeQueue
from tests.ui.test_browser import _choose, _data_rows, _opened, _require_browser, _shot
from ui.app import build_app

pytestmark = pytest.mark.slow


@pytest.fixture
def app(tmp_path):
    """The UI over a database holding one GSPO train job."""
    repo = new_repository(tmp_path)
    repo.create_job("train", {"model": "demo", "task": "always7", "preset": "GSPO"})
    demo = build_app(FakeQueue(repo).services((tmp_path / "models",), tmp_path / "data"))
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        yield demo.local_url
    finally:
        demo.close()
        repo.close()


def test_an_algorithm_fills_in_its_papers_settings(app, tmp_path):
    sync_api = _require_browser()
    expect = sync_api.expect
    with _opened(sync_api, app) as page:
        _choose(page, "launch-algorithm", re.compile(r"^DAPO: clip-higher"))
        paper = page.locator("#launch-algorithm-paper a")
        expect(paper).to_have_attribute("href", "https://arxiv.org/abs/2503.14476")
        page.get_by_text("More", exact=True).click()
        expect(page.locator("#launch-clip-eps input")).to_have_value("0.2")
        expect(page.locator("#launch-kl-coef input")).to_have_value("0.0")
        _choose(page, "launch-algorithm", re.compile(r"^GRPO: "))
        expect(page.locator("#launch-kl-coef input")).to_have_value("0.04")
        expect(paper).to_have_attribute("href", "https://arxiv.org/abs/2402.03300")
        _shot(page, tmp_path, "launch-algorithm")

        page.get_by_role("tab", name="Jobs").click()
        row = _data_rows(page, "jobs-table").first
        expect(row).to_contain_text("GSPO")
