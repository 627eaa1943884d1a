"""The audit of an in-flight sample (a weight update landed between two of its decode steps):
each run of tokens is re-scored under its own version with the K/V that older versions left
in the cache. The truth is a step-by-step Hugging Face decode that switches weights at chosen
steps, token by token with one `past_key_values`; versions are checkpoints saved the way the
trainer saves them (full weights, or a PEFT adapter over a base)."""

import shutil
from pathlib import Path

import pytest
import torch
from sqlalchemy import update
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from core_engine.adapters import add_adapter
from core_engine.lora_settings import LoraSettings
from core_engine.model import load_model
from core_engine.rl.trainer.checkpoint import save_checkpoint
from core_engine.toy import save_tiny_checkpoint
from core_engine.weights import model_checksum
from db import BatchRecord, PolicyVersionRecord, SampleFilter, SampleRecord
from db.arrays import encode_float32
from db.models import Sample
from workers.scoring import AUDIT_TOLERANCE, audit_samples

PROMPT = "abcab"
SCHEDULE = [0] * 4 + [1] * 3 + [2] * 3  # the version that samples each response token
RUNS = [[0, 4], [1, 3], [2, 3]]


def _versions(root: Path, lora: bool) -> tuple[Path, list[tuple[Path, str]]]:
    """A tiny Qwen2 base and versions 0-2 of it (each a perturbed copy, or a perturbed
    adapter), saved by `save_checkpoint`: (base, [(checkpoint, checksum), ...])."""
    base = save_tiny_checkpoint(root / "base", arch="qwen2", seed=3)
    model = load_model(base, torch.float32)
    if lora:
        add_adapter(model, LoraSettings(rank=4, alpha=8.0))
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trained, lr=0.1)
    torch.manual_seed(7)
    saved = []
    for version in range(3):
        with torch.no_grad():
            for p in trained if version else []:
                p.add_(torch.randn_like(p) * (0.3 if lora else 0.05))
        path = save_checkpoint(root / "ckpt", model, optimizer, version, version, base)
        saved.append((path, model_checksum(model)))
    return base, saved


def _hf_model(checkpoint: Path, base: Path) -> torch.nn.Module:
    if not (checkpoint / "adapter_config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    from peft import PeftModel

    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(hf, str(checkpoint)).eval()


def _decode(
    models: list[torch.nn.Module], prompt: list[int], resumed_at: int | None = None
) -> tuple[list[int], list[float]]:
    """Sample `SCHEDULE`'s tokens one step at a time, step j under ``models[SCHEDULE[j]]``,
    the cache carried across the switches (at step ``resumed_at``, a preempted request's
    resume: the whole prefix recomputed under that step's version): tokens and log-probs."""
    cache, fed = DynamicCache(), prompt
    generator = torch.Generator().manual_seed(11)
    tokens, logprobs = [], []
    with torch.no_grad():
        for step, version in enumerate(SCHEDULE):
            if step == resumed_at:
                cache, fed = DynamicCache(), prompt + tokens
            logits = models[version](torch.tensor([fed]), past_key_values=cache).logits[0, -1]
            logp = logits.log_softmax(-1)
            token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            tokens.append(token)
            logprobs.append(float(logp[token]))
            fed = [token]
    return tokens, logprobs


def _teacher_forced(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


def _in_flight_sample(
    repo, tmp_path: Path, lora: bool, resumed_at: int | None = None, recorded: bool = True
) -> tuple[int, list[Path]]:
    """A stored sample of `SCHEDULE`, its log-probs from `_decode`; its job's checkpoints."""
    base, saved = _versions(tmp_path, lora)
    models = [_hf_model(path, base) for path, _ in saved]
    prompt = AutoTokenizer.from_pretrained(base)(PROMPT, add_special_tokens=False)["input_ids"]
    tokens, logprobs = _decode(models, prompt, resumed_at)
    # the cache matters: tokens 4-6 under version 1 with version 1's own K/V score otherwise
    alone = _teacher_forced(models[1], prompt, tokens)[4:7]
    assert max(abs(a - b) for a, b in zip(alone, logprobs[4:7], strict=True)) > 1e-3
    job = repo.create_job("train", {"model": str(base), "temperature": 1.0})
    repo.mark_running(job.id)
    for version, (path, checksum) in enumerate(saved):
        parent = version - 1 if version else None
        repo.record_policy_version(
            PolicyVersionRecord(job.id, version, parent, str(path), checksum)
        )
    sample = SampleRecord(
        prompt_index=0,
        group_index=0,
        policy_version=0,
        prompt_text=PROMPT,
        response_text="".join(map(str, tokens)),
        response_token_ids=tokens,
        behaviour_logprobs=logprobs,
        temperature_logprobs=logprobs,
        finish_reason="length",
        reward=1.0,
        token_versions=RUNS,
        resumed_at=[resumed_at] if resumed_at is not None and recorded else None,
    )
    batch = repo.record_batch(BatchRecord(job.id, 2, 0, "accepted", [sample]))
    [stored] = repo.list_samples(SampleFilter(job.id, batch_id=batch.id)).items
    return stored.id, [path for path, _ in saved]


def _audit(repo, settings, sample_id: int) -> dict:
    [result] = audit_samples(repo, settings, [sample_id])["samples"]
    return result


def _spans(result: dict) -> list[tuple[int, int, int, str]]:
    return [
        (s["version"], s["first_token"], s["last_token"], s["status"]) for s in result["segments"]
    ]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_each_run_is_rescored_under_its_version_with_the_cache_older_versions_left(
    repo, settings, tmp_path, lora
) -> None:
    sample_id, checkpoints = _in_flight_sample(repo, tmp_path, lora)
    result = _audit(repo, settings, sample_id)
    assert result["status"] == "pass" and result["version"] == 0, result
    assert _spans(result) == [(0, 0, 3, "pass"), (1, 4, 6, "pass"), (2, 7, 9, "pass")]
    assert result["max_abs_diff"] <= AUDIT_TOLERANCE
    assert result["checks"] == (
        "tokens 0-3 re-scored under version 0, tokens 4-6 under version 1, tokens 7-9 under "
        "version 2, each with the K/V of earlier positions computed by the versions that "
        "computed them in the engine (prompt: v0)"
    )

    stored = repo.get_sample(sample_id).temperature_logprobs
    tampered = [v + 0.01 if i == 5 else v for i, v in enumerate(stored)]
    with repo.engine.begin() as connection:
        connection.execute(
            update(Sample)
            .where(Sample.id == sample_id)
            .values(temperature_logprobs=encode_float32(tampered))
        )
    result = _audit(repo, settings, sample_id)
    assert result["status"] == "fail"
    assert [s["status"] for s in result["segments"]] == ["pass", "fail", "pass"]
    assert result["segments"][1]["max_abs_diff"] == pytest.approx(0.01, abs=1e-4)

    shutil.rmtree(checkpoints[1])
    result = _audit(repo, settings, sample_id)
    assert result["status"] == "weights not kept" and result["max_abs_diff"] is not None
    assert [s["status"] for s in result["segments"]] == [
        "pass",
        "weights not kept",
        "not checked",
    ]
    assert "needs the K/V of version 1" in result["segments"][2]["problem"]


def test_a_version_whose_checkpoint_changed_is_an_error_of_its_run_only(
    repo, settings, tmp_path
) -> None:
    sample_id, checkpoints = _in_flight_sample(repo, tmp_path, lora=False)
    weights = "model.safetensors"
    shutil.copy(checkpoints[0] / weights, checkpoints[2] / weights)  # not version 2's weights
    result = _audit(repo, settings, sample_id)
    assert result["status"] == "error"
    assert _spans(result) == [(0, 0, 3, "pass"), (1, 4, 6, "pass"), (2, 7, 9, "error")]
    assert "does not match its recorded checksum" in result["problem"]


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "not-recorded"])
def test_a_preempted_sample_is_replayed_from_where_it_resumed(
    repo, settings, tmp_path, recorded
) -> None:
    """Preempted at token 6 (version 2's run), the request resumed with every earlier K/V
    recomputed by version 2: with the resume point stored the replay does the same and passes;
    the same sample without it fails where the K/V differ."""
    sample_id, _ = _in_flight_sample(repo, tmp_path, False, resumed_at=8, recorded=recorded)
    result = _audit(repo, settings, sample_id)
    if recorded:
        assert result["status"] == "pass", result
        assert _spans(result) == [
            (0, 0, 3, "pass"),
            (1, 4, 6, "pass"),
            (2, 7, 7, "pass"),
            (2, 8, 9, "pass"),
        ]
        assert "tokens 8-9 under version 2 (resumed after a preemption" in result["checks"]
    else:
        assert result["status"] == "fail"
        assert [s["status"] for s in result["segments"]] == ["pass", "pass", "fail"]


def test_an_episode_is_audited_turn_by_turn_over_its_assistant_tokens(
    repo, settings, tmp_path
) -> None:
    """A multi-turn episode our engine ran while versions 1 and 2 landed between its turns:
    each assistant turn is re-scored under its version from the K/V the engine had at the
    turn's start; the template's tokens between turns are not re-scored."""
    from core_engine.engine import load_engine
    from core_engine.scheduler import EngineConfig
    from core_engine.weights import canonical_weights
    from tests.core_engine.test_episodes import CountingEnvironment, run_episodes
    from workers.records import sample_records

    base, saved = _versions(tmp_path, lora=False)
    engine = load_engine(saved[0][0], EngineConfig(max_seq_len=256, page_size=4))
    served = [canonical_weights(load_model(path, torch.float32)) for path, _ in saved]

    def land_next_version():
        if engine.version < 2:
            engine.update_weights(served[engine.version + 1], engine.version + 1, "in_flight")

    rollout = run_episodes(
        engine, CountingEnvironment(on_step=land_next_version), in_flight=True, group=1
    )
    job = repo.create_job("train", {"model": str(base), "temperature": 1.0})
    repo.mark_running(job.id)
    for version, (path, checksum) in enumerate(saved):
        parent = version - 1 if version else None
        repo.record_policy_version(
            PolicyVersionRecord(job.id, version, parent, str(path), checksum)
        )
    [first, *_] = sample_records(rollout, [1.0] * rollout.num_samples)
    batch = repo.record_batch(BatchRecord(job.id, 2, 0, "accepted", [first]))
    [stored] = repo.list_samples(SampleFilter(job.id, batch_id=batch.id)).items
    result = _audit(repo, settings, stored.id)
    assert result["status"] == "pass", result
    assert [s["version"] for s in result["segments"]] == [0, 1, 2]
    logprobs = repo.get_sample(stored.id).temperature_logprobs
    observation = next(p for p in first.segments if p["role"] == "user")
    for index, status in ((observation["start"], "pass"), (observation["end"], "fail")):
        tampered = [v + 0.01 if i == index else v for i, v in enumerate(logprobs)]
        with repo.engine.begin() as connection:
            connection.execute(
                update(Sample)
                .where(Sample.id == stored.id)
                .values(temperature_logprobs=encode_float32(tampered))
            )
        assert _audit(repo, settings, stored.id)["status"] == status
