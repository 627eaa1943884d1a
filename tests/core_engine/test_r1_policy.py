"""The R1 demo policy: the shipped checkpoint (engine = transformers, checksum), its samples on
the `word_problems` prompts scored by the `format` reward (the template shows in a clear share,
not in all: room for RL), and its builder on a tiny budget."""

import json

import pytest
import torch
import transformers

from core_engine.assets import R1_POLICY, shipped_checkpoint
from core_engine.engine import load_engine
from core_engine.model import load_model
from core_engine.policies.r1 import (
    INFO_FILE,
    MAX_TOKENS,
    WarmupSettings,
    build_r1_policy,
    reasoning,
    training_example,
)
from core_engine.rl.data.tasks import HELDOUT_SEED, prompt_records
from core_engine.rl.data.word_problems import gsm8k_records
from core_engine.rl.rewards import format_pattern, regex_reward
from core_engine.rl.trainer.evaluate import evaluate
from core_engine.scheduler import EngineConfig
from core_engine.task import SamplingParams
from core_engine.weights import model_checksum


@pytest.fixture(scope="module")
def info():
    return json.loads((R1_POLICY / INFO_FILE).read_text())


def test_the_shipped_checkpoint_is_what_its_metadata_says(info):
    """Our decoder and Hugging Face load the same weights (the recorded checksum) and give the
    same logits on a worked example; the name `r1-demo` resolves to it; it is small."""
    assert shipped_checkpoint("r1-demo") == str(R1_POLICY)
    ours = load_model(R1_POLICY)
    hf = transformers.AutoModelForCausalLM.from_pretrained(R1_POLICY).eval()
    assert model_checksum(ours) == model_checksum(hf) == info["weights_checksum"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(R1_POLICY)
    ids, _ = training_example(tokenizer, gsm8k_records(1, HELDOUT_SEED + 1)[0])
    with torch.no_grad():
        x = torch.tensor([ids])
        torch.testing.assert_close(ours(x), hf(x).logits, rtol=1e-4, atol=1e-4)
    assert info["reached_target"] and info["built_with"]["builder"].startswith(
        "core_engine.policies.r1."
    )
    assert info["parameters"] == sum(p.numel() for p in ours.parameters())
    assert sorted(f.name for f in R1_POLICY.glob("*.safetensors")) == ["model.safetensors"]
    assert not list(R1_POLICY.glob("*.bin"))
    assert sum(f.stat().st_size for f in R1_POLICY.iterdir()) < 4 * 2**20


def test_its_samples_on_the_task_prompts_are_in_the_template_in_a_clear_share():
    """One sample per `word_problems` prompt (as a job draws them) at temperature 1, seed 0:
    the `format` reward passes a clear share of them, and not all (RL has something to do)."""
    engine = load_engine(str(R1_POLICY), EngineConfig(max_batch_size=64))
    records = prompt_records("word_problems", None, 64, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS)
    result = evaluate(engine, records, regex_reward(format_pattern()), params, seed=0)
    assert 0.15 <= result.mean_reward <= 0.9


def test_a_training_example_trains_the_reply_in_the_template_and_its_eos_only(tmp_path):
    """The builder's checkpoint loads, and its examples put the loss on exactly the reply the
    `format` reward passes, then the end of turn: never on the prompt."""
    tiny = WarmupSettings(batch_size=4, eval_every=1, eval_count=4)
    path = build_r1_policy(tmp_path / "p", max_steps=1, settings=tiny, tokenizer_rows=20)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    assert json.loads((path / INFO_FILE).read_text())["steps"] == 1
    row = gsm8k_records(1, HELDOUT_SEED + 1)[0]
    ids, mask = training_example(tokenizer, row)
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert trained[-1] == tokenizer.eos_token_id
    reply = tokenizer.decode(trained[:-1])
    assert reply == reasoning(row) and regex_reward(format_pattern())([reply], [""], [""]) == [1.0]
    assert reply.endswith(f"<answer>{row['answer'].rsplit('#### ', 1)[1]}</answer>")
    assert row["question"] in tokenizer.decode(ids[: mask.index(1)])
