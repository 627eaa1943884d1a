"""Fitting a Playground chat to the model's context (issue 24, item 1): the oldest turns are
left out by bisection, never once per dropped turn, with the same result as the old one-turn-
at-a-time search on real chat templates; and a chat has at most `MAX_CHAT_MESSAGES`."""

import math
import random

import pytest
import transformers

from core_engine.assets import SHIPPED_POLICY
from core_engine.prompts import chat_prompt_ids
from core_engine.toy import byte_bpe_tokenizer, char_tokenizer
from workers.chat import MAX_CHAT_MESSAGES, ChatProblem, check_request, fit_to_context

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = ["the", "a", "sum", "of", "two", "is", "hello", "world", "answer", "7", "42", "+", "?"]


def _bpe(specials: list[str], template: str, **roles: str) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here with the family's special tokens and chat
    template."""
    corpus = [" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(200)]
    corpus += ["system user assistant You are a helpful assistant.\n\n"] * 20
    tokenizer = byte_bpe_tokenizer(corpus, specials, **roles)
    tokenizer.chat_template = template
    return tokenizer


def llama3_tokenizer() -> transformers.PreTrainedTokenizerFast:
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    return _bpe(specials, LLAMA3_TEMPLATE, bos_token=specials[0], eos_token=specials[1])


def qwen2_tokenizer() -> transformers.PreTrainedTokenizerFast:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return _bpe(specials, QWEN2_TEMPLATE, eos_token=specials[2], pad_token=specials[0])


TOKENIZERS = {
    "llama3": llama3_tokenizer,
    "qwen2-chatml": qwen2_tokenizer,
    "demo": lambda: transformers.AutoTokenizer.from_pretrained(SHIPPED_POLICY),
    "tiny": char_tokenizer,
}


def quadratic_fit(tokenizer, messages, max_seq_len, max_tokens):
    """The search this replaces: the chat re-rendered once per dropped turn."""
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = messages[len(system) :]
    for dropped in range(len(turns)):
        kept = system + turns[dropped:]
        if dropped and kept[len(system)]["role"] != "user":
            continue
        ids = chat_prompt_ids(tokenizer, kept)
        if len(ids) + max_tokens <= max_seq_len:
            return ids, dropped, max_tokens
    if len(ids) >= max_seq_len:
        raise ChatProblem("no room")
    return ids, dropped, max_seq_len - len(ids)


def _chat(rng: random.Random, digits_only: bool) -> list[dict[str, str]]:
    """A chat of random roles (two of one role in a row too) ending with the user's message,
    with or without a system prompt; contents with spaces and newlines around them."""

    def text() -> str:
        if digits_only:
            return "".join(rng.choices("0123456789+=", k=rng.randint(1, 6)))
        return rng.choice(["", " ", "\n"]) + " ".join(rng.choices(WORDS, k=rng.randint(0, 9)))

    roles = [rng.choice(["user", "assistant"]) for _ in range(rng.randint(0, 14))]
    chat = [{"role": role, "content": text()} for role in [*roles, "user"]]
    if rng.random() < 0.5:
        chat.insert(0, {"role": "system", "content": text()})
    return chat


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_bisection_keeps_what_the_turn_by_turn_search_kept(name):
    tokenizer = TOKENIZERS[name]()
    rng = random.Random(24)
    checked = 0
    for _ in range(60):
        chat = _chat(rng, digits_only=name == "demo")
        whole = len(chat_prompt_ids(tokenizer, chat))
        for max_seq_len in {max(2, whole + d) for d in range(-whole, 6, max(1, whole // 12))}:
            max_tokens = rng.choice([1, 8, rng.randint(1, max_seq_len)])
            try:
                expected = quadratic_fit(tokenizer, chat, max_seq_len, max_tokens)
            except ChatProblem:
                with pytest.raises(ChatProblem, match="leaves no room for a reply"):
                    fit_to_context(tokenizer, chat, max_seq_len, max_tokens)
                continue
            assert fit_to_context(tokenizer, chat, max_seq_len, max_tokens) == expected
            checked += 1
    assert checked > 200


@pytest.mark.parametrize("name", ["tiny", "llama3", "qwen2-chatml"])
def test_eight_thousand_one_character_turns_fit_in_a_logarithmic_number_of_renders(
    name, monkeypatch
):
    """The input that took 483 s: 8,000 one-character turns. The old search rendered the chat
    once per dropped turn (about 3,900 renders here, minutes); the bisection renders it at
    most log2(its user turns) + 2 times (counted, not timed: issue 32)."""
    tokenizer = TOKENIZERS[name]()
    renders = []
    render = tokenizer.apply_chat_template

    def counted(messages, *args, **kwargs):
        renders.append(len(messages))
        return render(messages, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "apply_chat_template", counted)
    chat = [{"role": ("user", "assistant")[i % 2], "content": "a"} for i in range(7_999)]
    ids, dropped, room = fit_to_context(tokenizer, chat, 512, 64)
    assert len(ids) + room <= 512 and room == 64 and dropped > 7_000
    user_turns = sum(m["role"] == "user" for m in chat)
    assert 0 < len(renders) <= math.log2(user_turns) + 2, renders
    # the fewest left out: from the previous user turn on, it does not fit
    assert quadratic_fit(tokenizer, chat[dropped - 2 :], 512, 64) == (ids, 2, 64)


def test_a_chat_of_more_messages_than_the_bound_is_refused_before_any_work():
    chat = [{"role": ("user", "assistant")[i % 2], "content": "a"} for i in range(7_999)]
    with pytest.raises(ChatProblem, match=f"7999 messages, more than {MAX_CHAT_MESSAGES}"):
        check_request(chat, 0.0, 8, 0)
    assert check_request(chat[-MAX_CHAT_MESSAGES + 1 :], 0.0, 8, 0).max_tokens == 8
