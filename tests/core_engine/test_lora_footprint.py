"""The footprint rule knows LoRA jobs: the frozen base once, in the engine's dtype, plus the
adapter's fp32 weights, gradients and AdamW moments; docs/sizing.md's table comes from it."""

import torch
import transformers
from peft import LoraConfig, get_peft_model

from core_engine.lora_settings import LoraSettings
from core_engine.rl.config import GRPOConfig
from core_engine.rl.footprint.estimate import GIB, count_parameters, training_footprint
from core_engine.rl.footprint.table import markdown_table, shape_config, table_rows
from core_engine.toy import tiny_config

JOB = dict(model="m", output_dir="o", task="addition")


def test_a_lora_floor_is_the_base_once_plus_16_bytes_per_adapter_parameter():
    config = tiny_config("llama", vocab_size=1000)
    params = count_parameters(config)
    hf = get_peft_model(
        transformers.AutoModelForCausalLM.from_config(config),
        LoraConfig(r=8, target_modules="all-linear"),
    )
    adapter = hf.get_nb_trainable_parameters()[0]
    lora = {"rank": 8}
    cpu = training_footprint(GRPOConfig(**JOB, lora=lora), config, torch.device("cpu"))
    assert cpu.adapter_parameters == adapter and cpu.base_bytes == 4 * params
    assert cpu.total_bytes == 4 * params + 16 * adapter
    assert cpu.reference_bytes == cpu.engine_copy_bytes == 0  # the base is both
    on_cuda = GRPOConfig(**JOB, lora=lora, kl_coef=0.1, device="cuda")
    cuda = training_footprint(on_cuda, config, torch.device("cuda"))
    assert cuda.total_bytes == 2 * params + 16 * adapter
    assert "frozen base shared with the engine" in cuda.describe()
    half = GRPOConfig(**JOB, lora=lora, optimizer_state_dtype="bfloat16")
    assert training_footprint(half, config, torch.device("cpu")).trainer_bytes == 12 * adapter


def test_the_sizing_table_puts_a_7b_lora_job_under_20_gib():
    rows = {row.name: row for row in table_rows()}
    seven = rows["Qwen2.5-7B"]
    assert seven.lora.total_bytes < 20 * GIB < seven.full.total_bytes
    assert seven.full.parameters == 7_615_616_512  # Qwen2.5-7B's published count
    assert rows["Qwen2.5-0.5B"].lora.adapter_parameters == 8_798_208  # 24 x 16 x sum(in + out)
    assert seven.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    table = markdown_table(list(rows.values()))
    assert table.count("\n") == 7 and "| Qwen2.5-14B |" in table
    assert rows["Llama-3.1-8B"].full.parameters == 8_030_261_248  # Llama-3.1-8B's published count
    assert rows["Llama-3.1-8B"].kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert LoraSettings(rank=16).target_modules == "all-linear"
    assert shape_config("Qwen2.5-3B").tie_word_embeddings
    assert not shape_config("Llama-3.1-8B").tie_word_embeddings
