"""The demo policy builder on a tiny budget: checkpoint format, caching, determinism, targets."""

import dataclasses
import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from core_engine.model import load_model
from core_engine.policies.demo import (
    INFO_FILE,
    SHIPPED_POLICY,
    WarmupSettings,
    addition_batch,
    build_demo_policy,
    demo_tokenizer,
    greedy_accuracy,
    heldout_records,
)
from core_engine.policies.warmup import eval_engine
from core_engine.rl.data.tasks import HELDOUT_SEED
from core_engine.weights import model_checksum

TINY = WarmupSettings(batch_size=8, eval_every=1, eval_count=16)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_demo_policy(tmp_path_factory.mktemp("demo") / "policy", max_steps=2, settings=TINY)


def test_checkpoint_loads_in_transformers_and_matches_our_decoder(policy):
    hf = transformers.AutoModelForCausalLM.from_pretrained(policy).eval()
    ours = load_model(policy)
    tokenizer = transformers.AutoTokenizer.from_pretrained(policy)
    ids = tokenizer("123+456=579", return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)
    assert hf.config.tie_word_embeddings
    assert json.loads((policy / INFO_FILE).read_text())["steps"] == 2
    assert sum(p.numel() for p in ours.parameters()) == pytest.approx(527_000, rel=0.01)


def test_tokenizer_renders_the_bare_prompt_and_ends_with_eos(policy):
    tokenizer = transformers.AutoTokenizer.from_pretrained(policy)
    messages = [{"role": "user", "content": "123+456="}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "123+456="
    assert tokenizer.eos_token == "</s>"
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == len(text)


def test_cached_checkpoint_is_reused(policy):
    before = (policy / "model.safetensors").stat().st_mtime_ns
    assert build_demo_policy(policy, max_steps=50, settings=TINY) == policy
    assert (policy / "model.safetensors").stat().st_mtime_ns == before


def test_same_seed_same_weights(policy, tmp_path):
    again = build_demo_policy(tmp_path / "again", max_steps=2, settings=TINY)
    first, second = load_file(policy / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_supervised_targets_are_the_answer_and_eos_only():
    tokenizer = demo_tokenizer()
    inputs, targets = addition_batch([("1+2=", "3"), ("10+20=", "30")], tokenizer)
    ids = tokenizer.convert_tokens_to_ids
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert inputs.tolist() == [
        [*ids(list("1+2=3")), eos, pad, pad, pad],
        [*ids(list("10+20=30")), eos],
    ]
    assert targets.tolist() == [
        [-100] * 3 + [*ids(list("3")), eos] + [-100] * 4,
        [-100] * 5 + [*ids(list("30")), eos, -100],
    ]


def test_a_seed_short_of_the_target_gives_way_to_the_next(tmp_path):
    lines = []
    impatient = dataclasses.replace(TINY, seed_patience=2)
    path = build_demo_policy(
        tmp_path / "p",
        seeds=(5, 0, 2, 9),
        target_accuracy=1.01,
        max_steps=5,
        settings=impatient,
        log=lines.append,
    )
    info = json.loads((path / INFO_FILE).read_text())
    assert info["seeds_tried"] == [5, 0, 2]  # 2 + 2 + the last step of the budget
    assert (info["seed"], info["steps"], info["total_steps"]) == (2, 1, 5)
    assert info["reached_target"] is False
    assert "seed 5 short of 101% after 2 steps: next seed" in lines
    assert any(line.startswith("warm-up seed 2, step 1:") for line in lines)
    fresh = build_demo_policy(tmp_path / "q", seeds=(2,), max_steps=1, settings=TINY)
    first, second = load_file(path / "model.safetensors"), load_file(fresh / "model.safetensors")
    assert all(torch.equal(first[k], second[k]) for k in first)  # seed 2's own first step


def test_a_seed_that_reaches_the_target_is_kept(tmp_path):
    path = build_demo_policy(tmp_path / "p", target_accuracy=0.0, max_steps=50, settings=TINY)
    info = json.loads((path / INFO_FILE).read_text())
    assert (info["seeds_tried"], info["steps"], info["reached_target"]) == ([2], 0, True)


def test_the_shipped_policy_is_what_its_metadata_says():
    """The policy in the repository: HF loads it, its checksum and its held-out accuracy are
    the recorded ones (greedy answers may differ in a rare near-tie on another CPU)."""
    info = json.loads((SHIPPED_POLICY / INFO_FILE).read_text())
    assert info["reached_target"] and info["accuracy"] >= info["target_accuracy"]
    assert info["heldout"] == {"seed": HELDOUT_SEED, "prompts": 1000, "metric": "greedy"}
    assert info["built_with"]["builder"] == "core_engine.policies.demo.build_demo_policy"
    model = load_model(SHIPPED_POLICY)
    assert model_checksum(model) == info["weights_checksum"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(SHIPPED_POLICY)
    assert model_checksum(hf) == info["weights_checksum"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(SHIPPED_POLICY)
    engine = eval_engine(model, tokenizer, info["heldout"]["prompts"])
    accuracy = greedy_accuracy(engine, heldout_records(info["heldout"]["prompts"]))
    assert accuracy == pytest.approx(info["accuracy"], abs=0.01)
    size = sum(f.stat().st_size for f in SHIPPED_POLICY.iterdir())
    assert size < 3 * 2**20
