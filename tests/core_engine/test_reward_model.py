"""Rewards a model computes: a Hugging Face sequence-classification reward model scores
prompt + completion in batches; each score equals Hugging Face's own forward of that text
alone (no padding), its memory is in the footprint, a checkpoint it cannot load is refused
with the reason."""

import json
import shutil

import pytest
import torch
import transformers

from core_engine.rl.config import GRPOConfig
from core_engine.rl.footprint.estimate import (
    InsufficientMemoryError,
    check_footprint,
    training_footprint,
)
from core_engine.rl.rewards.mix import RewardMix
from core_engine.rl.rewards.reward_model import (
    RewardModelScorer,
    check_reward_model,
    reward_model_parameters,
)
from core_engine.toy import save_tiny_reward_model

from .test_rl_trainer import make_trainer

CPU = torch.device("cpu")
PROMPT = "<|user|>What is 3+4?<|end|><|assistant|>"
COMPLETIONS = ["7", "", "seven, I think", "12345678901234567890", "no", "7 7 7", "x" * 40]


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm"), seed=3)


def hf_score(path, text, last=None):
    """Hugging Face's forward of one text alone, in float64: the label's logit at its last
    token (`last`: only the text's last that many tokens)."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = ids[-last:] if last else ids
    with torch.no_grad():
        return model.double()(input_ids=torch.tensor([ids])).logits[0, 0].item()


def test_batched_scores_equal_hugging_faces_forward_of_each_text(reward_model):
    scorer = RewardModelScorer(reward_model, CPU, batch_size=3)  # 7 texts: 3 + 3 + 1, padded
    scores = scorer(COMPLETIONS, [""] * len(COMPLETIONS), [PROMPT] * len(COMPLETIONS))
    truth = [hf_score(reward_model, PROMPT + c) for c in COMPLETIONS]
    assert len(set(truth)) == len(truth)  # the texts score apart: a mix-up would show
    assert scores == pytest.approx(truth, abs=1e-5)


def test_long_texts_keep_their_last_max_length_tokens(reward_model):
    scorer = RewardModelScorer(reward_model, CPU, max_length=12, batch_size=4)
    completions = ["1234567890" * 3, "7", "abc" * 9]
    scores = scorer(completions, [""] * 3, [PROMPT] * 3)
    truth = [hf_score(reward_model, PROMPT + c, last=12) for c in completions]
    assert scores == pytest.approx(truth, abs=1e-5)
    # the cap is the model's positions
    assert RewardModelScorer(reward_model, CPU, max_length=10**6).max_length == 512


def test_a_reward_list_stores_the_model_score_as_a_component(reward_model):
    spec = [
        {"name": "reward_model", "model": str(reward_model), "weight": 0.5, "batch_size": 2},
        {"name": "exact_match", "weight": 2.0},
    ]
    mix = RewardMix(spec, max_tokens=64)
    completions = ["7", "8", "seven"]
    totals, parts = mix.score(completions, ["7"] * 3, [PROMPT] * 3, [1, 1, 5])
    truth = [hf_score(reward_model, PROMPT + c) for c in completions]
    assert parts["reward_model"] == pytest.approx(truth, abs=1e-5)
    expected = [0.5 * t + 2.0 * float(c == "7") for t, c in zip(truth, completions, strict=True)]
    assert totals == pytest.approx(expected, abs=1e-5)


def test_the_trainer_scores_its_rollouts_with_the_reward_model(checkpoint, reward_model, tmp_path):
    reward = [{"name": "reward_model", "model": str(reward_model)}, {"name": "exact_match"}]
    trainer = make_trainer(checkpoint, tmp_path, reward=reward, steps=1)
    rollout = trainer.step().rollout
    prompts = [rollout.prompts[rollout.group_of(i)] for i in range(rollout.num_samples)]
    truth = [
        hf_score(reward_model, p + c) for p, c in zip(prompts, rollout.completions, strict=True)
    ]
    assert rollout.reward_components["reward_model"] == pytest.approx(truth, abs=1e-5)


def test_its_memory_is_in_the_footprint_and_the_check(checkpoint, reward_model, tmp_path):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(reward_model)
    parameters = sum(p.numel() for p in model.parameters())
    assert reward_model_parameters(reward_model) == parameters
    hf = transformers.AutoConfig.from_pretrained(checkpoint)
    base = dict(model=str(checkpoint), output_dir=str(tmp_path), task="always7")
    plain = training_footprint(GRPOConfig(**base), hf, CPU)
    reward = [{"name": "reward_model", "model": str(reward_model)}]
    scored = training_footprint(GRPOConfig(**base, reward=reward), hf, CPU)
    assert scored.reward_model_bytes == 4 * parameters  # fp32 on the CPU
    assert scored.total_bytes == plain.total_bytes + 4 * parameters
    check_footprint(scored, scored.total_bytes, CPU)
    with pytest.raises(InsufficientMemoryError, match="GiB reward model"):
        check_footprint(scored, scored.total_bytes - 1, CPU)


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda f: _edit_config(f, auto_map={"AutoModel": "x.Y"}), "never run"),
        (
            lambda f: _edit_config(f, architectures=["LlamaForCausalLM"]),
            "not a sequence-classification model",
        ),
        (lambda f: _edit_config(f, id2label={"0": "a", "1": "b"}), "has 2 labels"),
        (
            lambda f: _edit_config(f, architectures=["MadeUpForSequenceClassification"]),
            "has no MadeUpForSequenceClassification",
        ),
        (lambda f: (f / "model.safetensors").unlink(), r"no \*.safetensors weights"),
        (
            lambda f: (f / "tokenizer.json").unlink() or (f / "tokenizer_config.json").unlink(),
            "no tokenizer",
        ),
        (lambda f: (f / "config.json").unlink(), "no config.json"),
    ],
)
def test_a_checkpoint_it_cannot_load_is_refused_with_the_reason(
    reward_model, tmp_path, damage, reason
):
    folder = shutil.copytree(reward_model, tmp_path / "rm")
    check_reward_model(folder)
    damage(folder)
    with pytest.raises(ValueError, match=reason):
        check_reward_model(folder)
