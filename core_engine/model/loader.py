"""Build the decoder from a config, or load it from a local Hugging Face checkpoint directory.

Weights are read from safetensors only (never pickle), by parameter name, one tensor at a time
straight into the model: a load holds the model plus one tensor, never a second copy of the
weights (a 0.5B checkpoint: 1.84 GiB less peak memory than reading the file whole).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

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


def check_names_and_shapes(model: CausalLM, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a weight set (name -> shape) with missing, unexpected or misshapen tensors."""
    own = model.state_dict()
    optional = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = sorted(set(own) - set(shapes) - optional)
    unexpected = sorted(k for k in set(shapes) - set(own) if not k.endswith("rotary_emb.inv_freq"))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}"
        )
    for name, shape in shapes.items():
        if name in own and tuple(shape) != tuple(own[name].shape):
            raise ValueError(
                f"{name}: checkpoint shape {tuple(shape)} != model {tuple(own[name].shape)}"
            )


def load_state(model: CausalLM, state: dict[str, torch.Tensor]) -> None:
    """Copy tensors into the model by name; refuses missing or unexpected parameters."""
    check_names_and_shapes(model, {name: tuple(t.shape) for name, t in state.items()})
    own = model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if name in own:
                own[name].copy_(tensor)


def _load_files(model: CausalLM, files: list[Path]) -> None:
    """Copy the checkpoint's tensors into ``model``, one at a time. Each is read with its file
    opened afresh: safetensors maps the file, and a mapping's pages count as the process's
    memory until it is closed, so one mapping for the whole load would cost a second copy."""
    where: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(file, framework="pt") as opened:
            for name in opened.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                where[name], shapes[name] = file, tuple(opened.get_slice(name).get_shape())
    check_names_and_shapes(model, shapes)
    own = model.state_dict()
    with torch.no_grad():
        for name, file in where.items():
            if name not in own:
                continue
            with safe_open(file, framework="pt") as opened:
                own[name].copy_(opened.get_tensor(name))


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
    _load_files(model, files)
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
