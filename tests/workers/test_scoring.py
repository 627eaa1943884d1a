"""Audit and token diff: stored responses re-scored under a version's kept weights, checked
against a Hugging Face transformers forward of that version's checkpoint; the trainer's
per-token log-probs are stored for trained samples."""

import math
import shutil
from pathlib import Path

import pytest
import torch
from sqlalchemy import update

from db import SampleFilter
from db.arrays import encode_float32
from db.models import Sample
from tests.workers.helpers import train_config
from workers import commands
from workers.jobs import run_job
from workers.scoring import AUDIT_TOLERANCE, audit_samples, token_diff


def _hf_logprobs(checkpoint: str, prompt_text: str, response: list[int]) -> list[float]:
    """log-softmax of every response token under the checkpoint, by transformers (T = 1)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    picked = logits.log_softmax(-1).gather(1, torch.tensor(response)[:, None])
    return picked.squeeze(1).tolist()


@pytest.fixture
def trained(repo, settings, tiny_model):
    config = train_config(tiny_model, steps=2, group_size=4, lr=0.01, reward="regex:.*7.*")
    job = repo.create_job("train", config, total_steps=2)
    assert run_job(repo, job.id, settings).status == "succeeded"
    return job.id


def _samples(repo, job_id, version):
    where = SampleFilter(job_id, min_version=version, max_version=version)
    return [repo.get_sample(s.id) for s in repo.list_samples(where).items]


def test_trained_samples_store_the_trainer_logprobs(repo, trained):
    for detail in _samples(repo, trained, 0):
        assert detail.trainer_logprobs is not None
        assert len(detail.trainer_logprobs) == len(detail.response_token_ids)
        # the trainer scored version 0's weights: it reproduces the engine's log-probs
        gaps = [
            abs(a - b)
            for a, b in zip(detail.trainer_logprobs, detail.temperature_logprobs, strict=True)
        ]
        assert max(gaps) < AUDIT_TOLERANCE
    gap_filter = SampleFilter(trained, min_logprob_gap=0.0)
    assert repo.list_samples(gap_filter).items  # trained samples have a gap recorded
    assert not repo.list_samples(SampleFilter(trained, min_logprob_gap=1.0)).items


def test_audit_passes_against_transformers_and_catches_tampering(repo, settings, trained):
    detail = next(d for d in _samples(repo, trained, 1) if d.response_token_ids)
    checkpoint = next(v for v in repo.list_versions(trained) if v.version == 1).checkpoint_path
    truth = _hf_logprobs(checkpoint, detail.prompt_text, detail.response_token_ids)
    stored_vs_truth = max(
        abs(a - b) for a, b in zip(detail.temperature_logprobs, truth, strict=True)
    )
    [result] = audit_samples(repo, settings, [detail.id])["samples"]
    assert result["status"] == "pass" and result["version"] == 1
    assert math.isclose(result["max_abs_diff"], stored_vs_truth, abs_tol=2e-5)

    tampered = [v + 0.01 for v in detail.temperature_logprobs]
    with repo.engine.begin() as connection:
        connection.execute(
            update(Sample)
            .where(Sample.id == detail.id)
            .values(temperature_logprobs=encode_float32(tampered))
        )
    [result] = audit_samples(repo, settings, [detail.id])["samples"]
    assert result["status"] == "fail" and result["max_abs_diff"] == pytest.approx(0.01, abs=1e-4)

    shutil.rmtree(checkpoint)
    [result] = audit_samples(repo, settings, [detail.id])["samples"]
    assert result["status"] == "weights not kept" and result["max_abs_diff"] is None
    assert "sample ids" in audit_samples(repo, settings, ["x"])["problem"]


def test_a_cancelled_audit_stops_before_its_next_sample(repo, settings, trained):
    """What a revoke of the running ``workers.audit`` task does (`workers.control.revoked`)."""
    ids = [s.id for s in repo.list_samples(SampleFilter(trained), limit=4).items]
    asked = []
    result = audit_samples(repo, settings, ids, lambda: asked.append(1) or len(asked) > 2)
    assert result == {"problem": "cancelled after 2 of 4 samples"}


def test_token_diff_scores_one_response_under_both_versions(repo, settings, trained):
    detail = next(d for d in _samples(repo, trained, 1) if d.response_token_ids)
    versions = {v.version: v.checkpoint_path for v in repo.list_versions(trained)}
    diff = token_diff(repo, settings, detail.id, 1, 2)
    assert diff["token_ids"] == detail.response_token_ids
    for key, version in (("logprobs_a", 1), ("logprobs_b", 2)):
        truth = _hf_logprobs(versions[version], detail.prompt_text, detail.response_token_ids)
        assert diff[key] == pytest.approx(truth, abs=1e-4)
    assert diff["logprobs_a"] != diff["logprobs_b"]  # an optimizer step changed the weights
    assert "no policy version 9" in token_diff(repo, settings, detail.id, 1, 9)["problem"]


def test_cli_audit_reports_each_sample_and_refuses_bad_requests(repo, trained, capsys):
    assert commands.run_audit(trained, 5) == 0
    out = capsys.readouterr().out
    assert out.count("  pass\n") == 5
    assert "5 checked (5 pass, 0 fail), 0 not checkable (tolerance 0.0001" in out
    assert commands.run_audit(trained, 0) == 1
    assert commands.run_audit(999, 3) == 1
    assert "refused" in capsys.readouterr().out


def test_cli_audit_says_when_it_checks_fewer_than_asked(repo, settings, tiny_model, capsys):
    """``--samples 300`` audited 200 and said nothing of the other 100 (issue 32)."""
    config = train_config(tiny_model, steps=4, batch_size=16, group_size=4, keep_last=0)
    job = repo.create_job("train", config, total_steps=4)
    assert run_job(repo, job.id, settings).status == "succeeded"  # 256 samples, all kept

    assert commands.run_audit(job.id, 300) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("sample ") for line in lines) == 200
    assert lines[-2] == (
        "asked for 300 samples, audited 200: one audit checks at most 200 (run it again for others)"
    )
    assert lines[-1].startswith("200 checked (200 pass, 0 fail), 0 not checkable")


@pytest.fixture
def pruned(repo, settings, tiny_model, tmp_path):
    """Versions 0-3 (samples of 0-2), of which retention dropped the weights of version 1
    (version 0's are the model's own: a copy here, for the test to delete)."""
    model = shutil.copytree(tiny_model, tmp_path / "model")
    config = train_config(str(model), group_size=4, keep_last=2, keep_every=0)
    job = repo.create_job("train", config, total_steps=3)
    assert run_job(repo, job.id, settings).status == "succeeded"
    return job.id


def test_cli_audit_draws_from_kept_weights_and_reports_its_coverage(repo, pruned, capsys):
    checkpoints = {v.version: v.checkpoint_path for v in repo.list_versions(pruned)}
    assert {v for v, path in checkpoints.items() if Path(path).is_dir()} == {0, 2, 3}
    gone = len(_samples(repo, pruned, 1))
    checkable = [d.id for v in (0, 2) for d in _samples(repo, pruned, v) if d.response_token_ids]

    assert commands.run_audit(pruned, 20) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split()[1]) for line in lines[:-2]] == checkable  # all of v0, v2; no v1
    assert lines[-2] == (
        f"asked for 20 samples, audited {len(checkable)}: the versions whose weights were "
        "kept hold no more samples with a response"
    )
    assert lines[-1].startswith(
        f"{len(checkable)} checked ({len(checkable)} pass, 0 fail), {gone} not checkable: "
        "weights not kept for versions 1 (tolerance"
    )

    for version in (0, 2):
        shutil.rmtree(checkpoints[version])
        gone += len(_samples(repo, pruned, version))
    assert commands.run_audit(pruned, 20) == 1  # nothing could be checked
    assert capsys.readouterr().out.startswith(
        "asked for 20 samples, audited 0: the versions whose weights were kept hold no more "
        f"samples with a response\n0 checked (0 pass, 0 fail), {gone} not checkable: weights "
        "not kept for versions 0-2"
    )
