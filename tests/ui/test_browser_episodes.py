"""A real headless Chromium opens a multi-turn episode in the Samples tab: found with the
episode filters, it reads as a conversation with a tool call, a tool result block of untrained
tokens and coloured assistant tokens, recoloured by version on request; its stored text is
shown as text, never as markup. (Browser setup: `tests.ui.test_browser`.)"""

import re

import pytest

from db import BatchRecord, PolicyVersionRecord
from tests.ui.conftest import new_repository
from tests.ui.helpers import FakeQueue, encode, save_tokenizer
from tests.ui.test_browser import _choose, _data_rows, _opened, _require_browser, _shot
from tests.ui.test_samples_episodes import ARGUMENTS, CONVERSATION, OBSERVATION, episode_record
from ui.app import build_app

pytestmark = pytest.mark.slow


@pytest.fixture
def app(tmp_path):
    """The UI over a database holding a job with an environment: one episode (3 turns, a
    tool call, tool results) and one single-turn sample."""
    model = save_tokenizer(tmp_path / "models" / "tiny")
    repo = new_repository(tmp_path)
    job = repo.create_job("train", {"model": str(model), "environment": "calculator"})
    repo.mark_running(job.id)
    for version in range(2):
        repo.record_policy_version(
            PolicyVersionRecord(job.id, version, version - 1 if version else None)
        )
    samples = [episode_record(model, CONVERSATION, "done")]
    repo.record_batch(BatchRecord(job.id, 1, 0, "accepted", samples))
    demo = build_app(FakeQueue(repo).services((tmp_path / "models",), tmp_path / "data"))
    demo.queue().launch(prevent_thread_lock=True, quiet=True)
    try:
        yield demo.local_url, model
    finally:
        demo.close()
        repo.close()


def test_an_episode_reads_as_a_conversation(app, tmp_path):
    sync_api = _require_browser()
    expect = sync_api.expect
    url, model = app
    assistant = sum(len(encode(model, text)) for role, text, _ in CONVERSATION if role != "tool")
    with _opened(sync_api, url) as page:
        page.get_by_role("tab", name="Samples").click()
        _choose(page, "samples-job", re.compile(r"^#1 train"))
        _choose(page, "samples-episode-finish", "done")
        page.locator("#samples-min-turns textarea").fill("3")
        page.locator("#samples-tool-errors input").check()
        page.locator("#samples-search").click()
        expect(page.locator("#samples-info")).to_contain_text("Page 1 · 1 samples")
        _data_rows(page, "samples-table").first.get_by_role("gridcell").first.click()

        detail = page.locator("#sample-detail")
        expect(detail.locator('[data-fact="episode finish"]')).to_have_text("done")
        expect(detail.locator('[data-fact="turns"]')).to_have_text("3")
        expect(detail.locator('[data-fact="tool errors"]')).to_have_text("1")
        turns = detail.locator(".episode .turn")
        expect(turns).to_have_count(3)
        # the tool call inline, its arguments shown as text
        call = turns.first.locator(".tool-call")
        expect(call).to_contain_text(f'calculate({{"expression": "{ARGUMENTS["expression"]}')
        # the tool's results: grey blocks, not trained, their text as stored
        results = detail.locator(".episode .observation")
        expect(results).to_have_count(2)
        expect(results.first).to_contain_text("tool result (not trained)")
        expect(results.first.locator(".observation-text")).to_have_text(OBSERVATION)
        background = results.first.evaluate("e => getComputedStyle(e).backgroundColor")
        assert background == "rgb(243, 243, 243)"
        expect(detail.locator("img, script, a")).to_have_count(0)  # nothing injected
        # the assistant turns' tokens, coloured by log-prob
        tokens = detail.locator(".episode .turn .tok")
        expect(tokens).to_have_count(assistant)
        for i in range(tokens.count()):
            assert "hsl(" in tokens.nth(i).get_attribute("style")
            assert tokens.nth(i).get_attribute("data-logprob") is not None
        expect(turns.nth(2).locator(".turn-reward")).to_have_text("reward 1")
        expect(turns.nth(1).locator(".tool-error")).to_contain_text("no JSON object <b>")
        _shot(page, tmp_path, "episode")

        # recoloured by version: the assistant tokens carry their versions
        page.locator("#sample-colour-by").get_by_text("version", exact=True).click()
        by_version = detail.locator(".episode .turn .tok[data-version]")
        expect(by_version).to_have_count(assistant)
        expect(turns.first.locator(".tok").first).to_have_attribute("data-version", "0")
        expect(turns.last.locator(".tok").last).to_have_attribute("data-version", "1")


def test_launch_a_job_with_an_environment(app):
    sync_api = _require_browser()
    expect = sync_api.expect
    url, _ = app
    with _opened(sync_api, url) as page:
        max_turns = page.locator("#launch-max-turns")
        expect(max_turns).to_be_hidden()  # single-turn: no episode limits
        expect(page.locator("#launch-reward")).to_be_visible()
        _choose(page, "launch-environment", "calculator")
        expect(max_turns).to_be_visible()
        expect(page.locator("#launch-reward")).to_be_hidden()  # the environment scores
        max_turns.locator("textarea, input").first.fill("3")
        # the demo policy's context is 32 tokens: its episodes must fit it (512 is refused)
        episode_tokens = page.locator("#launch-max-episode-tokens")
        episode_tokens.locator("textarea, input").first.fill("30")
        page.locator("#launch-button").click()
        status = page.locator("#launch-status")
        expect(status).to_contain_text("in environment calculator")
        expect(status).to_contain_text("max_turns 3, max_episode_tokens 30")
        _choose(page, "launch-environment", "none: single-turn")
        expect(max_turns).to_be_hidden()
        expect(page.locator("#launch-reward")).to_be_visible()


def test_choosing_the_calculator_policy_fills_in_its_task_and_environment(app):
    """The shipped calculator policy's preset (issue 30, item 8): picking it in the Model
    dropdown sets word problems in the calculator environment with the policy's lengths, and
    Launch sends that job."""
    sync_api = _require_browser()
    expect = sync_api.expect
    url, _ = app
    with _opened(sync_api, url) as page:
        _choose(page, "launch-model", re.compile("^built-in calculator policy"))
        expect(page.locator("#launch-max-turns")).to_be_visible()
        expect(page.locator("#launch-reward")).to_be_hidden()
        expect(page.locator("#launch-environment input")).to_have_value("calculator")
        max_tokens = page.locator("#launch-max-tokens").locator("textarea, input").first
        expect(max_tokens).to_have_value("48")
        page.locator("#launch-button").click()
        status = page.locator("#launch-status")
        expect(status).to_contain_text(
            "train calculator-demo on word_problems in environment calculator"
        )
        expect(status).to_contain_text("max_turns 5, max_episode_tokens 384")


def test_choosing_the_r1_recipe_fills_in_word_problems_and_its_two_rewards(app):
    """The R1 recipe's preset: picking it sets word problems, single-turn, rewarded by `math`
    plus `format`, and Launch sends that job."""
    sync_api = _require_browser()
    expect = sync_api.expect
    url, _ = app
    with _opened(sync_api, url) as page:
        _choose(page, "launch-model", re.compile("^R1 recipe"))
        expect(page.locator("#launch-reward input")).to_have_value("math")
        page.get_by_text("More rewards (weighted sum)").click()
        expect(page.locator("#launch-reward-2 input")).to_have_value("format")
        expect(page.locator("#launch-environment input")).to_have_value("none: single-turn")
        page.locator("#launch-button").click()
        expect(page.locator("#launch-status")).to_contain_text("train r1-demo on word_problems")
