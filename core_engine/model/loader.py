"""Build the decoder from a config, or load it from a local Hugging Face checkpoint directory.

Weights are read from safetensors only (never pickle), by parameter name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from core_engine.model.config import ModelConfig
from core_engine.model.decoder import CausalLM


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU, bf16 on CUDA."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def build_model(
    hf_config: Any, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> CausalLM:
    """A randomly initialised decoder for a `transformers` config object."""
    cfg = ModelConfig.from_hf(hf_config)
    model = CausalLM(cfg).to(device=device, dtype=dtype or default_dtype(device))
    model.tie_weights()  # a move that makes new parameters (e.g. to "meta") unties them
    return model.eval()


def load_state(model: CausalLM, state: dict[str, torch.Tensor]) -> None:
    """Copy tensors into the model by name; refuses missing or unexpected parameters."""
    own = model.state_dict()
    optional = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = sorted(set(own) - set(state) - optional)
    unexpected = sorted(k for k in set(state) - set(own) if not k.endswith("rotary_emb.inv_freq"))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}"
        )
    with torch.no_grad():
        for name, tensor in own.items():
            if name in state:
                if state[name].shape != tensor.shape:
                    raise ValueError(
                        f"{name}: checkpoint shape {tuple(state[name].shape)} "
                        f"!= model {tuple(tensor.shape)}"
                    )
                tensor.copy_(state[name])


def load_model(
    path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> CausalLM:
    """Load a local checkpoint directory (config.json + one or sharded *.safetensors)."""
    from transformers import AutoConfig

    path = Path(path)
    if (path / "adapter_config.json").is_file():
        raise ValueError(
            f"{path} is a PEFT adapter: load it with core_engine.engine.load_engine or "
            "core_engine.adapters.load_adapted_model (its base + the adapter)"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    files = _safetensors_files(path)
    model = build_model(AutoConfig.from_pretrained(path, local_files_only=True), dtype, device)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    load_state(model, state)
    return model


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    # model*.safetensors: other safetensors files (e.g. optimizer state) may sit beside them.
    files = sorted(path.glob("model*.safetensors")) or sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{path} has no *.safetensors weights (pickle checkpoints are refused)"
        )
    return files


def checkpoint_eos_ids(path: str | Path) -> tuple[int, ...]:
    """EOS ids from the checkpoint's generation_config.json, else config.json."""
    path = Path(path)
    for name in ("generation_config.json", "config.json"):
        file = path / name
        if file.is_file():
            eos = json.loads(file.read_text()).get("eos_token_id")
            if eos is not None:
                return tuple(eos) if isinstance(eos, list) else (eos,)
    return ()
