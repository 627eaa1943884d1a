"""LoRA GRPO training: one step equals Hugging Face + PEFT autograd and a hand AdamW step, the base
stays bit-identical, a resumed run equals an uninterrupted one, stored samples re-score under PEFT
at their stamped version, and a weight update moves only the adapter."""

import shutil

import pytest
import torch
from peft import get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file

from core_engine.adapters import base_checksum
from core_engine.rl.trainer.checkpoint import checkpoint_dir, latest_checkpoint, read_trainer_state
from core_engine.rl.trainer.policy import BaseChangedError
from core_engine.rl.trainer.records import TrainerHooks
from core_engine.toy import save_tiny_checkpoint
from core_engine.weights import adapter_weights, model_checksum, weights_checksum

from .lora_reference import hf_base, hf_peft, teacher_forced_logprobs
from .test_rl_exactness import run
from .test_rl_trainer import make_trainer

LORA = {"rank": 4, "alpha": 8}
VARIED = "regex:.*[0-4].*"  # a reward most groups of a random policy disagree on
ARCHS = ["llama", "qwen2"]  # untied, tied


@pytest.fixture(scope="module", params=ARCHS)
def base(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return save_tiny_checkpoint(path, request.param, alphabet="0123456789?=+")


def train_recorded(base, tmp_path, steps, **overrides):
    """A LoRA run of `steps` versions (every version saved, no gradient clipping), with each
    step's samples, gradients and adapters before and after; and its step records."""
    records, steps_seen = [], []
    settings = dict(lora=LORA, checkpoint_every=1, max_grad_norm=1e6, steps=steps, reward=VARIED)
    trainer = make_trainer(
        base, tmp_path, TrainerHooks(on_step=records.append), **settings, **overrides
    )
    before = {}
    real_backward = trainer._backward

    def spying(samples):
        before.update({k: v.detach().clone() for k, v in adapter_weights(trainer.model).items()})
        out = real_backward(samples)
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        steps_seen.append({"samples": samples, "grads": grads, "adapter": dict(before)})
        return out

    trainer._backward = spying
    trainer.train()
    return trainer, steps_seen, [r for r in records if r.version is not None]


def peft_at(base, trainer, version, adapter):
    """Hugging Face + PEFT at `version`: its saved adapter, or (version 0) the trainer's first."""
    if version:
        return hf_peft(base, checkpoint_dir(trainer.output_dir, version), trainable=True)
    model = get_peft_model(hf_base(base), trainer.model.peft_config["default"])
    set_peft_model_state_dict(model, adapter)
    return model


def hf_peft_gradients(model, samples):
    """The GRPO surrogate's gradients by autograd on Hugging Face + PEFT: on-policy every ratio
    is within the clip range, so the loss is -sum A_i exp(logp - behaviour) / tokens."""
    model.zero_grad()
    tokens = sum(len(s.response) for s in samples)
    for s in samples:
        logits = model(input_ids=torch.tensor([s.prompt + s.response])).logits[0].float()
        logp = logits.log_softmax(-1)[len(s.prompt) - 1 : -1]
        logp = logp.gather(-1, torch.tensor(s.response)[:, None])[:, 0]
        ratio = torch.exp(logp - torch.tensor(s.behaviour))
        assert (ratio - 1).abs().max() < 1e-4
        (-(s.advantage * ratio).sum() / tokens).backward()
    prefix = "base_model.model."
    return {n.removeprefix(prefix): p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_lora_steps_equal_peft_autograd_and_a_hand_adamw_step(base, tmp_path):
    trainer, steps, records = train_recorded(base, tmp_path, steps=2)
    assert len(steps) == 2 and [r.version.version for r in records] == [1, 2]
    lr, (beta1, beta2), eps = trainer.config.lr, (0.9, 0.999), 1e-8
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for version, step in enumerate(steps):
        reference = peft_at(base, trainer, version, step["adapter"])
        expected = hf_peft_gradients(reference, step["samples"])
        assert set(expected) == set(step["grads"]) and len(expected) == 28
        for name, grad in step["grads"].items():
            error = (grad - expected[name]).norm()
            assert error <= 1e-5 * expected[name].norm() + 1e-12, name
        if version == 0:  # B = 0: only the B matrices learn from the first step
            assert all(g.abs().max() == 0 for n, g in expected.items() if "lora_A" in n)
        # AdamW (weight decay 0), float64, from the adapter before the step.
        after = load_file(
            checkpoint_dir(trainer.output_dir, version + 1) / "adapter_model.safetensors"
        )
        for key, old in step["adapter"].items():
            grad = step["grads"][
                key.removeprefix("base_model.model.").replace(".weight", ".default.weight")
            ].double()
            m, v = moments.get(key, (torch.zeros_like(grad), torch.zeros_like(grad)))
            m, v = beta1 * m + (1 - beta1) * grad, beta2 * v + (1 - beta2) * grad**2
            moments[key] = m, v
            t = version + 1
            update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
            hand = old.double() - lr * update
            assert torch.allclose(after[key].double(), hand, rtol=1e-6, atol=1e-7), key


def test_the_base_stays_bit_identical_and_is_served_by_the_trainers_own_modules(base, tmp_path):
    trainer, _, records = train_recorded(base, tmp_path, steps=3)
    on_disk = weights_checksum(load_file(base / "model.safetensors"))
    assert base_checksum(trainer.model) == on_disk == trainer.base_checksum
    assert read_trainer_state(latest_checkpoint(trainer.output_dir))["base_checksum"] == on_disk
    assert trainer.engine.model is trainer.model  # one copy of the base
    assert trainer.reference is None
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == sum(
        t.numel() for t in adapter_weights(trainer.model).values()
    )
    assert len(trainer.optimizer.state) == len(trainable) == 28
    for record in records:  # the checksum of record is the adapter's, as saved
        saved = load_file(
            checkpoint_dir(trainer.output_dir, record.version.version) / "adapter_model.safetensors"
        )
        assert record.version.checksum == weights_checksum(saved)
    assert (
        trainer.engine.version == 3
        and model_checksum(trainer.engine.model) == records[-1].version.checksum
    )


def test_a_weight_update_moves_only_the_adapter(base, tmp_path):
    trainer = make_trainer(base, tmp_path, lora=LORA, steps=2, drop_zero_variance_groups=False)
    sent = []
    real = trainer.engine.update_weights
    trainer.engine.update_weights = lambda weights, version, mode: (
        sent.append(weights) or real(weights, version, mode)
    )
    trainer.train()
    adapter_bytes = sum(
        t.numel() * t.element_size() for t in adapter_weights(trainer.model).values()
    )
    base_bytes = sum(
        p.numel() * p.element_size() for p in trainer.model.parameters() if not p.requires_grad
    )
    for weights in sent:
        assert all(".lora_A." in k or ".lora_B." in k for k in weights) and len(weights) == 28
        assert sum(t.numel() * t.element_size() for t in weights.values()) == adapter_bytes
    assert sent and adapter_bytes < base_bytes / 5


def test_a_stored_sample_rescores_under_peft_at_its_stamped_version(base, tmp_path):
    trainer, _, records = train_recorded(base, tmp_path, steps=3, drop_zero_variance_groups=False)
    stamped = [r for r in records if r.rollout.policy_version >= 1]
    assert stamped
    for record in stamped:
        rollout = record.rollout
        reference = hf_peft(base, checkpoint_dir(trainer.output_dir, rollout.policy_version))
        for i in range(rollout.num_samples):
            prompt = rollout.prompt_ids[rollout.group_of(i)]
            expected = teacher_forced_logprobs(reference, prompt, rollout.response_ids[i])
            assert torch.allclose(torch.tensor(rollout.temp_logprobs[i]), expected, atol=1e-5)


@pytest.mark.parametrize("kl_coef", [0.0, 0.05], ids=["no-kl", "kl-to-the-base"])
def test_a_resumed_lora_run_equals_an_uninterrupted_one(base, tmp_path, kl_coef):
    overrides = dict(lora=LORA, kl_coef=kl_coef, reward=VARIED)
    straight, straight_prompts, _ = run(base, tmp_path / "a", 4, **overrides)
    first, first_prompts, _ = run(base, tmp_path / "b", 4, stop_at=2, **overrides)
    assert first.version == 2
    resumed, resumed_prompts, _ = run(base, tmp_path / "b", 4, **overrides)
    assert resumed.version == straight.version == 4
    assert first_prompts + resumed_prompts == straight_prompts
    assert model_checksum(resumed.model) == model_checksum(straight.model)
    assert base_checksum(resumed.model) == base_checksum(straight.model)
    ours, theirs = resumed.optimizer.state_dict()["state"], straight.optimizer.state_dict()["state"]
    assert all(torch.equal(ours[i]["exp_avg_sq"], theirs[i]["exp_avg_sq"]) for i in theirs)


def test_resume_refuses_a_base_that_changed(base, tmp_path):
    own = shutil.copytree(base, tmp_path / "base")
    run(own, tmp_path / "a", 2, lora=LORA)
    save_tiny_checkpoint(
        own, "llama" if "llama" in str(base) else "qwen2", seed=1, alphabet="0123456789?=+"
    )
    with pytest.raises(BaseChangedError, match="resume with the base the run started from"):
        make_trainer(own, tmp_path / "a", lora=LORA)


def test_a_bf16_base_carries_fp32_adapters_and_adam_state(base, tmp_path):
    """The CUDA arithmetic (bf16 base, fp32 adapter and AdamW), on a CPU."""
    trainer = make_trainer(
        base, tmp_path, lora=LORA, engine_dtype="bfloat16", steps=2, drop_zero_variance_groups=False
    )
    trainer.train()
    model = trainer.model
    assert trainer.engine.model is model and trainer.update_settings.autocast is None
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    assert {
        t.dtype for s in trainer.optimizer.state.values() for k, t in s.items() if k != "step"
    } == {torch.float32}
    on_disk = {k: v.to(torch.bfloat16) for k, v in load_file(base / "model.safetensors").items()}
    assert base_checksum(model) == weights_checksum(on_disk)
    layer = model.model.layers[0].mlp.down_proj  # one layer against a float64 hand computation
    x = torch.randn(3, layer.in_features, dtype=torch.bfloat16)
    a, b = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()
    base_out = torch.nn.functional.linear(x, layer.base_layer.weight, layer.base_layer.bias)
    hand = (base_out.double() + x.double() @ a.T @ b.T * layer.scaling["default"]).to(
        torch.bfloat16
    )
    with torch.no_grad():
        assert torch.allclose(layer(x).double(), hand.double(), rtol=2**-7, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lora_training_on_cuda_keeps_one_bf16_base(base, tmp_path):
    trainer = make_trainer(
        base, tmp_path, lora=LORA, device="cuda", steps=3, drop_zero_variance_groups=False
    )
    before = base_checksum(trainer.model)
    trainer.train()
    assert trainer.engine.model is trainer.model and trainer.version == trainer.engine.version == 3
    assert trainer.model.lm_head.weight.dtype == torch.bfloat16
    assert {p.dtype for p in trainer.model.parameters() if p.requires_grad} == {torch.float32}
    assert base_checksum(trainer.model) == before
