"""Generation of a batch's rollout from our engine: prompts rendered with the chat template,
G seeded samples per prompt, each token stamped with the version that sampled it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from core_engine.prompts import encode_prompt, render_prompt
from core_engine.rl.data import batch_rows, instruction_to_messages
from core_engine.rl.rollout.control import BatchCancelled, never
from core_engine.rl.rollout.results import RawRollout
from core_engine.rl.rollout.seeds import sample_seed
from core_engine.scheduler import InferenceScheduler
from core_engine.task import SamplingParams


class MixedVersionsError(RuntimeError):
    """A batch that must be one version's was generated across a weight update."""


class RolloutGenerator:
    """Renders prompts with the chat template and delegates all generation to `run_batch`.
    With `in_flight`, weight updates may land during a batch: its samples then span versions
    (each token's is recorded); otherwise one batch is one version. `cancelled` is asked
    before every decode step: a yes ends the batch there (`BatchCancelled`)."""

    def __init__(
        self,
        engine: InferenceScheduler,
        params: SamplingParams,
        group_size: int,
        tokenizer: Any = None,
        in_flight: bool = False,
        cancelled: Callable[[], bool] = never,
    ) -> None:
        self.engine, self.cancelled = engine, cancelled
        self.tokenizer = tokenizer or engine.tokenizer
        self.params = params
        self.group_size = group_size
        self.in_flight = in_flight

    @staticmethod
    def _instruction_to_messages(instruction: str, input: str = "", output: str = "") -> list[dict]:
        return instruction_to_messages(instruction, input, output)

    def _prepare_prompts(
        self, batch: Mapping[str, Sequence[str]]
    ) -> list[tuple[list[dict], str, str]]:
        """(prompt messages, rendered prompt, reference) per row; `output` stays reward-side."""
        prepared = []
        for row in batch_rows(batch):
            messages = self._instruction_to_messages(
                row.get("instruction", ""), row.get("input", "")
            )
            text = render_prompt(self.tokenizer, messages)
            prepared.append((messages, text, row.get("output", "")))
        return prepared

    def generate(self, batch: Mapping[str, Sequence[str]], seed: int) -> RawRollout:
        prepared = self._prepare_prompts(batch)
        prompt_ids = [encode_prompt(self.tokenizer, text) for _, text, _ in prepared]
        g = self.group_size
        params = [replace(self.params, seed=sample_seed(seed, i * g)) for i in range(len(prepared))]
        results = self.engine.run_batch(
            prompt_ids, params, samples_per_prompt=g, cancelled=self.cancelled
        )
        if self.cancelled():
            raise BatchCancelled("cancelled while a rollout batch was generated")
        runs = [r.token_versions or [[r.policy_version, 0]] for r in results]
        versions = {v for sample in runs for v, _ in sample if v >= 0}  # -1: never admitted
        if not self.in_flight and len(versions) > 1:
            raise MixedVersionsError(
                f"one batch spans policy versions {sorted(versions)} outside in-flight mode: "
                "a weight update landed during it"
            )
        return RawRollout(
            prompts=[text for _, text, _ in prepared],
            messages=[messages for messages, _, _ in prepared],
            references=[reference for _, _, reference in prepared],
            prompt_ids=prompt_ids,
            response_ids=[r.output_ids for r in results],
            completions=[
                self.tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in results
            ],
            behaviour_logprobs=[r.output_logprobs for r in results],
            temp_logprobs=[r.output_temp_logprobs for r in results],
            finish_reasons=[r.finish_reason.value for r in results],
            errors=[r.error for r in results],
            cached_prompt_tokens=[r.num_cached_prompt_tokens for r in results],
            seeds=[sample_seed(seed, i) for i in range(len(results))],
            policy_version=min(versions, default=self.engine.version),
            group_size=g,
            temperature=self.params.temperature,
            token_versions=[r.token_versions for r in results],
            resumed_at=[r.resumed_at for r in results],
        )
