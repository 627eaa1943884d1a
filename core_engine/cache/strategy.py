"""How token slots are handed to requests: contiguous regions or ref-counted pages."""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from core_engine.cache.buffer import RequestPool
from core_engine.cache.prefix import ROOT, PrefixCache


@dataclass
class TaskCacheState:
    """One request's allocation: its request slot and the token positions it has slots for."""

    req_slot: int
    num_slots: int = 0
    pages: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SlotCopy:
    """K/V slots a fork must copy (a partially filled page is never shared)."""

    src: torch.Tensor
    dst: torch.Tensor


class AllocationStrategy(abc.ABC):
    """Gives request slots token slots; subclasses decide the layout and what is reusable."""

    def __init__(self, req_pool: RequestPool) -> None:
        self.req_pool = req_pool

    @property
    @abc.abstractmethod
    def num_slots(self) -> int:
        """Physical token slots the K/V buffer must hold."""

    @abc.abstractmethod
    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether one request of this many tokens fits an otherwise empty pool."""

    @abc.abstractmethod
    def allocate(self, state: TaskCacheState, token_ids: Sequence[int], version: int) -> int | None:
        """Slots for `token_ids`; returns the number of leading tokens already cached, or None
        (nothing changed) when there is no room now."""

    @abc.abstractmethod
    def extend(self, state: TaskCacheState, num_tokens: int) -> bool:
        """Grow to `num_tokens` slots; False (nothing changed) when there is no room now."""

    @abc.abstractmethod
    def fork(
        self, parent: TaskCacheState, child: TaskCacheState, num_tokens: int
    ) -> SlotCopy | None:
        """Give `child` the first `num_tokens` of `parent`'s context. Returns the slots to copy,
        or None (nothing changed) when there is no room now."""

    @abc.abstractmethod
    def publish(self, state: TaskCacheState, token_ids: Sequence[int], version: int) -> None:
        """Offer the fully computed pages of `token_ids` to the prefix cache (if any)."""

    @abc.abstractmethod
    def unpublish(self, state: TaskCacheState) -> None:
        """Withdraw every page of `state` from the prefix cache (if any)."""

    @abc.abstractmethod
    def release(self, state: TaskCacheState) -> None:
        """Give back every slot of `state` (the request slot is freed by the caller)."""

    @abc.abstractmethod
    def invalidate(self) -> int:
        """Make every cached prefix unmatchable (a weight update); returns entries dropped."""

    @abc.abstractmethod
    def usage(self) -> dict[str, int]:
        """Gauges: pages (or slots) used, free, cached."""

    @abc.abstractmethod
    def check_integrity(self, states: Iterable[TaskCacheState]) -> None:
        """Assert free + in use + cached == total and every slot is owned exactly once."""

    def _check_request_slots(self, states: Iterable[TaskCacheState]) -> list[TaskCacheState]:
        """Every request slot is either free or owned by exactly one live state."""
        states = list(states)
        owned = [s.req_slot for s in states]
        assert len(owned) == len(set(owned)), "a request slot is owned twice"
        assert not set(owned) & self.req_pool.free_slots, "an owned request slot is also free"
        assert len(owned) + self.req_pool.num_free == self.req_pool.max_requests
        return states


class ContiguousStrategy(AllocationStrategy):
    """Each request slot owns a fixed region of `max_seq_len` token slots; no prefix reuse."""

    def __init__(self, req_pool: RequestPool) -> None:
        super().__init__(req_pool)
        rows = torch.arange(req_pool.max_requests, device=req_pool.table.device)[:, None]
        cols = torch.arange(req_pool.max_seq_len, device=req_pool.table.device)[None, :]
        req_pool.table.copy_(rows * req_pool.max_seq_len + cols)

    @property
    def num_slots(self) -> int:
        return self.req_pool.max_requests * self.req_pool.max_seq_len

    def can_ever_fit(self, num_tokens: int) -> bool:
        return num_tokens <= self.req_pool.max_seq_len

    def allocate(self, state, token_ids, version):
        if not self.can_ever_fit(len(token_ids)):
            return None
        state.num_slots = len(token_ids)
        return 0

    def extend(self, state, num_tokens):
        if not self.can_ever_fit(num_tokens):
            return False
        state.num_slots = max(state.num_slots, num_tokens)
        return True

    def fork(self, parent, child, num_tokens):
        child.num_slots = num_tokens
        table = self.req_pool.table
        return SlotCopy(table[parent.req_slot, :num_tokens], table[child.req_slot, :num_tokens])

    def publish(self, state, token_ids, version):
        return None

    def unpublish(self, state):
        return None

    def release(self, state):
        state.num_slots = 0

    def invalidate(self) -> int:
        return 0

    def usage(self) -> dict[str, int]:
        used = self.req_pool.max_requests - self.req_pool.num_free
        return {"pages_used": used, "pages_free": self.req_pool.num_free, "pages_cached": 0}

    def check_integrity(self, states):
        states = self._check_request_slots(states)
        for s in states:
            assert 0 <= s.num_slots <= self.req_pool.max_seq_len


class PagedStrategy(AllocationStrategy):
    """Fixed-size pages with reference counts and a version-stamped prefix cache.

    Free pages sit in LRU order: pages holding no cached prefix are reused first, cached ones
    oldest first; a cached page is evicted lazily, when it is handed out again.
    """

    def __init__(self, req_pool: RequestPool, num_pages: int, page_size: int) -> None:
        super().__init__(req_pool)
        if num_pages <= 0 or page_size <= 0:
            raise ValueError("num_pages and page_size must be positive")
        self.num_pages = num_pages
        self.page_size = page_size
        self.ref_count = [0] * num_pages
        self.free_pages: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_pages))
        self.prefix = PrefixCache()
        # every page's slots, [num_pages, page_size]: a page's row is a view, no tensor built
        self._page_slots = torch.arange(num_pages * page_size, device=req_pool.table.device).view(
            num_pages, page_size
        )

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def can_ever_fit(self, num_tokens: int) -> bool:
        return (
            self.pages_for(num_tokens) <= self.num_pages and num_tokens <= self.req_pool.max_seq_len
        )

    def allocate(self, state, token_ids, version):
        if len(token_ids) > self.req_pool.max_seq_len:
            return None
        hits = self._match_prefix(token_ids, version)
        needed = self.pages_for(len(token_ids)) - len(hits)
        free_after_hits = len(self.free_pages) - sum(1 for p in hits if self.ref_count[p] == 0)
        if needed > free_after_hits:
            return None
        state.pages = []
        for page in hits:
            self._ref(page)
        self._map_pages(state, hits)
        self._append_pages(state, needed)
        state.num_slots = len(token_ids)
        return len(hits) * self.page_size

    def extend(self, state, num_tokens):
        if num_tokens > self.req_pool.max_seq_len:
            return False
        needed = self.pages_for(num_tokens) - len(state.pages)
        if needed > len(self.free_pages):
            return False
        if needed > 0:  # most decode steps stay within the last page
            self._append_pages(state, needed)
        state.num_slots = max(state.num_slots, num_tokens)
        return True

    def fork(self, parent, child, num_tokens):
        full, partial = divmod(num_tokens, self.page_size)
        if partial and not self.free_pages:
            return None
        child.pages = list(parent.pages[:full])
        for page in child.pages:
            self._ref(page)
        child.num_slots = num_tokens
        table = self.req_pool.table
        shared = full * self.page_size
        if shared:
            table[child.req_slot, :shared] = table[parent.req_slot, :shared]
        if partial:
            self._append_pages(child, 1)
        return SlotCopy(
            table[parent.req_slot, shared:num_tokens], table[child.req_slot, shared:num_tokens]
        )

    def publish(self, state, token_ids, version):
        parent = ROOT
        for i in range(min(len(token_ids) // self.page_size, len(state.pages))):
            key = (version, parent, tuple(token_ids[i * self.page_size : (i + 1) * self.page_size]))
            page = self.prefix.lookup(key)
            if page is None:
                page = state.pages[i]
                if self.prefix.is_cached(page):  # cached under another chain: stop here
                    return
                self.prefix.insert(key, page)
            parent = self.prefix.entry_id(page)

    def unpublish(self, state):
        for page in state.pages:
            self.prefix.evict(page)

    def release(self, state):
        for page in reversed(state.pages):
            self.ref_count[page] -= 1
            if self.ref_count[page] == 0:
                self.free_pages[page] = None
                if not self.prefix.is_cached(page):
                    self.free_pages.move_to_end(page, last=False)
        state.pages = []
        state.num_slots = 0

    def invalidate(self) -> int:
        return self.prefix.clear()

    def usage(self) -> dict[str, int]:
        free = len(self.free_pages)
        cached_free = sum(1 for p in self.free_pages if self.prefix.is_cached(p))
        return {
            "pages_used": self.num_pages - free,
            "pages_free": free - cached_free,
            "pages_cached": cached_free,
        }

    def check_integrity(self, states):
        states = self._check_request_slots(states)
        refs = [0] * self.num_pages
        for s in states:
            assert len(s.pages) == self.pages_for(s.num_slots), "pages do not cover the slots"
            for page in s.pages:
                refs[page] += 1
        assert refs == self.ref_count, "reference counts disagree with the live requests"
        in_use = sum(1 for r in refs if r)
        assert all((r == 0) == (p in self.free_pages) for p, r in enumerate(refs))
        usage = self.usage()
        assert usage["pages_free"] + usage["pages_cached"] + in_use == self.num_pages
        self.prefix.check_integrity()

    def _match_prefix(self, token_ids: Sequence[int], version: int) -> list[int]:
        """Cached pages for the leading full pages, never covering the last token."""
        hits: list[int] = []
        parent = ROOT
        for i in range((len(token_ids) - 1) // self.page_size):
            key = (version, parent, tuple(token_ids[i * self.page_size : (i + 1) * self.page_size]))
            page = self.prefix.lookup(key)
            if page is None:
                break
            hits.append(page)
            parent = self.prefix.entry_id(page)
        return hits

    def _ref(self, page: int) -> None:
        if self.ref_count[page] == 0:
            del self.free_pages[page]
        self.ref_count[page] += 1

    def _append_pages(self, state: TaskCacheState, count: int) -> None:
        pages = []
        for _ in range(count):
            page, _ = self.free_pages.popitem(last=False)
            self.prefix.evict(page)
            self.ref_count[page] = 1
            pages.append(page)
        self._map_pages(state, pages)

    def _map_pages(self, state: TaskCacheState, pages: list[int]) -> None:
        """Append `pages` to the task's pages and point its table row at their slots (a
        page-sized view copied per page: no tensor is built, this runs at every page a decode
        crosses)."""
        row = self.req_pool.table[state.req_slot]
        for page in pages:
            start = len(state.pages) * self.page_size
            end = min(start + self.page_size, self.req_pool.max_seq_len)
            row[start:end] = self._page_slots[page, : end - start]
            state.pages.append(page)
