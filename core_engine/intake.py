"""Turning prompts and sampling parameters into tasks.

A request's bad input (a malformed prompt, unusable parameters, anything that raises while its
task is built) becomes that task's admission error: it never raises for the whole batch. Only a
malformed call (`samples_per_prompt < 1`, a params count that matches nothing) raises
`ValueError`, before any task exists.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from core_engine.outcomes import admission_error
from core_engine.runtime.uniforms import Uniforms
from core_engine.task import SEED_MAX, ErrorCode, SamplingParams, Task, TaskError, as_int

SEED_SPAN = 2**64


class TaskIntake:
    """Builds validated tasks for one engine: vocabulary, context and pool limits."""

    def __init__(
        self,
        vocab_size: int,
        max_seq_len: int,
        can_ever_fit: Callable[[int], bool],
        has_tokenizer: bool,
        device: torch.device,
    ) -> None:
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.can_ever_fit = can_ever_fit
        self.has_tokenizer = has_tokenizer
        self.device = device
        self._group_ids = itertools.count()
        self._seeds = random.Random()

    def make_tasks(
        self,
        prompts: Sequence[Any],
        params: SamplingParams | Sequence[Any] | None = None,
        samples_per_prompt: int = 1,
        return_logprobs: bool = True,
    ) -> list[Task]:
        """Tasks for each prompt: `samples_per_prompt` of them, one group sharing the prompt.

        `params` is one for all, one per prompt (sample k is seeded `seed + k`, wrapping at
        2**64), or one per sample (prompt-major; each seeded with its own `seed`)."""
        g = as_int(samples_per_prompt)
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"samples_per_prompt must be an integer >= 1, got {g!r}")
        if not isinstance(prompts, Sequence) and hasattr(prompts, "__iter__"):
            prompts = list(prompts)  # e.g. a numpy array or a generator of prompts
        if not isinstance(prompts, Sequence) or isinstance(prompts, str | bytes):
            raise ValueError(f"prompts must be a sequence of prompts, got {type(prompts).__name__}")
        if not isinstance(params, list | tuple):  # one for all (validated per request)
            params = [SamplingParams() if params is None else params] * len(prompts)
        if len(params) == len(prompts):
            per_sample = [(p, k) for p in params for k in range(g)]
        elif len(params) == len(prompts) * g:
            per_sample = [(p, 0) for p in params]
        else:
            raise ValueError(
                f"{len(prompts)} prompts x {g} samples but {len(params)} sampling params"
            )
        tasks = []
        for i, prompt in enumerate(prompts):
            group = next(self._group_ids) if g > 1 else None
            random_base = self._seeds.getrandbits(62)
            ids, problem = _token_ids(prompt)  # read once: the prompt may be an iterator
            for p, k in per_sample[i * g : (i + 1) * g]:
                task = self._task(list(ids), problem, p, group, random_base, k)
                task.return_logprobs = return_logprobs
                tasks.append(task)
        return tasks

    def _task(
        self,
        ids: list[Any],
        prompt_problem: str | None,
        params: Any,
        group: int | None,
        random_base: int,
        k: int,
    ) -> Task:
        valid_params = isinstance(params, SamplingParams)
        task = Task(ids, params if valid_params else SamplingParams(), group_id=group)
        task.arrival_time = time.perf_counter()
        try:
            if prompt_problem is not None:
                task.error = TaskError(ErrorCode.INVALID_TOKEN_ID, prompt_problem)
            elif not valid_params:
                task.error = TaskError(
                    ErrorCode.INVALID_SAMPLING_PARAMS,
                    f"expected SamplingParams, got {type(params).__name__}",
                )
            else:
                task.error = admission_error(
                    task, self.vocab_size, self.max_seq_len, self.can_ever_fit, self.has_tokenizer
                )
            if task.error is None:
                seed = (params.seed if params.seed is not None else random_base) + k
                task.uniforms = Uniforms(seed - SEED_SPAN if seed > SEED_MAX else seed, self.device)
        except Exception as exc:  # whatever goes wrong here is this request's problem alone
            task.error = TaskError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        return task


def _token_ids(prompt: Any) -> tuple[list[Any], str | None]:
    """The prompt as a list of ints, or (what could be read of it, why it is not one)."""
    if isinstance(prompt, str | bytes) or not hasattr(prompt, "__iter__"):
        return (
            [],
            f"the prompt must be a sequence of integer token ids, got {type(prompt).__name__}",
        )
    try:
        ids = [t if type(t) is int else as_int(t) for t in prompt]
    except Exception as exc:  # an iterable that fails while read
        return [], f"the prompt could not be read as token ids: {exc}"
    if all(type(t) is int for t in ids):  # the common case, in one pass
        return ids, None
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
    if bad:
        return ids, f"token ids must be integers, got {[type(t).__name__ for t in bad[:5]]}"
    return ids, None
