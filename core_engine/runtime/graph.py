"""CUDA-graph capture and replay of decode forwards (CUDA only; eager everywhere else).

Graphs are captured for batch sizes 1, 2, 4, ... up to the engine's maximum, over static input
buffers whose attention spans the whole `max_seq_len` (masked). Padded rows write their K/V
into the pool's scratch slot. Graphs bake in parameter addresses, which is why weight updates
copy into the live tensors in place. Sampling runs outside the graph.
"""

from __future__ import annotations

import torch

from core_engine.model import AttentionMetadata, CausalLM


def graphs_supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


class GraphDecodeRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_cache: list[tuple[torch.Tensor, torch.Tensor]],
        max_batch_size: int,
        max_seq_len: int,
        scratch_slot: int,
    ) -> None:
        device = next(model.parameters()).device
        if not graphs_supported(device):
            raise RuntimeError("CUDA graphs need a CUDA device")
        self.model, self.kv_cache = model, kv_cache
        self.max_seq_len, self.scratch_slot = max_seq_len, scratch_slot
        n = max_batch_size
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), scratch_slot, dtype=torch.int64, device=device)
        self.gather_index = torch.full(
            (n, max_seq_len), scratch_slot, dtype=torch.int64, device=device
        )
        self.mask = torch.zeros((n, 1, 1, max_seq_len), dtype=torch.bool, device=device)
        self.mask[..., 0] = True
        self.logits_indices = torch.arange(n, device=device)
        self.columns = torch.arange(max_seq_len, device=device)
        self.sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b < n] + [n]
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:b],
            query_lens=[1] * b,
            context_lens=[self.max_seq_len] * b,
            gather_index=self.gather_index[:b],
            decode_mask=self.mask[:b],
        )

    def _forward(self, b: int) -> torch.Tensor:
        return self.model.forward_engine(
            self.input_ids[:b],
            self.positions[:b],
            self.kv_cache,
            self._meta(b),
            self.logits_indices[:b],
        )

    @torch.inference_mode()
    def capture(self) -> GraphDecodeRunner:
        pool = None
        stream = torch.cuda.Stream()
        for b in reversed(self.sizes):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._forward(b)  # warm-up outside the graph
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(b)
            pool = graph.pool()
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize()
        return self

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= self.sizes[-1]

    @torch.inference_mode()
    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Replay the smallest captured graph that holds the batch; returns its logits."""
        n = input_ids.shape[0]
        b = next(size for size in self.sizes if size >= n)
        lens = torch.tensor(meta.context_lens, device=input_ids.device)
        width = meta.gather_index.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:b].fill_(self.scratch_slot)
        self.gather_index[:b].fill_(self.scratch_slot)
        self.gather_index[:n, :width].copy_(meta.gather_index)
        self.mask[:n].copy_((self.columns[None, :] < lens[:, None])[:, None, None, :])
        self.mask[n:b].fill_(False)
        self.mask[n:b, ..., 0] = True
        graph, out = self.graphs[b]
        graph.replay()
        return out[:n].clone()
