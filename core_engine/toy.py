"""Small in-process building blocks: a character tokenizer, a byte-level BPE tokenizer trained
on a given corpus, and tiny model configs.

Nothing here downloads anything; tests, the demo and the benchmarks build on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import transformers

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

DEFAULT_ALPHABET = (
    "0123456789+-=*/?!.,:;()'\" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
)


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> transformers.PreTrainedTokenizerFast:
    """One token per character plus chat special tokens; `</s>` is EOS and the chat template
    is system-aware (`<|system|>...<|end|><|user|>...<|end|><|assistant|>`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in dict.fromkeys(alphabet):
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def byte_bpe_tokenizer(
    corpus: Sequence[str], special_tokens: Sequence[str], vocab_size: int = 400, **roles: str
) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here on ``corpus`` (merges across words and splits
    multi-byte characters over tokens, as real ones do); ``roles`` name its special tokens,
    e.g. ``eos_token="<|im_end|>"``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **roles)


ARCH_CONFIGS = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}


def tiny_config(arch: str = "qwen2", vocab_size: int = 128, **overrides: Any):
    """A tiny `transformers` config of the given family (2 layers, GQA 4/2 heads)."""
    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": 0.2,
        "tie_word_embeddings": arch == "qwen2",
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if arch == "qwen3":
        settings["head_dim"] = 16
    settings.update(overrides)
    config = ARCH_CONFIGS[arch](**settings)
    config.architectures = [config.__class__.__name__.replace("Config", "ForCausalLM")]
    return config


def save_tiny_checkpoint(
    path: str | Path,
    arch: str = "qwen2",
    alphabet: str = DEFAULT_ALPHABET,
    seed: int = 0,
    **overrides,
) -> Path:
    """Write a random tiny Hugging Face checkpoint (config, safetensors, tokenizer) to `path`."""
    import torch

    tokenizer = char_tokenizer(alphabet)
    config = tiny_config(arch, **{"vocab_size": len(tokenizer), **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_reward_model(
    path: str | Path,
    arch: str = "llama",
    alphabet: str = DEFAULT_ALPHABET,
    seed: int = 0,
    **overrides,
) -> Path:
    """Write a random tiny sequence-classification reward model (one label; config,
    safetensors, tokenizer) to `path`."""
    import torch

    tokenizer = char_tokenizer(alphabet)
    config = tiny_config(arch, **{"vocab_size": len(tokenizer), "num_labels": 1, **overrides})
    config.architectures = [
        config.__class__.__name__.replace("Config", "ForSequenceClassification")
    ]
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
