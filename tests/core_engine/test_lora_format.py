"""LoRA adapters in PEFT's format: what we save is what `PeftModel.save_pretrained` writes, PEFT
loads it on the Hugging Face base with our engine's log-probs, the base stays the checkpoint,
invalid settings are refused."""

import json

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load_file

from core_engine.adapters import (
    add_adapter,
    base_checksum,
    base_view,
    count_adapter_parameters,
    export_merged,
    save_adapter,
)
from core_engine.engine import load_engine
from core_engine.lora_settings import LoraSettings
from core_engine.model import load_model
from core_engine.rl.config import DEFAULT_LORA_LR, DEFAULT_LR, GRPOConfig
from core_engine.task import SamplingParams
from core_engine.toy import save_tiny_checkpoint, tiny_config
from core_engine.weights import adapter_weights, model_checksum, weights_checksum

from .lora_reference import hf_base, hf_peft, randomize_adapter, teacher_forced_logprobs

ARCHS = [("llama", "untied"), ("qwen2", "tied")]
PROMPTS = [[4, 13, 17, 5], [9, 3], [22, 8, 30]]


@pytest.fixture(scope="module", params=ARCHS, ids=[a for a, _ in ARCHS])
def base(request, tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp(request.param[0]), request.param[0])


def saved_adapter(base, directory, settings, seed=1):
    model = add_adapter(load_model(base), settings)
    randomize_adapter(model, seed)
    save_adapter(model, directory, base)
    return model


def test_the_saved_adapter_is_what_peft_saves(base, tmp_path):
    settings = LoraSettings(rank=4, alpha=8)
    saved_adapter(base, tmp_path / "ours", settings)
    hf = get_peft_model(
        hf_base(base),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    ours = load_file(tmp_path / "ours" / "adapter_model.safetensors")
    set_peft_model_state_dict(hf, ours)
    hf.save_pretrained(tmp_path / "peft")
    configs = [
        json.loads((tmp_path / d / "adapter_config.json").read_text()) for d in ("ours", "peft")
    ]
    for config in configs:
        config["target_modules"] = sorted(config["target_modules"])
    assert configs[0] == configs[1]
    assert (
        configs[0]["base_model_name_or_path"] == str(base)
        and len(configs[0]["target_modules"]) == 14
    )
    theirs = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    assert list(ours) == sorted(theirs) and len(ours) == 28
    assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == torch.float32 for k in ours)
    for directory in ("ours", "peft"):
        with safe_open(tmp_path / directory / "adapter_model.safetensors", "pt") as file:
            assert file.metadata() == {"format": "pt"}


@pytest.mark.parametrize("modules_to_save", [(), ("lm_head",)], ids=["lora", "lm_head-saved"])
def test_peft_on_the_hf_base_scores_what_our_engine_generates(base, tmp_path, modules_to_save):
    if modules_to_save and "qwen2" in str(base):
        pytest.skip("tied embeddings: modules_to_save lm_head is refused (tested below)")
    settings = LoraSettings(rank=4, alpha=8, modules_to_save=modules_to_save)
    saved_adapter(base, tmp_path / "adapter", settings)
    engine = load_engine(tmp_path / "adapter", policy_version=7)
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    results = engine.run_batch(PROMPTS, params)
    reference = hf_peft(base, tmp_path / "adapter")
    for result in results:
        assert result.ok and result.policy_version == 7
        expected = teacher_forced_logprobs(reference, result.prompt_ids, result.output_ids)
        assert torch.allclose(torch.tensor(result.output_logprobs), expected, atol=1e-5)
    last = results[-1]
    plain = teacher_forced_logprobs(hf_base(base), last.prompt_ids, last.output_ids)
    assert not torch.allclose(plain, expected, atol=1e-3)  # the adapter does change the policy


def test_a_merged_export_serves_the_same_policy(base, tmp_path):
    saved_adapter(base, tmp_path / "adapter", LoraSettings(rank=4, alpha=8))
    merged = export_merged(tmp_path / "adapter", tmp_path / "merged")
    assert not (merged / "adapter_config.json").exists() and (merged / "config.json").is_file()
    unmerged, plain = load_engine(tmp_path / "adapter"), load_engine(merged)
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=5)
    for a, b in zip(
        unmerged.run_batch(PROMPTS, params), plain.run_batch(PROMPTS, params), strict=True
    ):
        assert a.output_ids == b.output_ids
        assert torch.allclose(
            torch.tensor(a.output_logprobs), torch.tensor(b.output_logprobs), atol=1e-5
        )


def test_the_base_is_the_checkpoint_and_the_checksum_of_record_the_adapter(base, tmp_path):
    model = saved_adapter(base, tmp_path / "adapter", LoraSettings(rank=2))
    on_disk = load_file(base / "model.safetensors")
    assert base_checksum(model) == weights_checksum(on_disk)
    assert model_checksum(model) == weights_checksum(
        load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    )
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    ids = torch.tensor([PROMPTS[0]])
    plain = hf_base(base)(input_ids=ids).logits.detach()
    with torch.no_grad():  # the KL reference: the base itself, over the same tensors
        assert torch.allclose(base_view(model)(ids), plain, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(model(ids), plain, atol=1e-3)  # the adapter is back


@pytest.mark.parametrize(
    ("arch", "settings"),
    [
        ("llama", LoraSettings(rank=16)),
        ("qwen2", LoraSettings(rank=3, target_modules=["q_proj", "down_proj"])),
        ("llama", LoraSettings(rank=2, modules_to_save=["lm_head"])),
    ],
)
def test_adapter_parameters_are_counted_as_peft_counts_them(arch, settings):
    config = tiny_config(arch)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    targets = (
        "all-linear" if settings.target_modules == "all-linear" else list(settings.target_modules)
    )
    peft_config = LoraConfig(
        r=settings.rank,
        target_modules=targets,
        modules_to_save=list(settings.modules_to_save) or None,
    )
    trainable, _ = get_peft_model(hf, peft_config).get_nb_trainable_parameters()
    assert count_adapter_parameters(config, settings) == trainable


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"rank": 0}, "rank must be an integer from 1 to 1024"),
        ({"rank": 4.0}, "rank must be an integer from 1 to 1024"),
        ({"rank": True}, "rank must be an integer from 1 to 1024"),
        ({"rank": 4096}, "rank must be an integer from 1 to 1024"),
        ({"alpha": float("nan")}, "alpha must be a number > 0 and <= 4096"),
        ({"dropout": 1.0}, "dropout must be in [0, 1)"),
        ({"target_modules": ["q_proj", "lm_head"]}, "target_modules must be 'all-linear'"),
        ({"target_modules": []}, "target_modules must be 'all-linear'"),
        ({"target_modules": "attention"}, "target_modules must be 'all-linear'"),
        ({"modules_to_save": ["q_proj"]}, "modules_to_save must list distinct names"),
        ({"ranks": 4}, "unknown keys ['ranks']"),
    ],
)
def test_invalid_settings_are_refused_with_a_clear_message(values, message):
    with pytest.raises(ValueError, match="invalid lora settings") as caught:
        LoraSettings.from_dict(values)
    assert message in str(caught.value)
    job = {"model": "m", "output_dir": "o", "task": "always7", "lora": values}
    with pytest.raises(ValueError, match="invalid training config: invalid lora settings"):
        GRPOConfig.from_dict(job)


def test_job_files_take_a_lora_table_and_the_learning_rate_follows_the_10x_rule(tmp_path):
    file = tmp_path / "job.toml"
    file.write_text('model = "m"\noutput_dir = "o"\ntask = "always7"\n[lora]\nrank = 8\n')
    config = GRPOConfig.from_file(file)
    assert config.lora == LoraSettings(rank=8) and config.lora.target_modules == "all-linear"
    assert config.lr == DEFAULT_LORA_LR == pytest.approx(10 * DEFAULT_LR)
    assert config.lora.dropout == 0 and config.lora.modules_to_save == ()
    assert GRPOConfig(model="m", output_dir="o", task="always7").lr == DEFAULT_LR
    assert GRPOConfig(model="m", output_dir="o", task="always7", lr=1e-5, lora={}).lr == 1e-5
    with pytest.raises(ValueError, match="lora must be a table"):
        GRPOConfig(model="m", output_dir="o", task="always7", lora=True)


def test_a_lora_job_keeps_every_versions_adapter_unless_told_otherwise():
    job = {"model": "m", "output_dir": "o", "task": "always7"}
    assert GRPOConfig(**job).keep_last == 3  # full-weight: the last 3 and every 25th
    assert GRPOConfig(**job, lora={}).keep_last == 0  # 0: all
    assert GRPOConfig(**job, lora={}, keep_last=5).keep_last == 5


def test_tied_embeddings_cannot_be_saved_whole_and_adapters_are_no_models(base, tmp_path):
    saved_adapter(base, tmp_path / "adapter", LoraSettings(rank=2))
    with pytest.raises(ValueError, match="is a PEFT adapter: load it with"):
        load_model(tmp_path / "adapter")
    if "qwen2" in str(base):
        with pytest.raises(ValueError, match="tied to its embedding"):
            add_adapter(load_model(base), LoraSettings(modules_to_save=["lm_head"]))
    assert adapter_weights(load_model(base)) == {}
