"""One job across several devices (issue 31) in the UI: the Jobs and Queue tables show each
job's devices as ranks, the sample inspector the rank that generated a sample of such a job
(nothing for one device), and Launch carries a Devices field into the job, refuses more than a
worker has inline, and Clone fills it back."""

import dataclasses
import re

import gradio as gr
import pytest

from db import BatchRecord, PolicyVersionRecord, SampleFilter
from tests.ui.helpers import _sample
from tests.ui.test_launch import form
from ui.devices import devices_text, task_job_id
from ui.handlers.clone import clone_form
from ui.handlers.jobs import jobs_table
from ui.handlers.launch import FORM_FIELDS, launch_job, train_config
from ui.handlers.queue import queue_view
from ui.handlers.samples import sample_detail
from ui.render import inert
from ui.tabs import launch as launch_tab


@pytest.fixture(autouse=True)
def _cpu_worker(monkeypatch):
    """The worker's default device, as a job that names none runs on it: cpu."""
    monkeypatch.delenv("RLWB_DEVICE", raising=False)


def _job(repo, model, **config):
    """A running train job of ``config`` with one accepted batch: one sample per rank of
    ``ranks`` (None: not recorded)."""
    ranks = config.pop("ranks", [0])
    job = repo.create_job("train", {"model": str(model), "task": "always7", **config})
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0))
    samples = [_sample(model, 0, 0, group, rank=rank) for group, rank in enumerate(ranks)]
    repo.record_batch(BatchRecord(job.id, 0, 0, "accepted", samples))
    return repo.get_job(job.id)


def _sample_ids(repo, job_id):
    return [s.id for s in repo.list_samples(SampleFilter(job_id=job_id)).items]


def _facts(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-fact="([^"]+)">([^<]*)<', html))


def test_the_jobs_table_shows_each_jobs_devices_as_ranks(services, world, monkeypatch):
    repo = world["repo"]
    two = _job(repo, world["model"], devices=2, ranks=[0, 1])
    four = _job(repo, world["model"], devices=4, device="cuda:1", ranks=[3])
    table = jobs_table(services).set_index("job")
    assert table.loc[world["job"].id]["devices"] == "1 cpu"  # no devices: one, the worker's
    assert table.loc[two.id]["devices"] == "2 cpu ranks"
    assert table.loc[four.id]["devices"] == "4 cuda ranks"
    assert list(table.columns[:3]) == ["kind", "devices", "status"]
    monkeypatch.setenv("RLWB_DEVICE", "cuda")  # a job that names no device: the worker's
    assert jobs_table(services).set_index("job").loc[two.id]["devices"] == "2 cuda ranks"
    for job in (two, four):
        repo.mark_failed(job.id, "done with it")
        repo.delete_job(job.id)


def test_the_queue_shows_the_devices_of_its_running_and_queued_jobs(services, world):
    repo = world["repo"]
    two = _job(repo, world["model"], devices=2, ranks=[0, 1])
    queued = repo.create_job("train", {"model": "demo", "task": "always7", "devices": 3})

    def overview():
        return {
            **services.queue_overview(),
            "active": [
                {"worker": "w", "task_id": "t-2", "name": "workers.train", "args": [two.id]},
                {"worker": "w", "task_id": "t-3", "name": "workers.chat", "args": [two.id, 0]},
            ],
            "reserved": [
                {"worker": "w", "task_id": "t-4", "name": "workers.train", "args": f"[{queued.id}]"}
            ],
        }

    _, _, active, reserved, _ = queue_view(dataclasses.replace(services, queue_overview=overview))
    assert active["devices"].tolist() == ["2 cpu ranks", ""]  # a chat is no job's
    assert reserved["devices"].tolist() == ["3 cpu ranks"]  # args as text, from older workers
    repo.mark_failed(two.id, "done with it")
    repo.request_cancel(queued.id)
    for job in (two, queued):
        repo.delete_job(job.id)


def test_a_job_task_is_found_by_its_first_argument_only():
    assert task_job_id({"name": "workers.evaluate", "args": [5]}) == 5
    assert task_job_id({"name": "workers.compare", "args": "(6,)"}) == 6
    assert task_job_id({"name": "workers.token_diff", "args": [5, 0, 1]}) is None
    assert task_job_id({"name": "workers.train", "args": "not python"}) is None
    assert task_job_id({"name": "workers.train", "args": [True]}) is None
    assert devices_text({"devices": 0}, "cpu") == "1 cpu"  # refused by the job's check anyway


def test_the_inspector_shows_the_rank_of_a_sample_of_a_several_device_job(services, world):
    repo = world["repo"]
    two = _job(repo, world["model"], devices=2, ranks=[0, 1, None])
    shown = [_facts(sample_detail(services, i)).get("rank") for i in _sample_ids(repo, two.id)]
    assert shown == ["0 of 2", "1 of 2", "— of 2"]  # None: not recorded
    html = sample_detail(services, _sample_ids(repo, two.id)[1])
    assert re.search(r">rank</th><td[^>]*>1 of 2<", html)
    one = _job(repo, world["model"], ranks=[0])
    assert "rank" not in _facts(sample_detail(services, _sample_ids(repo, one.id)[0]))
    for job in (two, one):
        repo.mark_failed(job.id, "done with it")
        repo.delete_job(job.id)


def test_launch_carries_the_devices_into_the_job(services, world):
    launch_job(services, **form())
    assert world["queue"].submitted[-1][1]["devices"] == 1  # the default
    message = launch_job(services, **form(devices="2"))
    assert "is queued" in message and inert("devices 2") in message
    assert world["queue"].submitted[-1][1]["devices"] == 2


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ("1.5", "devices: a whole number is required"),
        ("two", "devices: 'two' is not a number"),
        ("0", "devices must be >= 1"),
        ("65", "devices must be <= 64"),
        ("3", "devices = 3 > the 2 CPU cores a worker has (RLWB_DEVICES)"),
    ],
)
def test_devices_a_worker_cannot_run_are_refused_inline(
    services, world, monkeypatch, devices, problem
):
    monkeypatch.setenv("RLWB_DEVICES", "2")
    message = launch_job(services, **form(devices=devices))
    assert message.startswith("**Nothing was enqueued.**") and inert(problem) in message
    assert world["queue"].submitted == []
    assert launch_job(services, **form(devices="2")).startswith("Job **#")  # as many: queued


def test_clone_fills_back_the_devices(services, world):
    repo = world["repo"]
    launch_job(services, **form(devices=2))
    job = repo.create_job("train", world["queue"].submitted[-1][1])
    values, _ = clone_form(services, job.id)
    assert values["devices"] == 2
    assert train_config(services, **values)["devices"] == 2
    older = repo.create_job("train", {**form(), "reward": None})  # before devices: one
    assert clone_form(services, older.id)[0]["devices"] == 1
    for cloned in (job, older):
        repo.request_cancel(cloned.id)
        repo.delete_job(cloned.id)


def test_the_devices_field_is_a_text_box_with_its_default_and_a_word_on_ranks(services):
    with gr.Blocks():
        fields = launch_tab.build(services)
    devices = fields["devices"]
    assert "devices" in FORM_FIELDS and isinstance(devices, gr.Textbox)
    assert devices.label == "Devices" and devices.value == "1"
    assert "ranks, one per device" in devices.info and "as many" in devices.info
