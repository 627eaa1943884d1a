"""A real headless Chromium over the Runs view (issue 41): a sweep of two learning rates x
two seeds stored in the database; picking its jobs draws a band per point (legend and method
stated) and the tables, whose held-out scores are the ones each job recorded. (Browser
setup: `tests.ui.test_browser`.)"""

import re

import pytest

from tests.ui.conftest import new_repository
from tests.ui.helpers import FakeQueue
from tests.ui.runs_data import seed_sweep
from tests.ui.test_browser import _data_rows, _opened, _require_browser, _shot
from ui.app import build_app

pytestmark = pytest.mark.slow
LRS = (0.001, 0.01)


@pytest.fixture
def app(tmp_path):
    repo = new_repository(tmp_path)
    jobs = seed_sweep(repo, tmp_path, LRS, seeds=2, versions=5)
    demo = build_app(FakeQueue(repo).services((tmp_path,), tmp_path / "data"))
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        yield demo.local_url, repo, jobs
    finally:
        demo.close()
        repo.close()


def _final_heldout(repo, job_id: int) -> float:
    """The job's held-out accuracy at its highest version that has one, from the database."""
    scored = [v for v in repo.list_versions(job_id) if "heldout_accuracy" in v.metrics.extra]
    return scored[-1].metrics.extra["heldout_accuracy"]


def _cells(row) -> list[str]:
    return [cell.strip() for cell in row.get_by_role("gridcell").all_inner_texts()]


def test_the_runs_view_draws_bands_and_the_databases_scores(app, tmp_path):
    sync_api = _require_browser()
    expect = sync_api.expect
    url, repo, jobs = app
    with _opened(sync_api, url) as page:
        page.get_by_role("tab", name="Runs").click()
        picker = page.locator("#runs-jobs")
        for job in jobs:
            picker.locator("input").click()
            picker.get_by_role("option", name=re.compile(rf"^#{job.id} ")).click()
        page.keyboard.press("Escape")
        expect(page.locator("#runs-metric input")).to_have_value("reward_mean")
        plot = page.locator("#runs-plot")
        expect(plot.locator("path.run-band")).to_have_count(len(LRS))
        expect(plot.locator("path.run-mean")).to_have_count(len(LRS))
        legend = plot.locator(".runs-legend")
        for lr in LRS:
            expect(legend).to_contain_text(f"lr={lr} (2 seeds · mean with 95% band)")
        expect(plot.locator(".runs-method")).to_contain_text("95% percentile bootstrap")

        runs = _data_rows(page, "runs-runs")
        expect(runs).to_have_count(len(jobs))
        shown = {}
        for index in range(len(jobs)):
            cells = _cells(runs.nth(index))
            shown[int(cells[0])] = float(cells[3])
        assert shown == {job.id: _final_heldout(repo, job.id) for job in jobs}

        points = _data_rows(page, "runs-points")
        expect(points).to_have_count(len(LRS))
        for index, lr in enumerate(LRS):
            cells = _cells(points.nth(index))
            members = [j.id for j in jobs if j.config["lr"] == lr]
            assert cells[0] == f"lr={lr}" and cells[1] == "2"
            mean = sum(_final_heldout(repo, j) for j in members) / len(members)
            assert float(cells[2]) == pytest.approx(mean, abs=5e-4)  # as displayed
        expect(page.locator("#runs-configs mark").first).to_be_visible()
        _shot(page, tmp_path, "runs-view")
