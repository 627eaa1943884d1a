"""A real headless Chromium over the Runs view (issue 41): a sweep of two learning rates x
two seeds stored in the database; picking its jobs draws a band per point (legend and method
stated) and the tables, whose held-out scores are the ones each job recorded. Picking a study
picks its jobs: the held-out curves' means and bands drawn are the bootstrap of the per-seed
scores the database holds, computed here as the textbook writes it, and so are the table's
intervals. (Browser setup: `tests.ui.test_browser`.)"""

import re

import numpy as np
import pytest

from tests.ui.conftest import new_repository
from tests.ui.helpers import FakeQueue
from tests.ui.runs_data import seed_study, seed_sweep
from tests.ui.test_browser import _choose, _data_rows, _opened, _require_browser, _shot
from ui.app import build_app
from ui.run_plot import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH

pytestmark = pytest.mark.slow
LRS = (0.001, 0.01)
STUDY_LRS = (0.001, 0.003, 0.01)
RESAMPLES, CONFIDENCE, SEED = 1_000, 0.95, 0  # the band's, as its method note states


def _served(repo, tmp_path, stored):
    demo = build_app(FakeQueue(repo).services((tmp_path,), tmp_path / "data"))
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        yield demo.local_url, repo, stored
    finally:
        demo.close()
        repo.close()


@pytest.fixture
def app(tmp_path):
    repo = new_repository(tmp_path)
    yield from _served(repo, tmp_path, seed_sweep(repo, tmp_path, LRS, seeds=2, versions=5))


@pytest.fixture
def study_app(tmp_path):
    """A study of 3 learning rates x 3 seeds, 9 versions each, beside a job of no study."""
    repo = new_repository(tmp_path)
    seed_sweep(repo, tmp_path, (0.5,), seeds=1, versions=3)
    stored = seed_study(repo, "sweep", tmp_path, STUDY_LRS, seeds=3, versions=9)
    yield from _served(repo, tmp_path, stored)


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


def _bootstrap(rows: np.ndarray, resamples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) per column of ``rows`` ([seeds, x]): each of ``resamples`` resamples
    draws the seeds with replacement (numpy's generator seeded by `SEED`, as the method note
    says); its mean per column; the percentiles of those means at the confidence's tails."""
    draws = np.random.default_rng(SEED).integers(0, len(rows), size=(resamples, len(rows)))
    means = np.stack([rows[drawn].mean(axis=0) for drawn in draws])
    tail = 100 * (1 - CONFIDENCE) / 2
    return rows.mean(axis=0), *np.percentile(means, [tail, 100 - tail], axis=0)


def _pairs(path: str) -> np.ndarray:
    """An SVG path's points as [n, 2] (its M, L and Z letters dropped)."""
    return np.array([float(n) for n in re.findall(r"-?[0-9.]+", path)]).reshape(-1, 2)


def test_a_studys_runs_view_draws_the_bootstrap_of_its_seeds_scores(study_app, tmp_path):
    sync_api = _require_browser()
    expect = sync_api.expect
    url, repo, (study, jobs) = study_app
    assert study.status.value == "completed" and study.job_counts == {"succeeded": len(jobs)}
    # from the database: each point's per-seed held-out scores at the versions that have one
    curves = {}
    for lr in STUDY_LRS:
        runs = [repo.list_versions(j.id) for j in jobs if j.config["lr"] == lr]
        versions = [v.version for v in runs[0] if "heldout_accuracy" in v.metrics.extra]
        rows = [
            [v.metrics.extra["heldout_accuracy"] for v in r if v.version in versions] for r in runs
        ]
        curves[f"lr={lr}"] = (np.array(versions, float), np.array(rows))
    bands = {point: _bootstrap(rows, RESAMPLES) for point, (_, rows) in curves.items()}
    x0 = min(x.min() for x, _ in curves.values())
    x1 = max(x.max() for x, _ in curves.values())
    y0 = min(min(b.min() for b in band) for band in bands.values())
    y1 = max(max(b.max() for b in band) for band in bands.values())

    def pixels(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        px = LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - RIGHT)
        py = TOP + (y1 - y) / (y1 - y0) * (HEIGHT - TOP - BOTTOM)
        return np.stack([px, py], axis=1)

    with _opened(sync_api, url) as page:
        page.get_by_role("tab", name="Runs").click()
        _choose(page, "runs-study", re.compile(rf"^{study.name} \(completed, 9 jobs\)"))
        picked = page.locator("#runs-jobs .token")
        expect(picked).to_have_count(len(jobs))
        expect(page.locator("#runs-metric input")).to_have_value("reward_mean")
        _choose(page, "runs-metric", "heldout_accuracy")
        plot = page.locator("#runs-plot")
        expect(plot.locator("svg text").last).to_have_text("heldout_accuracy")
        expect(plot.locator("path.run-band")).to_have_count(len(STUDY_LRS))
        expect(plot.locator(".runs-method")).to_contain_text(
            f"95% percentile bootstrap of that mean over seeds ({RESAMPLES:,} resamples"
        )
        legend = plot.locator(".runs-legend")
        for point, (x, _) in curves.items():
            expect(legend).to_contain_text(f"{point} (3 seeds · mean with 95% band)")
            mean, low, high = bands[point]
            drawn = _pairs(plot.locator(f'path.run-mean[data-point="{point}"]').get_attribute("d"))
            np.testing.assert_allclose(drawn, pixels(x, mean), atol=0.051)
            band = _pairs(plot.locator(f'path.run-band[data-point="{point}"]').get_attribute("d"))
            upper = np.concatenate([pixels(x, high), pixels(x[::-1], low[::-1])])
            np.testing.assert_allclose(band, upper, atol=0.051)

        runs = _data_rows(page, "runs-runs")
        expect(runs).to_have_count(len(jobs))
        shown = {int(c[0]): float(c[3]) for c in (_cells(runs.nth(i)) for i in range(len(jobs)))}
        assert shown == {job.id: _final_heldout(repo, job.id) for job in jobs}
        points = _data_rows(page, "runs-points")
        expect(points).to_have_count(len(STUDY_LRS))
        for index, (point, (_, rows)) in enumerate(curves.items()):
            cells = _cells(points.nth(index))
            finals = rows[:, -1:]  # each seed's last held-out score
            mean, low, high = (float(b[0]) for b in _bootstrap(finals, 10_000))
            assert cells[:2] == [point, "3"]
            assert all(re.fullmatch(r"\d\.\d{4}", cell) for cell in cells[2:5])  # rounded
            shown = [float(cell) for cell in cells[2:5]]
            assert shown == pytest.approx([mean, low, high], abs=5e-4)  # as displayed
        _shot(page, tmp_path, "runs-study")
