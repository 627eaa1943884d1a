"""What the two word-problem chat policies (`calculator`, `r1`) share: the Qwen-style special
tokens, a byte-level BPE trained on their texts with the numbers cut out (every digit a token
of its own, as Qwen's tokenizers split numbers), the Llama-style shape, the seeded stream of
warm-up problems and the held-out problems the warm-ups stop on."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import transformers

from core_engine.rl.data.tasks import HELDOUT_SEED
from core_engine.rl.data.word_problems import word_problem, word_problem_records
from core_engine.toy import byte_bpe_tokenizer, tiny_config

PAD, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
VOCAB_SIZE = 512
_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class WarmupSettings:
    """The supervised warm-up's optimiser, batch and held-out evaluation."""

    lr: float = 3e-3
    beta2: float = 0.98
    batch_size: int = 16
    eval_every: int = 20
    eval_count: int = 200


def chat_tokenizer(
    texts: Sequence[str], added_tokens: Sequence[str], chat_template: str, vocab_size: int
) -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE trained on the pieces of `texts` between their numbers, the chat roles
    and end of turn special (the end of turn is the EOS), `added_tokens` single added tokens."""
    corpus = [piece for text in texts for piece in _NUMBER.split(text)]
    tokenizer = byte_bpe_tokenizer(
        corpus, (PAD, TURN_START, TURN_END), vocab_size, pad_token=PAD, eos_token=TURN_END
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [TURN_START]})
    tokenizer.add_tokens(list(added_tokens))
    tokenizer.chat_template = chat_template
    return tokenizer


def chat_config(tokenizer: Any, context: int) -> transformers.LlamaConfig:
    """Llama-style hidden 96, 4 layers, 4 heads (no GQA), MLP 256, tied embeddings, a
    `context`-token context."""
    return tiny_config(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=context,
        initializer_range=0.02,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
    )


def problem_stream(seed: int, exclude: set[str]) -> Iterator[dict[str, str]]:
    """Endless seeded word problems (question, worked answer), never a held-out question."""
    rng = random.Random(seed)
    while True:
        row = word_problem(rng)
        if row["question"] not in exclude:
            yield row


def heldout_records(count: int) -> list[dict[str, str]]:
    """The held-out problems (seed `HELDOUT_SEED`, the one the worker draws a built-in task's
    held-out prompts from) that the warm-ups stop on and docs/benchmarks.md scores."""
    return word_problem_records(count, HELDOUT_SEED)
