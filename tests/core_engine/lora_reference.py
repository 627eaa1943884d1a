"""The LoRA references: Hugging Face models with PEFT adapters, loaded the ecosystem's way."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from peft import PeftModel

from core_engine.weights import adapter_weights


def hf_base(checkpoint: str | Path) -> transformers.PreTrainedModel:
    """The Hugging Face model of a base checkpoint, fp32."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, local_files_only=True
    ).eval()


def hf_peft(checkpoint: str | Path, adapter_dir: str | Path, trainable: bool = False) -> PeftModel:
    """`PeftModel.from_pretrained` of a saved adapter on its Hugging Face base."""
    base = hf_base(checkpoint)
    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable).eval()


def randomize_adapter(model: torch.nn.Module, seed: int = 0, std: float = 0.05) -> None:
    """Non-zero values in every adapter tensor (B starts at zero: version 0 is the base)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in adapter_weights(model).values():
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64) * std
            tensor.copy_(noise)


def teacher_forced_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log-softmax at T=1 of `response` after `prompt` under a Hugging Face (PEFT) model."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]
