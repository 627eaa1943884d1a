"""LoRA jobs through the worker's own code paths: every version's PEFT adapter kept (version 0,
the starting adapter, too), the base's checksum recorded once on the job and checked on resume,
audit, compare, token diff and the Playground at any version, and ``rlwb export`` checked
against PEFT and transformers."""

import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file, save_file

from core_engine.engine import load_engine
from core_engine.task import SamplingParams
from core_engine.weights import weights_checksum
from db import SampleFilter
from tests.core_engine.lora_reference import hf_base, hf_peft, teacher_forced_logprobs
from tests.workers.helpers import train_config
from workers import commands
from workers.chat import chat_reply
from workers.jobs import run_job
from workers.scoring import WEIGHTS_NOT_KEPT, audit_samples, token_diff

LORA = {"rank": 4, "alpha": 8}
STEPS = 5  # past the full-weight retention (keep_last 3): a LoRA job still keeps them all
HELLO = [{"role": "user", "content": "hello"}]
VARIED = "regex:.*[a-z].*"  # random characters: some responses match, so B learns


def lora_job(repo, settings, model: str, steps: int = STEPS) -> int:
    config = train_config(model, steps=steps, group_size=4, lr=0.05, lora=LORA, reward=VARIED)
    job = repo.create_job("train", config, total_steps=steps)
    assert run_job(repo, job.id, settings).status == "succeeded"
    return job.id


def samples_of(repo, job_id: int, version: int) -> list:
    where = SampleFilter(job_id, min_version=version, max_version=version)
    return [repo.get_sample(s.id) for s in repo.list_samples(where).items]


def base_logprobs(base: Path, prompt_text: str, response: list[int]) -> list[float]:
    """The response's log-probs under the base alone, by transformers."""
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(base)(prompt_text, add_special_tokens=False)
    return teacher_forced_logprobs(hf_base(base), prompt["input_ids"], response).tolist()


@pytest.fixture
def base(tiny_model, tmp_path) -> Path:
    """A copy of the tiny model, for tests that change or export it."""
    return Path(shutil.copytree(tiny_model, tmp_path / "base"))


def test_every_version_keeps_its_adapter_and_answers_anywhere(repo, settings, base):
    job_id = lora_job(repo, settings, str(base))
    versions = repo.list_versions(job_id)
    assert [v.version for v in versions] == list(range(STEPS + 1))
    base_file = load_file(base / "model.safetensors")
    assert repo.get_job(job_id).base_checksum == weights_checksum(base_file)
    for v in versions:
        adapter = Path(v.checkpoint_path)
        assert LoraConfig.from_pretrained(str(adapter)).r == 4
        assert v.weights_checksum == weights_checksum(
            load_file(adapter / "adapter_model.safetensors")
        )
        assert not (adapter / "model.safetensors").exists()
    assert Path(versions[0].checkpoint_path).name == "version-00000"

    scored = [d for v in range(3) for d in samples_of(repo, job_id, v) if d.response_token_ids]
    audits = audit_samples(repo, settings, [d.id for d in scored])["samples"]
    assert {a["version"] for a in audits} == {0, 1, 2}
    assert {a["status"] for a in audits} == {"pass"}

    detail = next(d for d in samples_of(repo, job_id, 0) if d.response_token_ids)
    diff = token_diff(repo, settings, detail.id, 0, STEPS)
    assert "problem" not in diff and diff["logprobs_a"] != diff["logprobs_b"]
    base_scores = base_logprobs(base, detail.prompt_text, detail.response_token_ids)
    assert diff["logprobs_a"] == pytest.approx(base_scores, abs=1e-5)  # version 0: B is zero

    compare = repo.create_job(
        "compare", {"job_id": job_id, "versions": [0, STEPS], "task": "always7", "num_prompts": 3}
    )
    assert run_job(repo, compare.id, settings).status == "succeeded"
    assert len(repo.compare_versions(compare.id, 0, STEPS)) == 3

    for version in (0, STEPS):
        reply = chat_reply(repo, settings, job_id, version, HELLO, 0.0, 4, 0)
        assert "problem" not in reply and reply["policy_version"] == version
        assert reply["output_ids"] and reply["checkpoint"] == versions[version].checkpoint_path
    said = [a.get("problem", "") for a in audits] + [reply.get("problem", "")]
    assert not any(WEIGHTS_NOT_KEPT in text for text in said)


def test_a_resumed_lora_job_refuses_a_changed_base(repo, settings, base):
    config = train_config(str(base), steps=4, group_size=4, lr=0.05, lora=LORA)
    job = repo.create_job("train", config, total_steps=4)

    def stop_at_step_1(meta):
        if meta["step"] == 1:
            repo.request_cancel(job.id)

    assert run_job(repo, job.id, settings, progress=stop_at_step_1).status == "cancelled"
    recorded = repo.get_job(job.id).base_checksum
    original = load_file(base / "model.safetensors")
    changed = dict(original)
    name = next(iter(changed))
    changed[name] = changed[name] + 1e-3
    save_file(changed, base / "model.safetensors", metadata={"format": "pt"})

    repo.reopen(job.id)
    assert run_job(repo, job.id, settings).status == "failed"
    error = repo.get_job(job.id).error
    assert "resume with the base the run started from" in error and recorded[:12] in error
    assert [v.version for v in repo.list_versions(job.id)] == [0, 1]

    save_file(original, base / "model.safetensors", metadata={"format": "pt"})
    repo.reopen(job.id)
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert [v.version for v in repo.list_versions(job.id)] == [0, 1, 2, 3, 4]
    assert repo.get_job(job.id).base_checksum == recorded


def test_a_lora_start_never_recorded_is_written_again(repo, settings, base, monkeypatch):
    """A crash between version 0's checkpoint and its row: the next attempt starts over."""
    record = repo.record_policy_version

    def crash(*args, **kwargs):
        raise RuntimeError("the worker died here")

    config = train_config(str(base), steps=1, group_size=4, lora=LORA)
    job = repo.create_job("train", config, total_steps=1)
    monkeypatch.setattr(repo, "record_policy_version", crash)
    assert run_job(repo, job.id, settings).status == "failed"
    assert repo.list_versions(job.id) == []
    monkeypatch.setattr(repo, "record_policy_version", record)
    repo.reopen(job.id)
    assert run_job(repo, job.id, settings).status == "succeeded"
    detail = next(d for d in samples_of(repo, job.id, 0) if d.response_token_ids)
    [audit] = audit_samples(repo, settings, [detail.id])["samples"]
    assert audit["status"] == "pass"


def _engine_logprobs(checkpoint: str, prompts: list[list[int]]) -> list:
    engine = load_engine(checkpoint)
    results = engine.run_batch(prompts, SamplingParams(temperature=1.0, max_tokens=6, seed=3))
    assert all(r.ok for r in results)
    return results


def test_export_writes_the_adapter_or_a_merged_checkpoint(repo, settings, base, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    job_id = lora_job(repo, settings, str(base), steps=2)
    checkpoint = repo.get_version(job_id, 2).checkpoint_path
    prompts = [[4, 13, 17, 5], [9, 3]]
    results = _engine_logprobs(checkpoint, prompts)

    assert commands.main(["export", str(job_id), "2", str(tmp_path / "adapter")]) == 0
    assert "adapter written to" in capsys.readouterr().out
    assert not (tmp_path / "adapter" / "optimizer.safetensors").exists()
    peft = hf_peft(base, tmp_path / "adapter")
    assert commands.main(["export", str(job_id), "2", str(tmp_path / "merged"), "--merged"]) == 0
    assert "merged checkpoint written to" in capsys.readouterr().out
    merged = AutoModelForCausalLM.from_pretrained(
        tmp_path / "merged", dtype=torch.float32, local_files_only=True
    ).eval()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    for result in results:
        ours = torch.tensor(result.output_logprobs)
        for reference in (peft, merged):
            expected = teacher_forced_logprobs(reference, result.prompt_ids, result.output_ids)
            assert torch.allclose(ours, expected, atol=1e-5)

    assert commands.main(["export", str(job_id), "2", str(tmp_path / "merged")]) == 1
    assert "is not an empty directory" in capsys.readouterr().out
    assert commands.main(["export", str(job_id), "9", str(tmp_path / "nine")]) == 1
    assert "no policy version 9" in capsys.readouterr().out


def test_export_copies_a_full_weight_checkpoint_and_refuses_weights_not_kept(
    repo, settings, tiny_model, tmp_path, capsys
):
    from transformers import AutoModelForCausalLM

    config = train_config(tiny_model, steps=4, group_size=4, lr=0.05)
    job = repo.create_job("train", config, total_steps=4)
    assert run_job(repo, job.id, settings).status == "succeeded"  # keep_last 3: v1 dropped

    assert commands.main(["export", str(job.id), "4", str(tmp_path / "v4")]) == 0
    assert "checkpoint written to" in capsys.readouterr().out
    kept = sorted(p.name for p in (tmp_path / "v4").iterdir())
    assert "model.safetensors" in kept and "trainer_state.json" not in kept
    ours = load_file(Path(repo.get_version(job.id, 4).checkpoint_path) / "model.safetensors")
    assert weights_checksum(load_file(tmp_path / "v4" / "model.safetensors")) == weights_checksum(
        ours
    )
    AutoModelForCausalLM.from_pretrained(tmp_path / "v4", local_files_only=True)

    assert commands.main(["export", str(job.id), "1", str(tmp_path / "v1"), "--merged"]) == 1
    assert f"job {job.id} version 1: weights not kept" in capsys.readouterr().out
    assert not (tmp_path / "v1").exists()


def test_rlwb_submit_takes_a_lora_table_and_refuses_bad_settings(
    repo, tiny_model, tmp_path, capsys
):
    job = tmp_path / "job.toml"
    job.write_text(f'model = "{tiny_model}"\ntask = "always7"\n[lora]\nrank = 0\ndropout = 1.0\n')
    assert commands.main(["submit", str(job)]) == 1
    assert capsys.readouterr().out.startswith(
        "refused: invalid training config: invalid lora settings: rank must be an integer from 1 "
        "to 1024, got 0; dropout must be in [0, 1), got 1.0"
    )
    assert repo.list_jobs() == []
    job.write_text(f'model = "{tiny_model}"\ntask = "always7"\n[lora]\nrank = 8\n')
    assert commands.main(["submit", str(job)]) == 0
    [queued] = repo.list_jobs()
    assert queued.config["lora"] == {"rank": 8} and capsys.readouterr().out == f"{queued.id}\n"
