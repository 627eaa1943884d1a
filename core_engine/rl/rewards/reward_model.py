"""Rewards a model computes: a Hugging Face sequence-classification reward model (one label),
as an entry ``{name="reward_model", model=<checkpoint>}`` of a reward list
(`core_engine.rl.rewards.mix`).

It scores ``prompt + completion`` (the rendered prompt and the decoded completion, as TRL's
`GRPOTrainer` does for a reward model and a plain-text prompt) with its own tokenizer, without
special tokens added: the score is the label's logit at the text's last token. Texts longer than
``max_length`` tokens (default and cap: the model's ``max_position_embeddings``) keep their last
``max_length`` tokens, where the completion is. Scored ``batch_size`` texts at a time, padded on
the right, on the worker's device, in the engine's "auto" dtype (bf16 on CUDA, else fp32).

The model is operator-chosen weights: it runs in the worker process (not the reward sandbox),
loads safetensors only and never runs code from the checkpoint (no ``auto_map``, no
``trust_remote_code``): an architecture `transformers` has itself. Two scorers of one
checkpoint on one device (the trainer's, the held-out evaluation's) share the loaded model.
"""

from __future__ import annotations

import json
import struct
import weakref
from collections.abc import Callable, Mapping, Sequence
from math import prod
from pathlib import Path
from typing import Any

from core_engine.user_files import MAX_TEXT_BYTES, read_text

REWARD_MODEL = "reward_model"  # its name in a reward list
DEFAULT_BATCH_SIZE = 8
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_loaded: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _is_reward_model(entry: Any) -> bool:
    """Whether a reward list entry is a reward model's (with a checkpoint or Hub id)."""
    return (
        isinstance(entry, Mapping)
        and entry.get("name") == REWARD_MODEL
        and isinstance(entry.get("model"), str)
    )


def reward_model_paths(reward: Any) -> list[str]:
    """The checkpoints (or Hub ids) of the reward models of a job's ``reward`` (valid or not)."""
    if not isinstance(reward, list | tuple):
        return []
    return [entry["model"] for entry in reward if _is_reward_model(entry)]


def with_reward_models(reward: Any, change: Callable[[str], str]) -> Any:
    """A job's ``reward`` with each reward model's ``model`` changed by ``change`` (e.g. a Hub
    id resolved to its snapshot); anything else as it is."""
    if not reward_model_paths(reward):
        return reward
    return [
        {**entry, "model": change(entry["model"])} if _is_reward_model(entry) else entry
        for entry in reward
    ]


def check_reward_model(path: str | Path) -> None:
    """ValueError naming what makes ``path`` no reward model this worker can load (reads
    config.json only; nothing of the checkpoint's is imported)."""
    where = f"reward model {path}"
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{where}: no config.json (a Hugging Face checkpoint directory)")
    try:
        config = json.loads(read_text(folder / "config.json", MAX_TEXT_BYTES))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: config.json cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: config.json is not a JSON object")
    if "auto_map" in config:
        raise ValueError(
            f"{where}: its config names code of its own (auto_map), which is never run "
            "(no trust_remote_code): use an architecture transformers has"
        )
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(
            f"{where}: not a sequence-classification model (architectures {architectures}; "
            "expected a *ForSequenceClassification)"
        )
    import transformers  # what it has, not code of the checkpoint's

    if not any(hasattr(transformers, str(a)) for a in architectures):
        raise ValueError(
            f"{where}: transformers {transformers.__version__} has no {architectures[0]} (a "
            "reward model's architecture must be one transformers has)"
        )
    labels = len(config.get("id2label") or {"0": None})
    if labels != 1:
        raise ValueError(f"{where}: has {labels} labels; a reward model scores one (num_labels 1)")
    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"{where}: no *.safetensors weights (the only weights loaded)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{where}: no tokenizer ({' or '.join(TOKENIZER_FILES)})")


def reward_model_parameters(path: str | Path) -> int:
    """The parameters of a checkpoint's safetensors weights, from their headers alone."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"reward model {path}: no *.safetensors weights (the only weights loaded)")
    total = 0
    for file in files:
        with open(file, "rb") as opened:
            (size,) = struct.unpack("<Q", opened.read(8))
            if size > MAX_TEXT_BYTES:
                raise ValueError(f"{file}: safetensors header of {size} bytes is too large")
            header = json.loads(opened.read(size))
        total += sum(prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def _load(path: str, device: Any, dtype: Any) -> Any:
    """The checkpoint's model on ``device`` in ``dtype``, in inference mode: one copy per
    (checkpoint, device) while any scorer holds it."""
    key = (str(Path(path).resolve()), str(device), str(dtype))
    model = _loaded.get(key)
    if model is None:
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=dtype, local_files_only=True, use_safetensors=True, trust_remote_code=False
        )
        model = model.to(device).eval().requires_grad_(False)
        _loaded[key] = model
    return model


class RewardModelScorer:
    """A reward function `(completions, references, prompts) -> scores` of a reward model
    (module docstring)."""

    def __init__(
        self,
        path: str | Path,
        device: Any = "cpu",
        max_length: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        import torch
        from transformers import AutoTokenizer

        from core_engine.engine import resolve_dtype

        check_reward_model(path)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # one key per card
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.model = _load(str(path), self.device, resolve_dtype("auto", self.device))
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.tokenizer.truncation_side = "left"
        config = self.model.config
        pad = next(
            (i for i in (config.pad_token_id, self.tokenizer.pad_token_id) if i is not None),
            self.tokenizer.eos_token_id,
        )
        if pad is None:
            raise ValueError(
                f"reward model {path}: neither its config nor tokenizer has a pad or eos token"
            )
        config.pad_token_id = self.pad_id = pad  # what the model reads the last token by
        positions = getattr(config, "max_position_embeddings", None) or max_length
        self.max_length = min(max_length or positions, positions) if positions else None
        self.batch_size = batch_size or DEFAULT_BATCH_SIZE

    def __call__(
        self, completions: Sequence[str], references: Sequence[str], prompts: Sequence[str]
    ) -> list[float]:
        import torch

        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            ids = self.tokenizer(
                texts[start : start + self.batch_size],
                add_special_tokens=False,
                truncation=self.max_length is not None,
                max_length=self.max_length,
            )["input_ids"]
            width = max(len(row) for row in ids)
            padded = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(ids), width), dtype=torch.long)
            for row, tokens in enumerate(ids):
                padded[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
                mask[row, : len(tokens)] = 1
            with torch.inference_mode():
                logits = self.model(
                    input_ids=padded.to(self.device), attention_mask=mask.to(self.device)
                ).logits
            scores.extend(logits[:, 0].float().tolist())
        return scores
