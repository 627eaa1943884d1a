"""The decoder equals Hugging Face's for each supported family, and loads checkpoints safely."""

import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from core_engine.model import UnsupportedModelError, build_model, load_model
from core_engine.model.config import ModelConfig
from core_engine.toy import tiny_config

from .reference import make_pair


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True, "attention_bias": True}),
        ("mistral", {}),
        ("qwen2", {}),
        ("qwen2", {"tie_word_embeddings": False}),
        ("qwen3", {}),
    ],
)
def test_plain_forward_matches_transformers(arch, overrides):
    ours, hf = make_pair(arch, **overrides)
    ids = torch.randint(0, 128, (3, 17))
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(ids).logits, atol=1e-5)


def test_family_features_are_read_from_config():
    assert ModelConfig.from_hf(tiny_config("qwen2")).attention_bias
    assert ModelConfig.from_hf(tiny_config("qwen3")).qk_norm
    llama = ModelConfig.from_hf(tiny_config("llama", num_key_value_heads=1))
    assert (llama.num_heads, llama.num_kv_heads) == (4, 1)
    assert ModelConfig.from_hf(tiny_config("qwen2", rope_theta=12345.0)).rope_theta == 12345.0


def test_llama3_rope_scaling_matches_transformers():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    }
    ours, hf = make_pair("llama", rope_parameters=scaling)
    assert ours.config.rope_scaling["rope_type"] == "llama3"
    ids = torch.randint(0, 128, (1, 200))
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(ids).logits, atol=1e-4)


def test_unsupported_architecture_is_named_clearly():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)
    with pytest.raises(UnsupportedModelError, match="supported: LlamaForCausalLM"):
        build_model(config)


def test_loads_single_and_sharded_safetensors(tmp_path):
    ours, hf = make_pair("qwen3", tie_word_embeddings=False)
    single = tmp_path / "single"
    hf.save_pretrained(single, safe_serialization=True)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").exists()
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        for path in (single, sharded):
            assert torch.equal(load_model(path)(ids), ours(ids))


def test_refuses_pickle_checkpoints_and_mismatched_weights(tmp_path):
    config = tiny_config("llama")
    config.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(tmp_path)
    model = build_model(config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state.pop("model.norm.weight")
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        load_model(tmp_path)


def test_architecture_inferred_from_model_type(tmp_path):
    config = tiny_config("qwen2")
    config.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.pop("architectures")
    (tmp_path / "config.json").write_text(json.dumps(data))
    loaded = transformers.AutoConfig.from_pretrained(tmp_path)
    assert ModelConfig.from_hf(loaded).architecture == "Qwen2ForCausalLM"


def test_dtype_is_configurable():
    model = build_model(tiny_config("qwen2"), dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert build_model(tiny_config("qwen2")).lm_head.weight.dtype == torch.float32
