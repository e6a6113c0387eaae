"""memory/allocator.py: the caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp), each
on the smallest sequence that shows it.

Run: .venv/bin/python -m pytest tests/memory/test_allocator.py -q
"""

from __future__ import annotations

import pytest

from zerofit.memory.allocator import CachingAllocator, allocation_size, replay, round_size

MIB = 1024 * 1024


def test_requests_round_to_512_bytes_and_segments_by_size_class():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert allocation_size(MIB) == 2 * MIB  # small pool: 2 MiB segments
    assert allocation_size(MIB + 512) == 20 * MIB  # 1-10 MiB: 20 MiB segments
    assert allocation_size(10 * MIB) == 10 * MIB  # from 10 MiB: rounded to 2 MiB
    assert allocation_size(10 * MIB + 1) == 12 * MIB


def test_a_small_request_takes_a_2_mib_segment_and_splits_it():
    allocator = replay([("alloc", 1, 100), ("alloc", 2, 600)])
    assert (allocator.allocated, allocator.reserved) == (512 + 1024, 2 * MIB)


def test_a_mid_sized_request_splits_a_20_mib_segment_that_later_requests_share():
    allocator = replay([("alloc", 1, 4 * MIB), ("alloc", 2, 6 * MIB), ("alloc", 3, 8 * MIB)])
    # 4 + 6 fit the first 20 MiB segment (10 MiB left), the 8 MiB request takes the rest
    assert allocator.reserved == 20 * MIB and allocator.allocated == 18 * MIB


def test_an_unsplit_remainder_counts_as_allocated():
    """19.5 MiB rounds to a 20 MiB segment whose 0.5 MiB remainder is not over kSmallSize: the
    whole block is handed out, and max_memory_allocated counts all of it."""
    allocator = replay([("alloc", 1, 19 * MIB + MIB // 2)])
    assert allocator.allocated == allocator.max_allocated == 20 * MIB


def test_a_freed_block_is_reused_for_a_smaller_request_and_the_rest_stays_cached():
    events = [("alloc", 1, 30 * MIB), ("free", 1, 0), ("alloc", 2, 12 * MIB)]
    allocator = replay(events)
    assert allocator.reserved == 30 * MIB and allocator.allocated == 12 * MIB
    # the 18 MiB left serves a request that fits it, a bigger one needs a new segment
    allocator.malloc(3, 18 * MIB)
    assert allocator.reserved == 30 * MIB
    allocator.malloc(4, 11 * MIB)
    assert allocator.reserved == 30 * MIB + 12 * MIB


def test_the_smallest_block_that_fits_is_taken():
    events = [
        ("alloc", 1, 40 * MIB),
        ("alloc", 2, 24 * MIB),
        ("free", 1, 0),
        ("free", 2, 0),
        ("alloc", 3, 22 * MIB),
    ]
    allocator = replay(events)
    # the 24 MiB segment is the best fit: the 40 MiB one stays whole for a later 40 MiB request
    allocator.malloc(4, 40 * MIB)
    assert allocator.reserved == 64 * MIB


def test_freed_neighbours_merge_into_one_block():
    events = [
        ("alloc", 1, 12 * MIB),
        ("alloc", 2, 12 * MIB),
        ("free", 1, 0),
        ("free", 2, 0),
        ("alloc", 3, 24 * MIB),
    ]
    # both went into their own segments (12 MiB each, rounded to 2 MiB): no merge across them
    assert replay(events).reserved == 48 * MIB
    events = [("alloc", 1, 30 * MIB), ("free", 1, 0), ("alloc", 2, 12 * MIB)]
    events += [("alloc", 3, 12 * MIB), ("free", 2, 0), ("free", 3, 0), ("alloc", 4, 30 * MIB)]
    # the two halves of the 30 MiB segment merge back: the 30 MiB request needs no new segment
    assert replay(events).reserved == 30 * MIB


def test_empty_cache_returns_only_wholly_free_segments():
    events = [("alloc", 1, 30 * MIB), ("alloc", 2, 4 * MIB), ("free", 1, 0)]
    events += [("alloc", 3, 2 * MIB), ("free", 2, 0), ("empty_cache", 0, 0)]
    allocator = replay(events)
    # the 20 MiB segment still holds the 2 MiB block: it stays; the 30 MiB one is released
    assert allocator.reserved == 20 * MIB and allocator.max_reserved == 50 * MIB


def test_a_full_gpu_releases_its_cache_before_running_out():
    allocator = CachingAllocator(capacity=40 * MIB)
    for event in [("alloc", 1, 30 * MIB), ("free", 1, 0), ("alloc", 2, 34 * MIB)]:
        allocator.apply(event)
    assert not allocator.out_of_memory and allocator.reserved == 34 * MIB
    allocator.malloc(3, 8 * MIB)
    assert allocator.out_of_memory


def test_a_resize_allocates_the_new_size_before_freeing_the_old():
    allocator = replay([("alloc", 1, 12 * MIB), ("resize", 1, 14 * MIB), ("free", 1, 0)])
    assert allocator.max_allocated == 26 * MIB and allocator.allocated == 0


def test_unknown_events_are_refused():
    with pytest.raises(ValueError, match="unknown allocator event"):
        replay([("realloc", 1, 10)])
