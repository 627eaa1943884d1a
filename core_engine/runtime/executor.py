"""Prefill and decode forwards over the KV pool.

Positions, slot mappings and context lengths are derived from each task's own state at every
step (`num_computed_tokens`, `num_tokens`); nothing positional survives between steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core_engine.cache import TaskCacheManager
from core_engine.model import AttentionMetadata, CausalLM
from core_engine.runtime.graph import GraphDecodeRunner, graphs_supported
from core_engine.runtime.sample import SampleOutput, sample
from core_engine.task import Task

# Cascade decode pays a few extra small ops per layer to gather a shared prefix once instead of
# once per row: on a CPU it won 1.2-4.5x when it saved >= 1,024 slot reads and the prefix was
# at least as long as any row's own part, and lost (0.3-0.8x) below that.
MIN_SAVED_SLOTS = 1024


def shared_prefix(gather_index: torch.Tensor, limit: int) -> int:
    """How many leading context slots every row reads in common, when attending them once pays
    (see `MIN_SAVED_SLOTS`), else 0; at most `limit` (each row keeps its newest token apart)."""
    rows, width = gather_index.shape
    if rows < 2 or (rows - 1) * limit < MIN_SAVED_SLOTS:
        return 0
    same = (gather_index[:, :limit] == gather_index[:1, :limit]).all(0)
    shared = int(same.int().cumprod(0).sum())
    pays = (rows - 1) * shared >= MIN_SAVED_SLOTS and shared >= width - shared
    return shared if pays else 0


class Executor:
    def __init__(self, model: CausalLM, cache: TaskCacheManager, cuda_graph: bool = True) -> None:
        self.model = model
        self.cache = cache
        self.device = next(model.parameters()).device
        self.table = cache.pool.req_pool.table
        self.graph: GraphDecodeRunner | None = None
        if cuda_graph and graphs_supported(self.device):
            req_pool = cache.pool.req_pool
            self.graph = GraphDecodeRunner(
                model,
                cache.pool.kv_cache,
                req_pool.max_requests,
                req_pool.max_seq_len,
                cache.pool.scratch_slot,
            ).capture()

    def prepare_prefill(self, tasks: Sequence[Task]):
        """Pack every task's uncomputed tokens (no padding) and say where their K/V go: the
        positions and table rows are listed in Python and indexed once (no tensor per task)."""
        ids, positions, token_rows, query_lens, context_lens, rows = [], [], [], [], [], []
        for task in tasks:
            start, end = task.num_computed_tokens, task.num_tokens
            row = self.cache.req_slot(task.task_id)
            ids.extend(task.all_ids[start:end])
            positions.extend(range(start, end))
            token_rows.extend([row] * (end - start))
            query_lens.append(end - start)
            context_lens.append(end)
            rows.append(row)
        position_tensor = self._tensor(positions)
        meta = AttentionMetadata(
            slot_mapping=self.table[self._tensor(token_rows), position_tensor],
            query_lens=query_lens,
            context_lens=context_lens,
            gather_index=self.table[rows, : max(context_lens)],
        )
        logits_indices = torch.tensor(query_lens, device=self.device).cumsum(0) - 1
        return self._tensor(ids), position_tensor, meta, logits_indices

    def prepare_decode(self, tasks: Sequence[Task]):
        """One new token per task at position `num_tokens - 1`."""
        rows = torch.tensor([self.cache.req_slot(t.task_id) for t in tasks], device=self.device)
        context_lens = [t.num_tokens for t in tasks]
        lens = torch.tensor(context_lens, device=self.device)
        positions = lens - 1
        max_len = max(context_lens)
        gather_index = self.table[rows, :max_len]
        meta = AttentionMetadata(
            slot_mapping=self.table[rows, positions],
            query_lens=[1] * len(tasks),
            context_lens=context_lens,
            gather_index=gather_index,
            decode_mask=(torch.arange(max_len, device=self.device)[None, :] < lens[:, None])[
                :, None, None, :
            ],
            shared_prefix=shared_prefix(gather_index, min(context_lens) - 1),
        )
        ids = self._tensor([t.output_ids[-1] if t.output_ids else t.prompt_ids[-1] for t in tasks])
        return ids, positions, meta, torch.arange(len(tasks), device=self.device)

    @torch.inference_mode()
    def forward_prefill(self, tasks: Sequence[Task]) -> torch.Tensor:
        """Logits [len(tasks), vocab] at each task's last token."""
        return self.model.forward_engine(*self._with_cache(self.prepare_prefill(tasks)))

    @torch.inference_mode()
    def forward_decode(self, tasks: Sequence[Task]) -> torch.Tensor:
        if self.graph is not None and self.graph.can_run(len(tasks)):
            ids, positions, meta, _ = self.prepare_decode(tasks)
            return self.graph.run(ids, positions, meta)
        return self.model.forward_engine(*self._with_cache(self.prepare_decode(tasks)))

    def execute_decode(self, tasks: Sequence[Task], return_logprobs: bool = True) -> SampleOutput:
        return self.sample(tasks, self.forward_decode(tasks), return_logprobs)

    @torch.inference_mode()
    def sample(
        self, tasks: Sequence[Task], logits: torch.Tensor, return_logprobs: bool
    ) -> SampleOutput:
        return sample(
            logits, [t.params for t in tasks], [t.uniforms for t in tasks], return_logprobs
        )

    def _with_cache(self, prepared):
        ids, positions, meta, logits_indices = prepared
        return ids, positions, self.cache.pool.kv_cache, meta, logits_indices

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)
