"""KV pool: paged and contiguous allocation, prefix cache, forks, integrity."""

import random

import pytest
import torch

from core_engine.cache import KVPool, TaskCacheManager
from core_engine.task import KV_STRATEGIES


def make_manager(strategy="paged", num_pages=8, page_size=4, max_requests=4, max_seq_len=32):
    pool = KVPool(
        num_layers=2,
        num_kv_heads=2,
        head_dim=4,
        max_requests=max_requests,
        max_seq_len=max_seq_len,
        strategy=strategy,
        page_size=page_size,
        num_pages=num_pages,
    )
    return TaskCacheManager(pool)


def test_the_pool_builds_every_strategy_jobs_may_name_and_refuses_others():
    """`KV_STRATEGIES` (what job validation and the UI offer) is what the pool implements."""
    for name in KV_STRATEGIES:
        manager = make_manager(name)
        assert manager.allocate(1, list(range(5)), version=0) == 0 and manager.holds(1)
    with pytest.raises(ValueError, match="unknown KV strategy 'radix'"):
        make_manager("radix")


def test_pool_exposes_strategy_and_request_pool():
    manager = make_manager()
    assert manager.pool.strategy.num_slots == 32
    assert manager.pool.req_pool.max_requests == 4
    assert manager.pool.buffer.k.shape == (2, 33, 2, 4)  # + the scratch slot
    assert manager.pool.scratch_slot == 32
    with pytest.raises(ValueError, match="unknown KV strategy"):
        make_manager(strategy="radix")


def test_paged_allocation_maps_table_rows_to_pages():
    m = make_manager()
    assert m.allocate(1, list(range(10)), version=0) == 0
    state = m.states[1]
    assert len(state.pages) == 3
    row = m.pool.req_pool.table[state.req_slot, :12].tolist()
    expected = [p * 4 + o for p in state.pages for o in range(4)]
    assert row == expected
    m.check_integrity()


def test_allocation_failure_holds_nothing():
    m = make_manager(num_pages=3)
    assert m.allocate(1, list(range(8)), 0) == 0
    assert m.allocate(2, list(range(100, 109)), 0) is None  # needs 3 pages, 1 free
    assert not m.holds(2)
    assert m.pool.req_pool.num_free == 3
    m.check_integrity()
    assert m.extend(1, 13) is False  # would need a 4th page
    assert len(m.states[1].pages) == 2
    assert m.extend(1, 12) is True
    m.free(1)
    assert m.pool.strategy.usage()["pages_used"] == 0
    m.check_integrity()


def test_prefix_hit_is_version_stamped_and_never_covers_last_token():
    m = make_manager()
    tokens = list(range(12))  # three full pages
    m.allocate(1, tokens, 0)
    m.free(1, tokens, version=0)
    assert m.pool.strategy.usage()["pages_cached"] == 3
    # Same prompt: the last page holds the last token, so it is recomputed into a new page.
    assert m.allocate(2, tokens, 0) == 8
    # Another version can never match.
    assert m.allocate(3, tokens, 1) == 0
    # A longer prompt sharing the prefix hits all three pages.
    assert m.allocate(4, [*tokens, 99], 0) == 12
    assert m.states[4].pages[:2] == m.states[2].pages[:2]
    m.check_integrity()
    for task in (2, 3, 4):
        m.free(task)
    m.check_integrity()


def test_prefix_hit_populates_the_new_request_row():
    m = make_manager()
    tokens = list(range(9))
    m.allocate(1, tokens, 0)
    cached_row = m.pool.req_pool.table[m.req_slot(1), :8].clone()
    m.free(1, tokens, version=0)
    assert m.allocate(2, tokens, 0) == 8
    assert torch.equal(m.pool.req_pool.table[m.req_slot(2), :8], cached_row)


def test_collision_guard_compares_exact_tokens():
    m = make_manager()
    m.allocate(1, [1, 2, 3, 4, 5], 0)
    m.free(1, [1, 2, 3, 4, 5], version=0)
    assert m.allocate(2, [1, 2, 3, 5, 5], 0) == 0


def test_eviction_reuses_uncached_pages_first_then_tails_before_heads():
    m = make_manager(num_pages=4)
    tokens = list(range(8))
    m.allocate(1, tokens, 0)
    head, tail = m.states[1].pages
    m.free(1, tokens, version=0)  # two cached pages: head and its child
    strategy = m.pool.strategy
    assert strategy.usage() == {"pages_used": 0, "pages_free": 2, "pages_cached": 2}
    m.allocate(2, list(range(100, 108)), 0)  # takes the two uncached pages
    assert strategy.usage()["pages_cached"] == 2
    m.allocate(3, [200], 0)  # evicts the tail page; the head stays reusable
    assert m.states[3].pages == [tail]
    assert strategy.prefix.is_cached(head) and not strategy.prefix.is_cached(tail)
    m.check_integrity()


def test_evicting_a_page_evicts_its_cached_descendants():
    m = make_manager()
    tokens = list(range(12))
    m.allocate(1, tokens, 0)
    pages = list(m.states[1].pages)
    m.free(1, tokens, version=0)
    prefix = m.pool.strategy.prefix
    assert sorted(prefix.evict(pages[0])) == sorted(pages)
    assert len(prefix) == 0
    m.check_integrity()


def test_invalidate_drops_every_entry():
    m = make_manager()
    tokens = list(range(12))
    m.allocate(1, tokens, 0)
    m.free(1, tokens, version=0)
    assert m.pool.strategy.invalidate() == 3
    assert m.allocate(2, tokens, 0) == 0
    m.check_integrity()


@pytest.mark.parametrize("strategy", ["paged", "contiguous"])
def test_fork_shares_full_pages_and_copies_the_partial_one(strategy):
    m = make_manager(strategy=strategy)
    prompt = list(range(10))  # two full pages + 2 tokens
    m.allocate(1, prompt, 0)
    kv = m.pool.buffer
    parent_slots = m.pool.req_pool.table[m.req_slot(1), :10]
    kv.k[:, parent_slots] = torch.randn(2, 10, 2, 4)
    assert m.fork(1, [2], 10) == 1
    child_slots = m.pool.req_pool.table[m.req_slot(2), :10]
    assert torch.equal(kv.k[:, child_slots], kv.k[:, parent_slots])
    if strategy == "paged":
        parent, child = m.states[1].pages, m.states[2].pages
        assert child[:2] == parent[:2] and child[2] != parent[2]
        assert m.pool.strategy.usage()["pages_used"] == 4  # 3 + one private partial page
    m.check_integrity()
    m.free(1)
    m.free(2)
    m.check_integrity()


def test_fork_without_room_changes_nothing():
    m = make_manager(num_pages=3)
    m.allocate(1, list(range(10)), 0)
    assert m.fork(1, [2], 10) == 0
    assert not m.holds(2)
    m.check_integrity()


@pytest.mark.parametrize("strategy", ["paged", "contiguous"])
def test_a_group_fork_gives_each_child_the_parents_kv_until_the_pool_is_full(strategy):
    """Siblings fork together (their private slots copied in one pass); the first the pool
    has no room for, and every one after it, holds nothing."""
    m = make_manager(strategy=strategy, num_pages=5, max_requests=4)
    m.allocate(1, list(range(10)), 0)  # paged: two full pages + one partial
    kv = m.pool.buffer
    parent_slots = m.pool.req_pool.table[m.req_slot(1), :10]
    kv.k[:, parent_slots] = torch.randn(2, 10, 2, 4)
    kv.v[:, parent_slots] = torch.randn(2, 10, 2, 4)
    expected = 2 if strategy == "paged" else 3  # paged: two free pages; contiguous: 3 slots
    assert m.fork(1, [2, 3, 4, 5], 10) == expected
    for child in [2, 3, 4][:expected]:
        child_slots = m.pool.req_pool.table[m.req_slot(child), :10]
        assert torch.equal(kv.k[:, child_slots], kv.k[:, parent_slots])
        assert torch.equal(kv.v[:, child_slots], kv.v[:, parent_slots])
    assert not any(m.holds(child) for child in [2, 3, 4, 5][expected:])
    if strategy == "paged":
        partial = {m.states[t].pages[2] for t in (1, 2, 3)}
        assert len(partial) == 3  # every child writes its own partial page
    m.check_integrity()


def test_contiguous_regions_are_fixed_per_request_slot():
    m = make_manager(strategy="contiguous", max_seq_len=16)
    m.allocate(1, [1, 2, 3], 0)
    slot = m.req_slot(1)
    assert m.pool.req_pool.table[slot, :3].tolist() == [slot * 16 + i for i in range(3)]
    assert m.extend(1, 16) and not m.extend(1, 17)
    assert m.allocate(2, list(range(17)), 0) is None


def test_random_operations_keep_integrity():
    rng = random.Random(0)
    m = make_manager(num_pages=12, max_requests=6)
    live: dict[int, list[int]] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.4 and len(live) < 6:
            tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 14))]
            if m.allocate(step, tokens, version=step // 100) is not None:
                live[step] = tokens
        elif op < 0.7 and live:
            task = rng.choice(list(live))
            grown = live[task] + [rng.randrange(3)]
            if m.extend(task, len(grown)):
                live[task] = grown
        elif op < 0.8 and live and len(live) < 6:
            parent = rng.choice(list(live))
            if m.fork(parent, [step], len(live[parent])):
                live[step] = list(live[parent])
        elif live:
            task = rng.choice(list(live))
            m.free(task, live.pop(task), version=step // 100)
        if step % 100 == 99:
            m.pool.strategy.invalidate()
        m.check_integrity()
    for task, tokens in live.items():
        m.free(task, tokens, version=0)
    m.check_integrity()
    assert m.pool.strategy.usage()["pages_used"] == 0
