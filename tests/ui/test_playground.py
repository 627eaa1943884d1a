"""Playground tab: chat with a job's saved version (a real tiny checkpoint) through the engine.
The replies come from the interactive worker's function (`workers.chat`), run in the test
process by the fake queue; the UI handlers themselves load no model."""

import re

import pytest
from gradio_client import Client
from markdown_it import MarkdownIt

from db import PolicyVersionRecord
from ui.app import build_app
from ui.handlers.playground import answerable_versions, clear, send
from ui.render import inert
from workers.api import max_tokens_bounds

VERSION = 2
DEMO_CONTEXT = 32  # the demo policy's max_position_embeddings


@pytest.fixture(scope="module")
def chat_job(world, tmp_path_factory) -> int:
    """A train job whose version 2 has a random tiny checkpoint with its true checksum,
    version 3 the same checkpoint with a wrong one, version 0 no checkpoint, and version 4
    a checkpoint that was not kept (deleted by a retention policy)."""
    import torch

    from core_engine.model import load_model
    from core_engine.toy import save_tiny_checkpoint
    from core_engine.weights import canonical_weights, weights_checksum

    path = save_tiny_checkpoint(tmp_path_factory.mktemp("playground") / "ckpt")
    checksum = weights_checksum(canonical_weights(load_model(path, torch.float32, "cpu")))
    repo = world["repo"]
    job = repo.create_job("train", {"model": str(path), "task": "always7", "steps": 3})
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0, None))
    repo.record_policy_version(PolicyVersionRecord(job.id, VERSION, None, str(path), checksum))
    repo.record_policy_version(PolicyVersionRecord(job.id, 3, None, str(path), "0" * 64))
    gone = str(path.parent / "deleted")
    repo.record_policy_version(PolicyVersionRecord(job.id, 4, None, gone, checksum))
    repo.mark_succeeded(job.id)
    return job.id


def record_job(repo, path, versions=(0,)) -> int:
    """A finished train job whose ``versions`` are the checkpoint at ``path``, with its true
    checksum."""
    import torch

    from core_engine.model import load_model
    from core_engine.weights import canonical_weights, weights_checksum

    checksum = weights_checksum(canonical_weights(load_model(path, torch.float32, "cpu")))
    job = repo.create_job("train", {"model": str(path), "task": "addition", "steps": 3})
    repo.mark_running(job.id)
    for version in versions:
        repo.record_policy_version(PolicyVersionRecord(job.id, version, None, str(path), checksum))
    repo.mark_succeeded(job.id)
    return job.id


@pytest.fixture(scope="module")
def demo_shaped_job(world, tmp_path_factory) -> int:
    """A job on a tiny Llama shaped like the demo policy: digits, '+' and '=', and a
    32-token context."""
    from core_engine.toy import save_tiny_checkpoint

    path = save_tiny_checkpoint(
        tmp_path_factory.mktemp("demo-shaped") / "ckpt",
        arch="llama",
        alphabet="0123456789+=",
        max_position_embeddings=DEMO_CONTEXT,
    )
    return record_job(world["repo"], path)


def chat(services, job_id, message, history=(), **settings):
    values = {"temperature": 0, "max_tokens": 8, "seed": 0, "system": "", "keep_history": False}
    values.update(settings)
    return send(
        services,
        job_id,
        settings.get("version", VERSION),
        values["system"],
        message,
        list(history),
        values["temperature"],
        values["max_tokens"],
        values["seed"],
        values["keep_history"],
    )


def expected(services, job_id, messages, max_tokens=8, version=VERSION):
    from core_engine.task import SamplingParams
    from workers.engines import engine_cache, saved_version
    from workers.settings import Settings

    info = saved_version(services.repository, job_id, version)
    engine, _ = engine_cache(Settings.from_env()).verified(
        info.checkpoint_path, info.version, info.weights_checksum
    )
    text = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    return engine.run_batch([ids], SamplingParams(max_tokens=max_tokens, temperature=0))[0]


def test_reply_is_the_engines_greedy_answer(services, chat_job):
    history, tokens, facts, box = chat(services, chat_job, "hello", system="be brief")
    result = expected(
        services,
        chat_job,
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
    )
    assert history == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": inert(result.text)},
    ]
    assert tokens.count('class="tok"') == len(result.output_ids) > 0
    assert f"policy version **{VERSION}**" in facts
    assert f"finish **{result.finish_reason.value}**" in facts
    assert box == ""


def test_single_turn_by_default(services, chat_job):
    first, *_ = chat(services, chat_job, "hi")
    second, _, facts, _ = chat(services, chat_job, "again", history=first)
    result = expected(services, chat_job, [{"role": "user", "content": "again"}])
    assert second == [
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": inert(result.text)},
    ]
    assert "single turn" in facts


def test_multi_turn_includes_the_history(services, chat_job):
    first, *_ = chat(services, chat_job, "hi")
    second, *_ = chat(services, chat_job, "again", history=first, keep_history=True)
    result = expected(services, chat_job, [*first, {"role": "user", "content": "again"}])
    assert second[:2] == first and second[2] == {"role": "user", "content": "again"}
    assert second[3] == {"role": "assistant", "content": inert(result.text)}
    # Gradio's normalised message form is accepted as history too
    normalised = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in first]
    assert chat(services, chat_job, "again", history=normalised, keep_history=True)[0] == second


def test_history_past_the_context_is_trimmed_with_a_notice(services, chat_job):
    long = [{"role": "user", "content": "a" * 300}, {"role": "assistant", "content": "b" * 300}]
    turns, _, facts, _ = chat(services, chat_job, "hello", history=long, keep_history=True)
    assert "2 older message(s) left out" in facts and "token context" in facts
    # what was generated is the reply to the newest message alone (the longest fitting tail)
    result = expected(services, chat_job, [{"role": "user", "content": "hello"}])
    assert turns[-1] == {"role": "assistant", "content": inert(result.text)}
    too_long, _, facts, _ = chat(services, chat_job, "c" * 600, keep_history=True)
    assert inert("leaves no room for a reply in the model's 512-token context") in facts
    assert too_long == []


def test_every_invalid_setting_is_named_in_one_message(services, chat_job):
    _, _, facts, _ = chat(services, chat_job, "hi", temperature=-1, max_tokens=0, seed="x")
    assert facts.count("**") == 2  # one message
    for part in ("temperature must be", "max tokens must be", "seed: 'x' is not a number"):
        assert inert(part) in facts


def test_a_history_over_the_message_bound_is_refused_before_it_is_sent(services, chat_job):
    """200 exchanges are the most a chat sends (issue 24: 8,000 one-character turns took
    483 s on the worker); without history the same chat is answered."""
    from workers.chat import MAX_CHAT_MESSAGES

    history = [{"role": ("user", "assistant")[i % 2], "content": "a"} for i in range(400)]
    turns, tokens, facts, _ = chat(services, chat_job, "hello", history, keep_history=True)
    said = f"the chat has 401 messages, more than {MAX_CHAT_MESSAGES}: clear it"
    assert inert(said) in facts and turns == history and tokens == ""
    turns, *_ = chat(services, chat_job, "hello", history[:-1], keep_history=True)
    assert len(turns) == 401  # 399 + the message + the reply
    assert len(chat(services, chat_job, "hello", history)[0]) == 2  # single turn


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"version": None}, "choose a job and one of its saved versions"),
        ({"message": "  "}, "type a message"),
        ({"temperature": -1}, "temperature must be between 0 and 10"),
        ({"temperature": "hot"}, "temperature must be between 0 and 10"),
        ({"max_tokens": 0}, "max tokens must be a whole number from 1 to 1024"),
        ({"seed": 1.5}, "seed: 1.5 is not a whole number"),
        ({"version": 0}, "weights not kept"),
        ({"version": 4}, "weights not kept"),
        ({"version": 9}, "has no saved version 9"),
        ({"version": 3}, "does not match its recorded checksum"),
    ],
)
def test_bad_input_is_explained(services, chat_job, change, error):
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    message = change.pop("message", "hello")
    turns, tokens, facts, box = chat(services, chat_job, message, history, **change)
    assert inert(error) in facts and turns == history and tokens == "" and box == message


def test_the_picker_offers_the_versions_that_can_answer(services, chat_job, job):
    """Version 0 was never saved and version 4's weights were deleted: they cannot answer
    (version 3 can load, and says at once that its checksum does not match)."""
    versions = answerable_versions(services, chat_job)
    assert versions.answerable == [VERSION, 3] and versions.not_kept == 2
    assert versions.context == 512  # the tiny checkpoint's max_position_embeddings
    assert answerable_versions(services, job.id).answerable == []  # its model has no config
    assert answerable_versions(services, "x").answerable == []
    assert clear() == ([], "", "", "")


def test_the_default_max_tokens_fit_the_demo_context_and_are_answered(services, demo_shaped_job):
    """The first message with the Playground's defaults (temperature 0, seed 0, the max
    tokens offered for the job's model) is answered on a 32-token model."""
    from workers.chat import chat_reply
    from workers.settings import Settings

    versions = answerable_versions(services, demo_shaped_job)
    default, largest = max_tokens_bounds(versions.context)
    assert versions.context == DEMO_CONTEXT and (default, largest) == (16, 31)
    hello = [{"role": "user", "content": "12+34="}]
    reply = chat_reply(
        services.repository, Settings.from_env(), demo_shaped_job, 0, hello, 0.0, default, 0
    )
    assert "problem" not in reply and reply["max_tokens"] == default
    assert reply["prompt_tokens"] + len(reply["output_ids"]) <= DEMO_CONTEXT
    # the old default (64) no longer refuses: the worker lowers it to the room left, and says so
    turns, _, facts, _ = chat(services, demo_shaped_job, "12+34=", max_tokens=64, version=0)
    room = DEMO_CONTEXT - reply["prompt_tokens"]
    assert f"**max tokens lowered to {room}**" in facts and turns[-1]["role"] == "assistant"
    _, _, facts, _ = chat(services, demo_shaped_job, "1" * 40, version=0)
    assert inert(f"leaves no room for a reply in the model's {DEMO_CONTEXT}-token") in facts


def _rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").render(markdown)


def test_chat_text_is_shown_inert_and_sent_as_typed(services, chat_job):
    message = "![x](http://e.vil/i.png) [click](http://e.vil) <img src=y> www.e.vil http://e.vil"
    turns, *_ = chat(services, chat_job, message)
    shown = turns[0]["content"]
    html = _rendered(shown)
    assert "<a" not in html and "<img" not in html and "&lt;img src=y&gt;" in html
    # no GFM autolink literal can form (it needs "http://", "https://" or "www.")
    assert not re.search(r"https?://|www\.", shown)
    # the chat read back from the component is what was typed and generated
    second, *_ = chat(services, chat_job, "again", history=turns, keep_history=True)
    raw = [{"role": "user", "content": message}, {"role": "user", "content": "again"}]
    first_reply = expected(services, chat_job, raw[:1]).text
    result = expected(
        services, chat_job, [raw[0], {"role": "assistant", "content": first_reply}, raw[1]]
    )
    assert second[:2] == turns and second[3]["content"] == inert(result.text)


def test_greedy_replies_are_coloured_by_the_t1_log_prob(services, chat_job):
    """At temperature 0 every chosen token had probability 1: the colours show the log-prob
    of the model's own distribution (T=1), recomputed here with transformers."""
    import torch
    import transformers

    from workers.engines import saved_version

    _, tokens, facts, _ = chat(services, chat_job, "hello", max_tokens=6)
    assert "coloured by the T=1 log-prob" in facts
    path = saved_version(services.repository, chat_job, VERSION).checkpoint_path
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = [int(i) for i in re.findall(r'data-token-id="(\d+)"', tokens)]
    shown = [float(v) for v in re.findall(r'data-logprob="([^"]+)"', tokens)]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    truth = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert len(ids) == len(shown) > 0 and any(v < -1e-3 for v in shown)
    assert shown == pytest.approx(truth.tolist(), abs=1e-4)
    assert "T=1 log-prob" in tokens  # the hover says which log-prob it is


def test_through_the_live_app(world, chat_job):
    demo = build_app(world["services"])
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        versions, max_tokens = client.predict(chat_job, api_name="/playground_versions")
        assert versions["value"] == 3 and max_tokens["value"] == 64
        history, tokens, facts, box = client.predict(
            chat_job, VERSION, "", "hello", [], 0, 8, 0, False, api_name="/playground_send"
        )
        result = expected(world["services"], chat_job, [{"role": "user", "content": "hello"}])
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[1]["content"] == [{"type": "text", "text": inert(result.text)}]
        assert f"policy version **{VERSION}**" in facts and box == ""
        assert tokens.count('class="tok"') == len(result.output_ids)
        assert client.predict(api_name="/playground_clear")[0] == []
    finally:
        demo.close()
