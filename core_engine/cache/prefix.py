"""Prefix cache: full KV pages keyed by (policy version, parent entry, exact page tokens).

Keys hold the exact token tuple (no hash collisions to guard against) and the policy version
that computed the page, so a page of another version can never match. Entry ids are never
reused, so a child whose parent was evicted becomes unreachable; eviction drops it eagerly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

ROOT = -1

PageKey = tuple[int, int, tuple[int, ...]]


@dataclass
class PrefixCache:
    """Maps page keys to physical pages; pages remember their key and their cached children."""

    entries: dict[PageKey, int] = field(default_factory=dict)
    key_of: dict[int, PageKey] = field(default_factory=dict)
    entry_id_of: dict[int, int] = field(default_factory=dict)
    children: dict[int, set[int]] = field(default_factory=dict)
    parent_of: dict[int, int] = field(default_factory=dict)
    page_of_entry: dict[int, int] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, key: PageKey) -> int | None:
        return self.entries.get(key)

    def entry_id(self, page: int) -> int:
        return self.entry_id_of[page]

    def is_cached(self, page: int) -> bool:
        return page in self.key_of

    def insert(self, key: PageKey, page: int) -> int:
        """Publish `page` under `key` (its parent entry is `key[1]`); returns its entry id."""
        entry_id = next(self._ids)
        self.entries[key] = page
        self.key_of[page] = key
        self.entry_id_of[page] = entry_id
        self.page_of_entry[entry_id] = page
        parent_page = self.page_of_entry.get(key[1])
        if parent_page is not None:
            self.children.setdefault(parent_page, set()).add(page)
            self.parent_of[page] = parent_page
        return entry_id

    def evict(self, page: int) -> list[int]:
        """Drop `page`'s entry and all its descendants'; returns every page evicted."""
        evicted = []
        stack = [page]
        while stack:
            p = stack.pop()
            key = self.key_of.pop(p, None)
            if key is None:
                continue
            del self.entries[key]
            del self.page_of_entry[self.entry_id_of.pop(p)]
            parent = self.parent_of.pop(p, None)
            if parent is not None and p in self.children.get(parent, ()):
                self.children[parent].discard(p)
            stack.extend(self.children.pop(p, ()))
            evicted.append(p)
        return evicted

    def clear(self) -> int:
        """Drop every entry (the version barrier); returns how many there were."""
        n = len(self.entries)
        self.entries.clear()
        self.key_of.clear()
        self.entry_id_of.clear()
        self.children.clear()
        self.parent_of.clear()
        self.page_of_entry.clear()
        return n

    def check_integrity(self) -> None:
        assert len(self.entries) == len(self.key_of) == len(self.entry_id_of)
        assert len(self.page_of_entry) == len(self.entries)
        for key, page in self.entries.items():
            assert self.key_of[page] == key, f"page {page} key mismatch"
        for parent, kids in self.children.items():
            assert parent in self.key_of, f"uncached page {parent} has cached children"
            for kid in kids:
                assert self.parent_of[kid] == parent
                assert self.key_of[kid][1] == self.entry_id_of[parent], (
                    f"cached page {kid} is not a child of page {parent}"
                )
