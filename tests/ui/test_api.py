"""Every tab through its API: `gradio_client` against a live app on a temporary database."""

import re

import pytest
from gradio_client import Client

from tests.ui.helpers import PROMPTS
from ui.app import build_app
from ui.handlers import samples as samples_module
from ui.render import from_inert


@pytest.fixture(scope="module")
def client(world):
    demo = build_app(world["services"])
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        yield Client(demo.local_url, verbose=False)
    finally:
        demo.close()


@pytest.fixture
def submitted(world):
    world["queue"].submitted.clear()
    return world["queue"].submitted


def rows(table: dict) -> list[dict]:
    return [dict(zip(table["headers"], row, strict=True)) for row in table["data"]]


def rows_of_plot(plot: dict) -> list[dict]:
    plot = plot.get("value", plot)  # an update (visibility changes) carries the plot as value
    return [dict(zip(plot["columns"], row, strict=True)) for row in plot["data"]]


def search(client, job_id, **filters):
    values = {
        "job_id": job_id,
        "min_version": "",
        "max_version": "",
        "finish_reason": "any",
        "error_code": "",
        "min_reward": "",
        "max_reward": "",
        "batch_status": "any",
        "text": "",
        "newest_first": False,
    }
    values.update(filters)
    return client.predict(**values, api_name="/samples")


def test_launch(client, world, submitted):
    form = {
        "model": "demo",
        "source": "built-in task",
        "task": "always7",
        "data": None,
        "reward": "task default",
        "steps": 5,
        "batch_size": 4,
        "group_size": 4,
        "lr": 0.001,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 3,
        "max_policy_lag": 1,
        "kv_strategy": "contiguous",
        "clip_eps": 0.2,
        "kl_coef": 0.0,
        "seed": 0,
    }
    message = client.predict(**form, api_name="/launch")
    assert re.match(r"Job \*\*#\d+\*\* is queued", message)
    assert submitted[0][1]["kv_strategy"] == "contiguous" and submitted[0][1]["steps"] == 5
    refused = client.predict(**{**form, "steps": 0, "top_p": 2}, api_name="/launch")
    assert "Nothing was enqueued" in refused and "steps must be &gt;= 1" in refused
    assert len(submitted) == 1
    model, _ = client.predict(api_name="/launch_rescan")
    assert model["choices"][-1] == [str(world["model"]), str(world["model"])]  # after the shipped


def test_jobs_cancel_and_job_page(client, world, job):
    table = rows(client.predict(api_name="/jobs"))
    trained = next(row for row in table if row["job"] == job.id)
    assert trained["status"] == "succeeded" and trained["progress"] == "3/3 (100%)"
    summary, config, reward, *_ = client.predict(job.id, api_name="/job")
    assert summary.startswith(f"### Job #{job.id}") and config["task"] == "always7"
    assert {row["series"] for row in rows_of_plot(reward)} == {
        "reward mean (raw)",
        "reward mean (EMA)",
    }
    batches = rows(client.predict(job.id, api_name="/job_batches"))
    assert [b["status"] for b in batches].count("rejected") == 1
    queued = world["repo"].create_job("train", {"model": "demo", "task": "always7"})
    assert client.predict(queued.id, api_name="/cancel") == f"Job **#{queued.id}** is cancelled."
    world["repo"].delete_job(queued.id)


def test_samples_pages_filters_and_detail(client, job, monkeypatch):
    monkeypatch.setattr(samples_module, "PAGE_SIZE", 20)
    table, info = search(client, job.id)
    first = rows(table)
    assert len(first) == 20 and info.startswith("Page 1 · 20 samples · more")
    table, info = client.predict(api_name="/samples_next")
    second = rows(table)
    assert info.startswith("Page 2") and second[0]["sample"] > first[-1]["sample"]
    table, info = client.predict(api_name="/samples_previous")
    assert rows(table) == first
    errored = rows(search(client, job.id, finish_reason="error")[0])
    assert [row["error"] for row in errored] == ["kv_exhausted"]
    texts = rows(search(client, job.id, text="17", min_reward="1")[0])
    assert {row["prompt"] for row in texts} == {"17?"} and {row["reward"] for row in texts} == {"1"}
    detail, verdict = client.predict(first[1]["sample"], api_name="/sample")
    assert detail.count('class="tok"') == first[1]["tokens"] and "token id" in detail
    assert verdict == ""  # the audit box: emptied for the sample opened


def test_rejected_batches(client, job):
    [batch] = rows(client.predict(job.id, api_name="/rejected_batches"))
    assert batch["reasons"].startswith("sample 1: error/kv_exhausted")
    table, info = client.predict(job.id, batch["batch"], api_name="/batch_samples")
    assert len(rows(table)) == 2 and "(rejected)" in from_inert(info)


def test_compare(client, job, submitted):
    a, b, task = client.predict(job.id, None, api_name="/versions")  # job B: none
    assert task["value"] == "always7"  # the held-out comparison runs the job's task
    assert (a["value"], b["value"]) == (0, 3) and b["choices"][-1][1] == 3
    metrics, rewards, lengths, pairs, sample = client.predict(
        job.id, 0, 3, None, api_name="/compare"
    )
    assert rows(metrics)[1] == {
        "metric": "sample reward mean",
        "version A": "0.25",
        "version B": "1",
        "B - A": "0.75",
    }
    assert "version 3" in rewards and "Response tokens" in lengths
    assert pairs.count('class="pair"') == len(PROMPTS) and sample
    message, poll = client.predict(
        job.id, 0, 3, "addition", 16, 2, 8, None, api_name="/launch_compare"
    )
    assert message.startswith("Compare job") and submitted[0][0] == "compare"
    assert poll["active"]  # the status line follows the job until it finishes


def test_queue_and_job_pickers(client, job):
    summary, _, active, _, commands = client.predict(api_name="/queue")
    assert "**1** worker(s) online" in summary and "inspect ping" in commands
    assert rows(active)[0]["name"] == "workers.train"
    picker = client.predict(api_name="/samples_jobs")
    assert [job.id] == [value for _, value in picker["choices"] if value == job.id]
