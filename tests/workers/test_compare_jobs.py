"""Compare across jobs with eager tasks on the demo policy (issue 41): two runs of the demo
task, their version 2 against each other on the same held-out prompts (an evaluate job per
side, launched and followed by Compare's handlers) and one response's token diff under both;
a job on another tokenizer refused with the reason, in the view, the launch and the worker."""

from functools import partial
from html import escape

import pytest

from core_engine.toy import save_tiny_checkpoint
from db import JobStatus, PolicyVersionRecord, SampleFilter
from tests.workers.helpers import train_config
from ui.handlers.compare import compare_versions, follow_compare_job, launch_compare
from ui.handlers.token_diff import token_diff_view
from ui.render import from_inert
from ui.services import Services
from workers import api
from workers.scoring import AUDIT_TOLERANCE, stored_logprobs, token_diff

PROMPTS = 6
VERSION = 2


@pytest.fixture
def runs(eager, repo, settings):
    """Two finished demo runs (seeds 1 and 2) and the UI's services over eager tasks."""
    config = train_config("demo", task="addition", steps=VERSION, batch_size=4, group_size=4)
    config.update(max_tokens=6, heldout_every=0)
    jobs = [api.submit_job("train", {**config, "seed": seed}) for seed in (1, 2)]
    assert [repo.get_job(job.id).status for job in jobs] == [JobStatus.SUCCEEDED] * 2
    services = Services(
        repository=repo,
        submit_job=api.submit_job,
        cancel_job=api.cancel_job,
        queue_overview=api.queue_overview,
        resume_job=api.resume_job,
        chat=api.chat,
        audit=api.audit,
        token_diff=partial(token_diff, repo, settings),
        run_study=api.run_study,
    )
    return [job.id for job in jobs], services


def test_two_jobs_versions_answer_the_same_held_out_prompts_side_by_side(runs, repo, settings):
    (a, b), services = runs
    message, launched = launch_compare(
        services, a, VERSION, VERSION, "addition", PROMPTS, 3, 6, job_b=b
    )
    assert len(launched) == 2 and message.count("Evaluate job") == 2
    lines, finished, comparison = follow_compare_job(services, launched, a, VERSION, VERSION, b)
    assert finished and lines.count("finished") == 2
    _, rewards, _, pairs, sample = comparison
    # what the database holds: each side's evaluation of the chosen version, same prompts
    for evaluation, job in zip(launched, (a, b), strict=True):
        assert repo.get_version(evaluation, VERSION).checkpoint_path == (
            repo.get_version(job, VERSION).checkpoint_path
        )
    sides = [repo.list_samples(SampleFilter(e), limit=100).items for e in launched]
    assert [s.prompt_text for s in sides[0]] == [s.prompt_text for s in sides[1]]
    assert len(sides[0]) == PROMPTS and pairs.count('class="pair"') == PROMPTS
    assert f"job #{a} version {VERSION}" in pairs and f"job #{b} version {VERSION}" in pairs
    assert f"evaluate jobs #{launched[0]} and #{launched[1]}" in pairs
    for samples in sides:
        assert all(escape(s.response_text) in pairs for s in samples if s.response_text)
    assert f"job #{b} version {VERSION}" in rewards
    assert sample in {s.id for s in sides[1]}

    html = token_diff_view(services, sample, VERSION, VERSION, a, b)
    assert f"scored under job #{a} version {VERSION} and job #{b} version {VERSION}" in html
    scored = token_diff(repo, settings, sample, VERSION, VERSION, a, b)
    stored = stored_logprobs(repo.get_sample(sample))
    assert len(scored["logprobs_b"]) == len(stored)  # B's version is the one that sampled it
    assert max(abs(x - y) for x, y in zip(scored["logprobs_b"], stored, strict=True)) <= (
        AUDIT_TOLERANCE
    )


def test_a_job_on_another_tokenizer_is_refused_with_the_reason(runs, repo, settings, tmp_path):
    (a, _), services = runs
    other = save_tiny_checkpoint(tmp_path / "other", alphabet="abcdefghij")
    job = repo.create_job("train", {"model": str(other), "task": "always7", "steps": 1})
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0, checkpoint_path=str(other)))
    repo.mark_succeeded(job.id)
    refusal = f"jobs #{a} and #{job.id} do not share a tokenizer: different tokenizers"
    assert refusal in compare_versions(services, a, VERSION, 0, job.id)[3]
    message, launched = launch_compare(services, a, VERSION, 0, "addition", PROMPTS, 3, 6, job.id)
    assert launched is None and refusal in from_inert(message)
    sample = repo.list_samples(SampleFilter(a), limit=1).items[0]
    problem = token_diff(repo, settings, sample.id, VERSION, 0, a, job.id)["problem"]
    assert problem.startswith(f"jobs {a} and {job.id}: different tokenizers")
