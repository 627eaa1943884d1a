"""Issue 45 item 3: every episode the runner produces is one the store holds, on SQLite and
PostgreSQL. What the store could not hold (an opening with no room for a turn, an observation
over the segment limit, a NUL character, a lone surrogate, a non-finite number in a tool call)
ends that episode with an error finish and a code, stored in a rejected batch; never a failed
write. A scripted engine answers fixed texts through a character tokenizer that has a NUL
token, as byte-level tokenizers do."""

import pytest

from core_engine.rl.episodes import record
from core_engine.rl.episodes.runner import EpisodeGenerator, EpisodeLimits
from core_engine.task import SamplingParams
from db import SampleFilter
from db.repository import batch_rows
from tests.core_engine.episode_fakes import TOKENIZER, Environment, ScriptedEngine
from tests.db.helpers import running_job
from workers.records import sample_records, split_batch

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": %s}}</tool_call>'


def stored(repo, env: Environment, answer: str = "42", max_episode_tokens: int = 4096):
    """Run one episode and store it as the trainer's worker does: the stored sample."""
    generator = EpisodeGenerator(
        ScriptedEngine(answer),
        SamplingParams(max_tokens=256),
        1,
        TOKENIZER,
        env,
        EpisodeLimits(max_turns=4, max_episode_tokens=max_episode_tokens),
    )
    rollout = generator.generate({"instruction": [""], "input": ["q"]}, seed=0)
    job = running_job(repo)
    samples = sample_records(rollout, list(rollout.episode_rewards), [0.0])
    for batch in split_batch(job.id, 0, 0, samples, []):
        repo.record_batch(batch)
    [summary] = repo.list_samples(SampleFilter(job_id=job.id)).items
    return repo.get_sample(summary.id)


def test_a_storable_episode_is_stored_as_it_was_played(repo):
    sample = stored(repo, Environment())
    assert (sample.finish_reason, sample.episode_finish) == ("stop", "done")
    assert [s["role"] for s in sample.segments] == ["assistant", "user", "assistant"]


@pytest.mark.parametrize(
    ("env", "answer", "code", "problem"),
    [
        (Environment(opening="x" * 300), "42", "prompt_too_long", "the opening is 3"),
        (Environment(observation="y" * 70_000), "42", "unstorable", "more than the 65536"),
        (Environment(observation="a\x00b"), "42", "unstorable", "contains a NUL character"),
        (Environment(observation="a\ud800b"), "42", "unstorable", "lone surrogate"),
        (Environment(opening="a\x00b"), "42", "unstorable", "the opening message 0"),
        (Environment(), "4\x002", "unstorable", "segment 0 (assistant) text contains a NUL"),
    ],
    ids=["long-opening", "long-observation", "nul", "surrogate", "nul-opening", "nul-sampled"],
)
def test_what_the_store_cannot_hold_is_the_episodes_error(repo, env, answer, code, problem):
    sample = stored(repo, env, answer, max_episode_tokens=256)
    assert (sample.finish_reason, sample.episode_finish) == ("error", "error")
    assert sample.error_code == code and problem in sample.error_message


def test_a_non_finite_tool_call_is_never_stored_as_one(repo):
    """``1e999`` parses as infinity (or, with a stricter parser, not at all): either way the
    episode is stored and its segments are plain JSON."""
    env = Environment(tools=[{"type": "function", "function": {"name": "calculate"}}])
    sample = stored(repo, env, CALL % "1e999")
    assert sample.episode_finish in ("error", "tool_parse_error")
    assert all(call["arguments"]["expression"] != float("inf") for call in _calls(sample))


def _calls(sample):
    return [call for s in sample.segments for call in s.get("tool_calls", [])]


def test_the_runner_and_the_store_hold_the_same_limits():
    assert (record.MAX_SEGMENTS, record.MAX_SEGMENT_TEXT) == (
        batch_rows.MAX_SEGMENTS,
        batch_rows.MAX_SEGMENT_TEXT,
    )
