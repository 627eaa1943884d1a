"""The README's memory table: the footprint rule (`footprint.training_footprint`) on the meta
device for the Qwen2.5 shapes, full-weight vs LoRA (r=16, all-linear, bf16 base on CUDA), with
the KV budget the colocated engine would get beside it.

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
TABLE_LORA = LoraSettings(rank=16)  # all-linear
CARDS_GIB = (24, 80)


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


def qwen25_config(name: str) -> transformers.Qwen2Config:
    vocab, hidden, intermediate, layers, heads, kv_heads, tied = QWEN25_SHAPES[name]
    config = transformers.Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
        tie_word_embeddings=tied,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def table_rows() -> list[TableRow]:
    """Full vs LoRA floors of every shape, bf16 engine (and LoRA base) on CUDA."""
    job = {"model": "-", "output_dir": "-", "task": "addition", "device": "cuda"}
    full, lora = GRPOConfig(**job), GRPOConfig(**job, lora=TABLE_LORA)
    cuda = torch.device("cuda")
    rows = []
    for name in QWEN25_SHAPES:
        config = qwen25_config(name)
        kv = model_kv_bytes_per_token(config, torch.bfloat16)
        rows.append(
            TableRow(
                name,
                training_footprint(full, config, cuda),
                training_footprint(lora, config, cuda),
                kv,
            )
        )
    return rows


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


if __name__ == "__main__":
    print(markdown_table(table_rows()))
