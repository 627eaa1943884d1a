"""Prompts that do not fit the model's context with ``max_tokens`` are refused at submission
(issue 32, item 3), by the API and from a job file, not by the worker after the queue.

The demo policy's vocabulary is characters and its chat template the bare user text, so a
prompt's tokens are its characters; its context is 32 tokens (its config.json)."""

import json
import re

import pytest

from core_engine.rl.data.tasks import prompt_records
from workers import api, commands
from workers.specs import SpecError

CONTEXT = 32
ADDITION = 8  # "999+999=": the longest 3-digit sum's prompt, in characters
GSM8K = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?"
)


def _demo(**config) -> dict:
    return {"model": "demo", "steps": 2, "batch_size": 2, "group_size": 2, **config}


def _gsm8k_file(folder, questions) -> str:
    path = folder / "gsm8k.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ({"question": q, "answer": "... #### 72"} for q in questions)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_word_problems_on_the_demo_policy_are_refused_by_the_api(env, repo):
    longest = max(len(r["input"]) for r in prompt_records("word_problems", None))
    want = (
        f"prompts too long for the model: the longest prompt of task word_problems is {longest} "
        f"tokens (with the model's chat template) and max_tokens is 6: {longest + 6} tokens do "
        f"not fit the model's {CONTEXT}-token context (max_position_embeddings in its "
        "config.json)"
    )
    with pytest.raises(SpecError) as refused:
        api.submit_job("train", _demo(task="word_problems", max_tokens=6))
    assert str(refused.value) == want
    assert repo.list_jobs() == []


def test_the_context_bounds_the_longest_prompt_plus_max_tokens(env, repo):
    over = CONTEXT - ADDITION + 1
    with pytest.raises(SpecError, match=f"is {ADDITION} tokens .* {CONTEXT + 1} tokens do not"):
        api.submit_job("train", _demo(task="addition", max_tokens=over))
    assert repo.list_jobs() == []
    api.submit_job("train", _demo(task="addition", max_tokens=CONTEXT - ADDITION))
    assert len(repo.list_jobs()) == 1


def test_a_gsm8k_file_on_the_demo_policy_is_refused_from_a_job_file(
    env, repo, tiny_model, tmp_path, capsys
):
    data = _gsm8k_file(env, [GSM8K, "What is 2+2?"])
    job = tmp_path / "job.toml"
    job.write_text(f'model = "demo"\ndata = "{data}"\nmax_tokens = 6\nsteps = 2\n')
    assert commands.main(["submit", str(job)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("refused: prompts too long for the model")
    assert f"of {data} is {len(GSM8K)} tokens" in out and "max_tokens is 6" in out
    assert f"{len(GSM8K) + 6} tokens do not fit the model's {CONTEXT}-token context" in out
    assert repo.list_jobs() == []
    job.write_text(f'model = "{tiny_model}"\ndata = "{data}"\nmax_tokens = 6\nsteps = 2\n')
    assert commands.main(["submit", str(job)]) == 0  # a 512-token context holds it
    assert len(repo.list_jobs()) == 1


def test_a_held_out_file_is_checked_too(env, repo):
    short = _gsm8k_file(env / "train", ["What is 2+2?"])
    held = _gsm8k_file(env / "held", [GSM8K])
    config = _demo(data=short, heldout_data=held, heldout_every=1, max_tokens=6)
    with pytest.raises(SpecError, match=re.escape(f"of {held} is {len(GSM8K)} tokens")):
        api.submit_job("train", config)
    assert repo.list_jobs() == []


def test_a_prompt_is_counted_as_the_models_chat_template_renders_it(env, repo, tiny_model):
    """The tiny model's tokens are characters, its template ``<|user|>question<|end|>`` then
    ``<|assistant|>`` (three special tokens more) and its context 512 tokens."""
    data = _gsm8k_file(env, ["x" * 500])
    config = {"model": tiny_model, "data": data, "steps": 2, "batch_size": 1, "group_size": 2}
    want = "is 503 tokens .* max_tokens is 10: 513 tokens do not fit the model's 512-token"
    with pytest.raises(SpecError, match=want):
        api.submit_job("train", {**config, "max_tokens": 10})
    api.submit_job("train", {**config, "max_tokens": 9})
    assert len(repo.list_jobs()) == 1
