"""Jobs: a job with an environment plots its turns per episode, tool calls per turn and
tool-error rate over versions; a single-turn job shows no such plot, not even "no data yet"."""

import pytest

from db import PolicyVersionRecord
from ui.handlers.jobs import job_page
from ui.plots import PLOTS, has_data, shown
from workers.records import policy_metrics


def _trainer_metrics(version: int) -> dict[str, float]:
    """What the trainer reports for a version of a job with an environment."""
    return {
        "reward_mean": 0.5,
        "loss": 0.1,
        "turns_per_episode": 1.5 + version,
        "tool_calls_per_turn": 0.25 * version,
        "tool_error_rate": 0.5 / version,
        "episode_finish/done": 6.0,
        "episode_finish/max_turns": 2.0,
    }


@pytest.fixture(scope="module")
def agentic(world):
    repo = world["repo"]
    job = repo.create_job(
        "train", {"model": "demo", "task": "always7", "environment": "calculator"}
    )
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0))  # the loaded weights
    for version in (1, 2):
        metrics = policy_metrics(_trainer_metrics(version), 1, 0)
        repo.record_policy_version(
            PolicyVersionRecord(job.id, version, version - 1, metrics=metrics)
        )
    return job


def _episodes_plot(services, job_id):
    _, _, frames, hidden = job_page(services, job_id)
    [(spec, frame)] = [(s, f) for s, f in zip(PLOTS, frames, strict=True) if s.key == "episodes"]
    return spec, frame, hidden


def test_the_episode_metrics_are_plotted_per_version(services, agentic):
    spec, frame, hidden = _episodes_plot(services, agentic.id)
    values = {
        name: frame[frame["series"] == name].set_index("version")["value"]
        for name in ("turns per episode", "tool calls per turn", "tool-error rate")
    }
    assert all(series.isna()[0] for series in values.values())  # the loaded weights: none
    assert values["turns per episode"][[1, 2]].tolist() == [2.5, 3.5]
    assert values["tool calls per turn"][[1, 2]].tolist() == [0.25, 0.5]
    assert values["tool-error rate"][[1, 2]].tolist() == [0.5, 0.25]
    assert shown(spec, frame, hidden) == (True, False)


def test_a_single_turn_job_shows_no_episode_plot_nor_its_note(services, job):
    spec, frame, hidden = _episodes_plot(services, job.id)
    assert not has_data(frame) and shown(spec, frame, hidden) == (False, False)
