"""The worker refuses a training job it cannot hold, before loading anything."""

import pytest
import torch
import transformers

from core_engine.rl.config import GRPOConfig
from core_engine.rl.footprint import estimate as footprint_module
from core_engine.rl.footprint.estimate import (
    InsufficientMemoryError,
    count_parameters,
    training_footprint,
)
from core_engine.rl.trainer import policy as policy_weights_module
from core_engine.toy import tiny_config

from .test_rl_trainer import make_trainer

CPU = torch.device("cpu")


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen2", True), ("qwen2", False)])
def test_parameters_are_counted_as_transformers_counts_them(arch, tied):
    config = tiny_config(arch, vocab_size=151_936, tie_word_embeddings=tied)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    assert count_parameters(config) == hf.num_parameters()


def test_the_floor_adds_what_the_job_keeps_resident():
    hf = tiny_config("qwen2", vocab_size=1000)
    params = count_parameters(hf)
    base = dict(model="m", output_dir="o", task="addition")
    plain = training_footprint(GRPOConfig(**base), hf, CPU)
    assert plain.total_bytes == 16 * params
    with_everything = training_footprint(
        GRPOConfig(
            **base,
            kl_coef=0.1,
            engine_dtype="bfloat16",
            release_kv_during_training=False,
            kv_cache_bytes=12_345,
        ),
        hf,
        CPU,
    )
    assert with_everything.reference_bytes == 4 * params
    assert with_everything.engine_copy_bytes == 2 * params
    assert with_everything.total_bytes == (16 + 4 + 2) * params + 12_345


def test_a_job_the_worker_cannot_hold_fails_before_loading_weights(
    checkpoint, tmp_path, monkeypatch
):
    monkeypatch.setattr(footprint_module, "available_bytes", lambda device: 1 << 20)

    def never(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(policy_weights_module, "load_model", never)
    with pytest.raises(InsufficientMemoryError, match=r"needs at least .* GiB on cpu") as info:
        make_trainer(checkpoint, tmp_path)
    assert "fp32 weights + gradients + AdamW" in str(info.value)
    assert "0.00 GiB is available" in str(info.value)


def test_available_memory_is_read_from_the_host():
    assert 0 < footprint_module.available_bytes(CPU) < 1 << 50


def test_bfloat16_moments_lower_the_floor_to_12_bytes_per_parameter():
    hf = tiny_config("qwen2", vocab_size=1000)
    base = dict(model="m", output_dir="o", task="addition")
    config = GRPOConfig(**base, optimizer_state_dtype="bfloat16")
    assert training_footprint(config, hf, CPU).total_bytes == 12 * count_parameters(hf)
    with pytest.raises(ValueError, match="optimizer_state_dtype must be one of"):
        GRPOConfig(**base, optimizer_state_dtype="int8")


def test_large_frees_go_back_to_the_os_under_glibc():
    assert footprint_module.return_large_frees_to_the_os() is True  # Linux/glibc here
