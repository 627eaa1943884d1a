"""The Playground asks a real interactive worker (Redis): the reply comes from the version's
checked weights, bounds are checked again there, and a version whose weights were not kept
says so."""

import shutil

import pytest

from db import JobStatus
from tests.workers.helpers import train_config, wait_for

HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.slow
def test_chat_goes_to_the_interactive_worker(stack, tiny_model):
    [job] = stack.submit(train_config(tiny_model, steps=2))
    with stack.worker("gpu0"):
        wait_for(lambda: stack.status(job).is_terminal, 120, "the job")
    assert stack.status(job) is JobStatus.SUCCEEDED

    with stack.worker("chat0", "--interactive"):
        reply = stack.api(f"api.chat({job}, 2, {HELLO!r}, 0.0, 4, 0)")
        assert reply["policy_version"] == 2 and len(reply["output_ids"]) >= 1
        assert reply["finish_reason"] in ("stop", "length") and reply["prompt_tokens"] > 0
        too_long = stack.api(f"api.chat({job}, 2, {HELLO!r}, 0.0, 5000, 0)")
        assert "max tokens must be a whole number" in too_long["problem"]
        shutil.rmtree(stack.repo.latest_version(job).checkpoint_path)
        gone = stack.api(f"api.chat({job}, 2, {HELLO!r}, 0.0, 4, 0)")
        assert "weights not kept" in gone["problem"]
    assert "Task workers.chat[" in stack.log("chat0")
    assert "Task workers.chat[" not in stack.log("gpu0")


def test_the_worker_re_checks_every_setting_it_is_sent():
    """What a crafted task message could carry, refused before any model is loaded."""

    from workers.chat import ChatProblem, check_request

    assert check_request(HELLO, 0.7, 8, 3).max_tokens == 8
    for temperature, max_tokens, seed, said in [
        (True, 8, 0, "temperature must be"),
        ("0.5", 8, 0, "temperature must be"),
        (11.0, 8, 0, "temperature must be"),
        (0.5, 8.0, 0, "max tokens must be"),
        (0.5, 1025, 0, "max tokens must be"),
        (0.5, 8, -1, "seed must be"),
        (0.5, 8, "1", "seed must be"),
    ]:
        with pytest.raises(ChatProblem, match=said):
            check_request(HELLO, temperature, max_tokens, seed)
    with pytest.raises(ChatProblem, match="role"):
        check_request([{"role": "tool", "content": "x"}], 0.5, 8, 0)
    with pytest.raises(ChatProblem, match="the last one must be the user's"):
        check_request([*HELLO, {"role": "assistant", "content": "hi"}], 0.5, 8, 0)


def test_max_tokens_follow_the_context_the_checkpoint_states(tiny_model, tmp_path):
    """Read from ``config.json`` without loading the model; the tiny model's is 512."""
    from workers.chat import MAX_TOKENS_LIMIT, checkpoint_context, max_tokens_bounds

    assert checkpoint_context(tiny_model) == 512
    assert max_tokens_bounds(512) == (64, 511)
    assert max_tokens_bounds(32) == (16, 31)  # the demo policy's context
    assert max_tokens_bounds(4096) == (64, MAX_TOKENS_LIMIT)
    assert max_tokens_bounds(None) == (64, MAX_TOKENS_LIMIT)  # unknown: the plain bounds
    (tmp_path / "config.json").write_text("{not json")
    assert checkpoint_context(tmp_path) is None
    assert checkpoint_context(tmp_path / "gone") is None and checkpoint_context(None) is None


def test_a_turn_is_shortened_to_the_room_its_prompt_leaves(tiny_model):
    """The prompt of a chat (rendered with the real tokenizer) and its newest message alone:
    the reply gets the tokens the context has left, and none at all is refused."""
    import transformers

    from workers.chat import ChatProblem, fit_to_context

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    chat = [
        {"role": "user", "content": "a" * 20},
        {"role": "assistant", "content": "b" * 20},
        {"role": "user", "content": "hello"},
    ]

    def prompt_tokens(messages):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    whole, newest = prompt_tokens(chat), prompt_tokens(chat[2:])
    assert fit_to_context(tokenizer, chat, whole + 8, 8)[1:] == (0, 8)
    ids, dropped, room = fit_to_context(tokenizer, chat, newest + 4, 8)
    assert (len(ids), dropped, room) == (newest, 2, 4)
    with pytest.raises(ChatProblem, match="leaves no room for a reply"):
        fit_to_context(tokenizer, chat, newest, 8)
