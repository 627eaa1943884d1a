"""Launch refuses early what cannot run (issue 32, item 3): prompts that do not fit the
model's context with max_tokens, and numbers that do not read as a whole; a queued job's
message says the numbers it was queued with.

The demo policy's vocabulary is characters and its chat template the bare user text, so a
prompt's tokens are its characters; its context is 32 tokens (its config.json)."""

import json

import gradio as gr
import pytest

from core_engine.rl.data.tasks import prompt_records
from tests.ui.test_launch import form, isolated
from ui.handlers.launch import FORM_FIELDS, JSONL_SOURCE, launch_job
from ui.render import inert
from ui.tabs import launch as launch_tab
from workers import api

CONTEXT = 32
ADDITION = 8  # "999+999=": the longest 3-digit sum's prompt, in characters


def test_prompts_beyond_the_demo_policys_context_are_refused_inline(services, world):
    message = launch_job(services, **form(task="word_problems", max_tokens=6))
    longest = max(len(r["input"]) for r in prompt_records("word_problems", None))
    assert message.startswith("**Nothing was enqueued.**") and longest + 6 > CONTEXT
    want = (
        f"the longest prompt of task word_problems is {longest} tokens (with the model's chat "
        f"template) and max_tokens is 6: {longest + 6} tokens do not fit the model's "
        f"{CONTEXT}-token context"
    )
    assert inert(want) in message
    assert world["queue"].submitted == []


def test_the_context_is_a_bound_not_a_margin(services, world):
    fits = launch_job(services, **form(task="addition", max_tokens=CONTEXT - ADDITION))
    assert "is queued" in fits
    over = launch_job(services, **form(task="addition", max_tokens=CONTEXT - ADDITION + 1))
    assert inert(f"is {ADDITION} tokens") in over and inert(f"{CONTEXT + 1} tokens do not") in over
    assert len(world["queue"].submitted) == 1


def test_a_gsm8k_style_file_held_out_on_the_demo_policy_is_refused_inline(
    services, world, tmp_path
):
    """With a held-out fraction the form reads the file as the worker will (the split); a
    file alone is read by the submission (tests/workers/test_prompt_room.py)."""
    mine = isolated(services, tmp_path)
    question = "Natalia sold clips to 48 of her friends in April. How many did she sell?"
    data = mine.data_dir / "gsm8k.jsonl"
    data.parent.mkdir(parents=True)
    rows = [{"question": question, "answer": "#### 48"}, {"question": "1+1?", "answer": "2"}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fraction = {"heldout_fraction": 0.5, "max_tokens": 4, "prompt_column": "question"}
    message = launch_job(mine, **form(source=JSONL_SOURCE, task=None, data=str(data), **fraction))
    assert inert(f"of {data} is {len(question)} tokens") in message
    assert world["queue"].submitted == []


def test_a_number_that_does_not_read_whole_is_refused_naming_the_field(services, world):
    for field, typed in (("lr", "1e-3.5"), ("temperature", "0.0.1"), ("steps", "3e-4x")):
        message = launch_job(services, **form(**{field: typed}))
        assert message.startswith("**Nothing was enqueued.**")
        assert inert(f"{field}: {typed!r} is not a number") in message
    assert world["queue"].submitted == []


def test_a_queued_job_says_the_numbers_it_was_queued_with(services, world):
    message = launch_job(services, **form(lr="1e-3", steps="3", temperature=" 0.5 "))
    config = world["queue"].submitted[0][1]
    assert (config["lr"], config["steps"], config["temperature"]) == (0.001, 3, 0.5)
    assert inert("lr 0.001") in message and inert("steps 3,") in message
    assert inert("temperature 0.5") in message


def test_the_launch_tabs_numbers_are_text_the_browser_leaves_alone(services):
    """A browser's number box drops what it cannot read (Chromium made ``1e-3.5`` 1e-35) and
    rounds a whole-number box: every number of the form is a text box, read by the form."""
    with gr.Blocks():
        fields = launch_tab.build(services)
    numbers = ("steps", "batch_size", "group_size", "lr", "temperature", "top_p", "max_tokens")
    numbers += ("max_policy_lag", "clip_eps", "kl_coef", "seed", "updates_per_batch")
    numbers += ("heldout_every", "heldout_prompts", "heldout_fraction", "heldout_k")
    numbers += ("lora_rank", "lora_alpha", "lora_dropout", "reward_weight", "weight_2")
    numbers += ("weight_3", "weight_4", "length_threshold")
    assert set(numbers) <= set(FORM_FIELDS)
    for name in numbers:
        assert isinstance(fields[name], gr.Textbox), name
        assert fields[name].preprocess("1e-3.5") == "1e-3.5"
    assert fields["lr"].value == str(api.LAUNCH_DEFAULTS["lr"])
    assert fields["length_threshold"].value == ""  # blank: 3/4 of max tokens


@pytest.mark.parametrize("typed", ["1e-3", "0.001", " 1E-3 "])
def test_what_is_typed_is_what_is_queued(services, world, typed):
    launch_job(services, **form(lr=typed))
    assert world["queue"].submitted[0][1]["lr"] == 0.001
