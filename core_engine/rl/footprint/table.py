"""The memory tables of docs/sizing.md: the footprint rule (`footprint.training_footprint`) on the
meta device for the Qwen2.5 shapes and Llama-3.1-8B, full-weight vs LoRA (r=16, all-linear, bf16
base on CUDA), with the KV budget the colocated engine would get beside it; then one device's floor
for the 7B and 8B shapes on 1, 2, 4 and 8 devices (FSDP2 full weights, replicated LoRA).

    python -m core_engine.rl.footprint.table
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import transformers

from core_engine.cache.sizing import model_kv_bytes_per_token
from core_engine.lora_settings import LoraSettings
from core_engine.rl.config import GRPOConfig
from core_engine.rl.footprint.estimate import GIB, Footprint, training_footprint
from core_engine.rl.trainer.policy import COLOCATED_GPU_MEMORY_UTILIZATION

# name: (vocabulary, hidden, intermediate, layers, heads, KV heads, tied embeddings)
QWEN25_SHAPES = {
    "Qwen2.5-0.5B": (151936, 896, 4864, 24, 14, 2, True),
    "Qwen2.5-1.5B": (151936, 1536, 8960, 28, 12, 2, True),
    "Qwen2.5-3B": (151936, 2048, 11008, 36, 16, 2, True),
    "Qwen2.5-7B": (152064, 3584, 18944, 28, 28, 4, False),
    "Qwen2.5-14B": (152064, 5120, 13824, 48, 40, 8, False),
}
LLAMA31_SHAPES = {"Llama-3.1-8B": (128256, 4096, 14336, 32, 32, 8, False)}
TABLE_LORA = LoraSettings(rank=16)  # all-linear
CARDS_GIB = (24, 80)
DEVICE_COUNTS = (1, 2, 4, 8)
SHARDED_SHAPES = ("Qwen2.5-7B", "Llama-3.1-8B")
CUDA = torch.device("cuda")


@dataclass(frozen=True)
class TableRow:
    name: str
    full: Footprint
    lora: Footprint
    kv_bytes_per_token: int

    def kv_budget(self, card_gib: int) -> int:
        """The colocated engine's KV budget on a card of `card_gib` GiB beside the LoRA floor
        (`COLOCATED_GPU_MEMORY_UTILIZATION` of what the floor leaves)."""
        free = max(card_gib * GIB - self.lora.total_bytes, 0)
        return int(free * COLOCATED_GPU_MEMORY_UTILIZATION)


@dataclass(frozen=True)
class DevicesRow:
    devices: int
    full: dict[str, Footprint]  # by shape name, one device's floor
    lora: dict[str, Footprint]


def shape_config(name: str) -> transformers.PretrainedConfig:
    """The transformers config of a shape in `QWEN25_SHAPES` or `LLAMA31_SHAPES`."""
    llama = name in LLAMA31_SHAPES
    vocab, hidden, intermediate, layers, heads, kv_heads, tied = (
        LLAMA31_SHAPES[name] if llama else QWEN25_SHAPES[name]
    )
    config_class = transformers.LlamaConfig if llama else transformers.Qwen2Config
    config = config_class(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=131072 if llama else 32768,
        tie_word_embeddings=tied,
    )
    config.architectures = ["LlamaForCausalLM" if llama else "Qwen2ForCausalLM"]
    return config


def table_jobs() -> tuple[GRPOConfig, GRPOConfig]:
    """The full-weight and the LoRA job of the tables, on CUDA (bf16 engine and LoRA base)."""
    job = {"model": "-", "output_dir": "-", "task": "addition", "device": "cuda"}
    return GRPOConfig(**job), GRPOConfig(**job, lora=TABLE_LORA)


def table_rows() -> list[TableRow]:
    """Full vs LoRA floors of every shape on one device."""
    full, lora = table_jobs()
    rows = []
    for name in {**QWEN25_SHAPES, **LLAMA31_SHAPES}:
        config = shape_config(name)
        kv = model_kv_bytes_per_token(config, torch.bfloat16)
        rows.append(
            TableRow(
                name,
                training_footprint(full, config, CUDA),
                training_footprint(lora, config, CUDA),
                kv,
            )
        )
    return rows


def devices_rows() -> list[DevicesRow]:
    """One device's full and LoRA floors of `SHARDED_SHAPES` at each of `DEVICE_COUNTS`."""
    full, lora = table_jobs()
    configs = {name: shape_config(name) for name in SHARDED_SHAPES}
    return [
        DevicesRow(
            n,
            {name: training_footprint(full, c, CUDA, n) for name, c in configs.items()},
            {name: training_footprint(lora, c, CUDA, n) for name, c in configs.items()},
        )
        for n in DEVICE_COUNTS
    ]


def markdown_table(rows: list[TableRow]) -> str:
    cards = " | ".join(f"LoRA KV budget, {gib} GiB card" for gib in CARDS_GIB)
    lines = [
        "| model | parameters | full floor | LoRA floor | adapter parameters (fp32 MiB) "
        f"| KV per token (bf16) | {cards} |",
        "|---" * (6 + len(CARDS_GIB)) + "|",
    ]
    for row in rows:
        budgets = " | ".join(
            f"{row.kv_budget(gib) / GIB:.1f} GiB = {row.kv_budget(gib) // row.kv_bytes_per_token:,}"
            " tokens"
            for gib in CARDS_GIB
        )
        adapter = row.lora.adapter_parameters
        lines.append(
            f"| {row.name} | {row.full.parameters / 1e9:.2f} B "
            f"| {row.full.total_bytes / GIB:.1f} GiB | {row.lora.total_bytes / GIB:.1f} GiB "
            f"| {adapter / 1e6:.1f} M ({adapter * 4 / 2**20:.0f} MiB) "
            f"| {row.kv_bytes_per_token / 1024:.0f} KiB | {budgets} |"
        )
    return "\n".join(lines)


def devices_table(rows: list[DevicesRow]) -> str:
    """Per-device GiB; a full cell splits into the sharded trainer state, the engine's own bf16
    copy and what FSDP2 gathers (a layer and the root)."""
    heads = " | ".join(
        f"{name} full (sharded + engine copy + gathered) | {name} LoRA" for name in SHARDED_SHAPES
    )
    lines = [f"| devices | {heads} |", "|---" * (1 + 2 * len(SHARDED_SHAPES)) + "|"]
    for row in rows:
        cells = []
        for name in SHARDED_SHAPES:
            full = row.full[name]
            state = full.trainer_bytes + full.reference_bytes
            cells.append(
                f"{full.total_bytes / GIB:.1f} GiB ({state / GIB:.1f} + "
                f"{full.engine_copy_bytes / GIB:.1f} + {full.gathered_bytes / GIB:.2f})"
            )
            cells.append(f"{row.lora[name].total_bytes / GIB:.1f} GiB")
        lines.append(f"| {row.devices} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table(table_rows()))
    print()
    print(devices_table(devices_rows()))
