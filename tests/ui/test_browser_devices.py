"""A real headless Chromium over a job on two devices (issue 31): the Jobs table shows its
ranks, the sample inspector the rank that generated a sample, Clone fills the Devices field,
and Launch refuses more devices than a worker has inline, then queues as many. (Browser
setup: `tests.ui.test_browser`.)"""

import re

import pytest

from db import BatchRecord, PolicyVersionRecord
from tests.ui.conftest import new_repository
from tests.ui.helpers import FakeQueue, _sample, save_tokenizer
from tests.ui.test_browser import _choose, _data_rows, _opened, _require_browser, _shot
from ui.app import build_app

pytestmark = pytest.mark.slow


@pytest.fixture
def app(tmp_path, monkeypatch):
    """The UI over a database holding a train job on two CPU ranks, one sample from each,
    for workers of two devices (``RLWB_DEVICES``)."""
    monkeypatch.setenv("RLWB_DEVICES", "2")
    monkeypatch.delenv("RLWB_DEVICE", raising=False)
    model = save_tokenizer(tmp_path / "models" / "tiny")
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    repo = new_repository(tmp_path)
    config = {"model": str(model), "task": "always7", "steps": 1, "devices": 2}
    job = repo.create_job("train", config, total_steps=1)
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0))
    samples = [_sample(model, 0, 0, group, rank=group) for group in range(2)]
    repo.record_batch(BatchRecord(job.id, 0, 0, "accepted", samples))
    repo.mark_succeeded(job.id)
    demo = build_app(FakeQueue(repo).services((tmp_path / "models",), tmp_path / "data"))
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        yield demo.local_url
    finally:
        demo.close()
        repo.close()


def test_a_two_device_job_shows_its_ranks_and_clones_with_its_devices(app, tmp_path):
    sync_api = _require_browser()
    expect = sync_api.expect
    with _opened(sync_api, app) as page:
        page.get_by_role("tab", name="Jobs").click()
        row = _data_rows(page, "jobs-table").first
        expect(row).to_contain_text("succeeded")
        expect(row.get_by_role("gridcell").nth(2)).to_have_text("2 cpu ranks")
        _shot(page, tmp_path, "jobs-devices")

        page.get_by_role("tab", name="Samples").click()
        _choose(page, "samples-job", re.compile(r"^#1 train"))
        page.locator("#samples-search").click()
        expect(page.locator("#samples-info")).to_contain_text("Page 1 · 2 samples")
        _data_rows(page, "samples-table").nth(1).get_by_role("gridcell").first.click()
        expect(page.locator('#sample-detail [data-fact="rank"]')).to_have_text("1 of 2")
        _shot(page, tmp_path, "sample-rank")

        page.get_by_role("tab", name="Jobs").click()
        page.locator("#job-id textarea").fill("1")
        page.locator("#job-clone").click()
        expect(page.locator("#launch-steps input")).to_have_value("1")
        page.get_by_text("More", exact=True).click()
        devices = page.locator("#launch-devices input")
        expect(devices).to_have_value("2")
        expect(page.locator("#launch-devices")).to_contain_text("ranks, one per device")

        devices.fill("3")
        page.locator("#launch-button").click()
        status = page.locator("#launch-status")
        expect(status).to_contain_text("Nothing was enqueued")
        expect(status).to_contain_text("devices = 3 > the 2 CPU cores a worker has")
        _shot(page, tmp_path, "launch-devices")
        devices.fill("2")
        page.locator("#launch-button").click()
        expect(status).to_contain_text(re.compile(r"Job #2 is queued"))
        expect(status).to_contain_text("devices 2")
