"""Physical K/V storage and the request -> token-slot table."""

from __future__ import annotations

import torch


class KVBuffer:
    """Per layer, a K and a V tensor of shape [num_slots, kv_heads, head_dim]."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.layers = [(self.k[i], self.v[i]) for i in range(num_layers)]

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the K/V of slots `src` into slots `dst` in every layer (copy-on-write)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @property
    def released(self) -> bool:
        return self.k.untyped_storage().nbytes() == 0

    def release(self) -> None:
        """Give the K/V memory back (the tensors keep their shape and views, no storage)."""
        for tensor in (self.k, self.v):
            tensor.untyped_storage().resize_(0)

    def restore(self) -> None:
        """Allocate the K/V memory again, zeroed (possibly at a new address)."""
        for tensor in (self.k, self.v):
            tensor.untyped_storage().resize_(tensor.numel() * tensor.element_size())
            tensor.zero_()


class RequestPool:
    """Request slots and their table: `table[slot, position]` is the KV slot of that token."""

    def __init__(self, max_requests: int, max_seq_len: int, device: torch.device | str) -> None:
        self.table = torch.zeros((max_requests, max_seq_len), dtype=torch.int64, device=device)
        self.max_requests = max_requests
        self.max_seq_len = max_seq_len
        self._free = list(range(max_requests - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def free_slots(self) -> frozenset[int]:
        return frozenset(self._free)

    def allocate(self) -> int | None:
        """A free request slot, or None when all are taken."""
        return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.max_requests:
            raise ValueError(f"request slot {slot} is not in use")
        self._free.append(slot)
