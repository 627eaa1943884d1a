"""Multi-turn episodes: every live episode of a batch samples its next turn in one engine call,
its tool calls are parsed, its environment answers, and the answer is appended as tokens.

Token in, token out: an episode's canonical history is its token ids, the opening prompt
rendered once, then each assistant turn exactly as sampled (loss mask 1) and the chat
template's tokens between turns (the turn's end and the observation up to the next generation
prompt, `prompts.turn_bridge`; mask 0). The conversation is never decoded and rendered again,
so what the engine sampled is what the trainer scores. Each turn's prompt is the whole history:
under the same version its K/V is a prefix-cache hit of the previous turn's pages; after a
version change it is recomputed (a prefix entry of another version can never be hit). So at
each turn's start every earlier position's K/V is the version's that samples the turn's first
token, which the episode records (`resumed_at`, as a preemption's resume) for the audit.

An episode ends `done` (the environment says so), `max_turns`, `context_exceeded` (its next
turn would not fit `max_episode_tokens`), `tool_parse_error` (its last turn's call could not
be parsed, at `max_turns`), `env_error` or `env_timeout` (the environment failed: the episode
is an error and its group is never trained on), or `error`: the engine's error, an opening that
leaves no room for a turn (`prompt_too_long`) or a record the store could not hold
(`unstorable`, `core_engine.rl.episodes.record`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core_engine.prompts import encode_prompt, render_prompt
from core_engine.rl.data import batch_rows
from core_engine.rl.episodes.observations import observation_ids
from core_engine.rl.episodes.record import messages_problem, observation_problem, segment_problem
from core_engine.rl.rollout.control import BatchCancelled, never
from core_engine.rl.rollout.generator import MixedVersionsError
from core_engine.rl.rollout.results import RawRollout
from core_engine.rl.rollout.seeds import sample_seed
from core_engine.scheduler import InferenceScheduler
from core_engine.task import (
    ErrorCode,
    FinishReason,
    GenerationResult,
    SamplingParams,
    TaskError,
    version_runs,
)
from core_engine.tool_calls import parse_tool_calls

_episode_ids = itertools.count()


@dataclass
class Episode:
    """One episode's history and record (module docstring); `tokens` follow `prompt_ids`."""

    index: int  # in its batch: its group is index // G, its sampling seeds follow from it
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    episode_id: int = field(default_factory=lambda: next(_episode_ids))
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    temp_logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    cached_tokens: int = 0
    finish: str | None = None
    error: TaskError | None = None
    engine_finish: FinishReason = FinishReason.STOP

    @property
    def history(self) -> list[int]:
        return self.prompt_ids + self.tokens

    def end(self, finish: str, error: TaskError | None = None) -> None:
        self.finish, self.error = finish, error

    def add_turn(self, result: GenerationResult, text: str) -> None:
        """Append a sampled turn (mask 1) and what the engine recorded of it."""
        start = len(self.tokens)
        if start:  # every earlier position's K/V is this turn's version's (module docstring)
            self.resumed_at.append(start)
        self.resumed_at += [start + i for i in result.resumed_at if start + i > start]
        n = len(result.output_ids)
        self.tokens += result.output_ids
        self.mask += [1] * n
        self.logprobs += result.output_logprobs
        self.temp_logprobs += result.output_temp_logprobs
        runs = result.token_versions or [[result.policy_version, n]]
        self.versions += [version for version, count in runs for _ in range(count)]
        self.cached_tokens += result.num_cached_prompt_tokens
        cached = result.num_cached_prompt_tokens  # of the history: the prefix K/V reused
        self.segments.append(
            {"role": "assistant", "start": start, "end": start + n, "text": text, "cached": cached}
        )
        self.turns += 1
        self.engine_finish = result.finish_reason

    def add_observation(self, ids: Sequence[int], messages: list[dict], **info: Any) -> None:
        """Append the template's tokens between two turns (mask 0), with what they carry."""
        start = len(self.tokens)
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.temp_logprobs += [0.0] * len(ids)
        self.versions += [self.versions[-1] if self.versions else 0] * len(ids)
        role = messages[0]["role"] if messages else "template"
        content = "\n".join(m.get("content", "") for m in messages)
        segment = {"role": role, "start": start, "end": len(self.tokens), "text": content}
        self.segments.append({**segment, **{k: v for k, v in info.items() if v is not None}})

    def drop_last_segment(self) -> None:
        """Take the last segment and its tokens back out of the history."""
        segment = self.segments.pop()
        start = segment["start"]
        for values in (self.tokens, self.mask, self.logprobs, self.temp_logprobs, self.versions):
            del values[start:]
        self.resumed_at = [i for i in self.resumed_at if i < start]
        self.turns -= segment["role"] == "assistant"


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_episode_tokens: int


class EpisodeGenerator:
    """`RolloutGenerator`'s role for multi-turn episodes: `generate(batch, seed)` runs G
    episodes of each task of the batch against an environment session
    (`core_engine.rl.episodes.env_sandbox.EnvironmentSession`) and returns them as a
    `RawRollout` with their loss masks, segments, finishes and rewards. `cancelled` is asked
    between two turns and before every decode step: a cancel ends the batch there
    (`BatchCancelled`)."""

    def __init__(
        self,
        engine: InferenceScheduler,
        params: SamplingParams,
        group_size: int,
        tokenizer: Any,
        session: Any,
        limits: EpisodeLimits,
        in_flight: bool = False,
        cancelled: Callable[[], bool] = never,
    ) -> None:
        self.engine, self.params, self.group_size = engine, params, group_size
        self.tokenizer, self.session, self.limits = tokenizer, session, limits
        self.in_flight, self.cancelled = in_flight, cancelled
        self.tool_names = [t.get("function", {}).get("name") for t in session.tools]

    def generate(self, batch: Mapping[str, Sequence[str]], seed: int) -> RawRollout:
        rows = batch_rows(batch)
        episodes = self._open(rows)
        try:
            live = [e for e in episodes if e.finish is None]
            while live:
                if self.cancelled():
                    raise BatchCancelled("cancelled between two turns of the batch's episodes")
                self._turn(live, seed)
                live = [e for e in episodes if e.finish is None]
        finally:
            self.session.close([e.episode_id for e in episodes])
        return self._rollout(rows, episodes, seed)

    def close(self) -> None:
        """End the environment session (its child and every process it started)."""
        self.session.close()

    # ----------------------------------------------------------------- the steps
    def _open(self, rows: list[dict[str, str]]) -> list[Episode]:
        """G episodes per task, each reset by the environment; a group's opening must agree."""
        tasks = [row for row in rows for _ in range(self.group_size)]
        ids = [next(_episode_ids) for _ in tasks]
        opened = self.session.reset(ids, tasks)
        episodes = []
        for i, (episode_id, result) in enumerate(zip(ids, opened, strict=True)):
            first = episodes[i - i % self.group_size] if i % self.group_size else None
            problem = None if result.error else messages_problem(result.messages, "the opening")
            messages = result.messages if result.error is None and problem is None else []
            prompt = (
                encode_prompt(
                    self.tokenizer, render_prompt(self.tokenizer, messages, self.session.tools)
                )
                if messages
                else []
            )
            episode = Episode(i, messages, prompt, episode_id)
            budget = self.limits.max_episode_tokens
            if result.error is not None:
                episode.end(result.code, TaskError(ErrorCode(result.code), result.error))
            elif problem is not None:
                episode.end("error", TaskError(ErrorCode.UNSTORABLE, problem))
            elif len(prompt) >= budget:
                message = (
                    f"the opening is {len(prompt)} tokens: no room for a turn within "
                    f"max_episode_tokens={budget}"
                )
                episode.end("error", TaskError(ErrorCode.PROMPT_TOO_LONG, message))
            elif first is not None and first.finish is None and first.prompt_ids != prompt:
                message = "env_error: reset gave the episodes of one task different openings"
                episode.end("env_error", TaskError(ErrorCode.ENV_ERROR, message))
            episodes.append(episode)
        return episodes

    def _turn(self, live: list[Episode], seed: int) -> None:
        """One turn of every live episode: sample, parse, step the environment, append."""
        budget = self.limits.max_episode_tokens
        ready = []
        for e in live:
            room = min(self.params.max_tokens, budget - len(e.history))
            if room < 1:
                e.end("context_exceeded")
            else:
                ready.append((e, room))
        if not ready:
            return
        params = [
            replace(self.params, max_tokens=room, seed=sample_seed(seed, e.index, e.turns))
            for e, room in ready
        ]
        histories = [e.history for e, _ in ready]
        results = self.engine.run_batch(histories, params, cancelled=self.cancelled)
        if self.cancelled():
            raise BatchCancelled("cancelled during a turn of the batch's episodes")
        stepped, turns = [], []
        for (e, _), result in zip(ready, results, strict=True):
            text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
            e.add_turn(result, text)
            if not result.ok:
                e.end("error", result.error)
                continue
            parsed = parse_tool_calls(text, names=self.tool_names or None)
            calls = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
            e.segments[-1]["tool_calls"] = calls
            if parsed.error is not None:
                e.segments[-1]["tool_error"] = parsed.error
            if _unstorable(e):
                continue
            if parsed.error is not None:
                observation = [{"role": "tool", "content": f"error: {parsed.error}"}]
                self._continue(e, result, observation, "tool_parse_error")
                continue
            stepped.append((e, result))
            turns.append({"content": parsed.content, "tool_calls": calls, "text": text})
        if stepped:
            replies = self.session.step([e.episode_id for e, _ in stepped], turns)
            for (e, result), reply in zip(stepped, replies, strict=True):
                self._apply(e, result, reply)

    def _apply(self, e: Episode, result: GenerationResult, reply: Any) -> None:
        if reply.error is not None:
            e.end(reply.code, TaskError(ErrorCode(reply.code), reply.error))
            return
        e.reward += reply.reward or 0.0
        e.segments[-1]["reward"] = reply.reward
        if reply.done:
            e.end("done")
        else:
            self._continue(e, result, reply.messages, "max_turns")

    def _continue(
        self, e: Episode, result: GenerationResult, observation: list[dict], at_limit: str
    ) -> None:
        """Append the observation's tokens, or end the episode at its limits."""
        if e.turns >= self.limits.max_turns:
            e.end(at_limit)
            return
        problem = observation_problem(observation)
        if problem is not None:
            e.end("error", TaskError(ErrorCode.UNSTORABLE, problem))
            return
        tools, stop = self.session.tools, result.stop_reason
        ids = observation_ids(self.tokenizer, e.messages, observation, tools, stop)
        if len(e.history) + len(ids) >= self.limits.max_episode_tokens:
            e.end("context_exceeded")
            return
        error = e.segments[-1].get("tool_error")
        e.add_observation(ids, observation, tool_error=error)
        _unstorable(e)

    # ----------------------------------------------------------------- the record
    def _rollout(self, rows: list[dict], episodes: list[Episode], seed: int) -> RawRollout:
        versions = {v for e in episodes for v in e.versions}
        if not self.in_flight and len(versions) > 1:
            raise MixedVersionsError(
                f"one batch spans policy versions {sorted(versions)} outside in-flight mode"
            )
        g = self.group_size
        heads = [episodes[i * g] for i in range(len(rows))]
        failed = {"env_error", "env_timeout", "error"}
        return RawRollout(
            prompts=[
                render_prompt(self.tokenizer, e.messages, self.session.tools) if e.messages else ""
                for e in heads
            ],
            messages=[e.messages for e in heads],
            references=[row.get("output", "") for row in rows],
            prompt_ids=[e.prompt_ids for e in heads],
            response_ids=[e.tokens for e in episodes],
            completions=[
                self.tokenizer.decode(e.tokens, skip_special_tokens=True) for e in episodes
            ],
            behaviour_logprobs=[e.logprobs for e in episodes],
            temp_logprobs=[e.temp_logprobs for e in episodes],
            finish_reasons=[
                (FinishReason.ERROR if e.finish in failed else e.engine_finish).value
                for e in episodes
            ],
            errors=[e.error if e.finish in failed else None for e in episodes],
            cached_prompt_tokens=[e.cached_tokens for e in episodes],
            seeds=[sample_seed(seed, e.index) for e in episodes],
            policy_version=min(versions, default=self.engine.version),
            group_size=g,
            temperature=self.params.temperature,
            token_versions=[version_runs(e.versions) for e in episodes],
            resumed_at=[e.resumed_at for e in episodes],
            loss_masks=[e.mask for e in episodes],
            segments=[e.segments for e in episodes],
            episode_finishes=[e.finish or "done" for e in episodes],
            episode_rewards=[e.reward for e in episodes],
        )


def _unstorable(e: Episode) -> bool:
    """End `e` as an error, without its last segment, if that segment breaks what the store
    holds."""
    problem = segment_problem(e.segments[-1], len(e.segments) - 1)
    if problem is not None:
        e.drop_last_segment()
        message = f"{problem}: the episode ends before it, without it"
        e.end("error", TaskError(ErrorCode.UNSTORABLE, message))
    return problem is not None
