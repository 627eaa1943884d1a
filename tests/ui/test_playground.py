"""Playground tab: chat with a job's saved version (a real tiny checkpoint) through the engine.
The replies come from the interactive worker's function (`workers.chat`), run in the test
process by the fake queue; the UI handlers themselves load no model."""

import pytest
from gradio_client import Client

from db import PolicyVersionRecord
from ui.app import build_app
from ui.handlers.playground import clear, saved_versions, send
from ui.render import inert

VERSION = 2


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


def expected(services, job_id, messages, max_tokens=8):
    from core_engine.task import SamplingParams
    from workers.engines import engine_cache, saved_version
    from workers.settings import Settings

    info = saved_version(services.repository, job_id, VERSION)
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
        {"role": "assistant", "content": result.text},
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
        {"role": "assistant", "content": result.text},
    ]
    assert "single turn" in facts


def test_multi_turn_includes_the_history(services, chat_job):
    first, *_ = chat(services, chat_job, "hi")
    second, *_ = chat(services, chat_job, "again", history=first, keep_history=True)
    result = expected(services, chat_job, [*first, {"role": "user", "content": "again"}])
    assert second[:2] == first and second[2] == {"role": "user", "content": "again"}
    assert second[3] == {"role": "assistant", "content": result.text}
    # Gradio's normalised message form is accepted as history too
    normalised = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in first]
    assert chat(services, chat_job, "again", history=normalised, keep_history=True)[0] == second


def test_history_past_the_context_is_trimmed_with_a_notice(services, chat_job):
    long = [{"role": "user", "content": "a" * 300}, {"role": "assistant", "content": "b" * 300}]
    turns, _, facts, _ = chat(services, chat_job, "hello", history=long, keep_history=True)
    assert "2 older message(s) left out" in facts and "token context" in facts
    # what was generated is the reply to the newest message alone (the longest fitting tail)
    result = expected(services, chat_job, [{"role": "user", "content": "hello"}])
    assert turns[-1] == {"role": "assistant", "content": result.text}
    too_long, _, facts, _ = chat(services, chat_job, "c" * 600, keep_history=True)
    assert "do not fit the model" in facts and too_long == []


def test_every_invalid_setting_is_named_in_one_message(services, chat_job):
    _, _, facts, _ = chat(services, chat_job, "hi", temperature=-1, max_tokens=0, seed="x")
    assert facts.count("**") == 2  # one message
    for part in ("temperature must be", "max tokens must be", "seed: 'x' is not a number"):
        assert inert(part) in facts


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


def test_saved_versions_and_clear(services, chat_job, job):
    assert saved_versions(services, chat_job) == [VERSION, 3, 4]
    assert saved_versions(services, job.id) == [] and saved_versions(services, "x") == []
    assert clear() == ([], "", "", "")


def test_through_the_live_app(world, chat_job):
    demo = build_app(world["services"])
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        versions = client.predict(chat_job, api_name="/playground_versions")
        assert versions["value"] == 4
        history, tokens, facts, box = client.predict(
            chat_job, VERSION, "", "hello", [], 0, 8, 0, False, api_name="/playground_send"
        )
        result = expected(world["services"], chat_job, [{"role": "user", "content": "hello"}])
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[1]["content"] == [{"type": "text", "text": result.text}]
        assert f"policy version **{VERSION}**" in facts and box == ""
        assert tokens.count('class="tok"') == len(result.output_ids)
        assert client.predict(api_name="/playground_clear")[0] == []
    finally:
        demo.close()
