"""PyTorch's CUDA caching allocator, replayed: what ``torch.cuda.max_memory_reserved()`` shows for
a sequence of allocations and frees.

``max_memory_allocated`` is the sum of the live blocks at its highest; ``max_memory_reserved`` is
what the allocator took from ``cudaMalloc`` at its highest, and the difference is how the blocks
were carved out of segments. This module applies the allocator's own rules
(``c10/cuda/CUDACachingAllocator.cpp`` in PyTorch 2.x, default settings: no
``expandable_segments``, no ``max_split_size_mb``, no ``roundup_power2_divisions``, no garbage
collection threshold, one stream) to a list of events, so that a trace of real allocations (a
training step recorded on the CPU or on fake tensors) gives the reserved memory a GPU would show:

- ``round_size``: every request is rounded up to a multiple of ``kMinBlockSize`` (512 B).
- ``get_pool``: requests up to ``kSmallSize`` (1 MiB) use the small pool, larger ones the large
  pool; a free block is only reused inside its own pool.
- ``get_allocation_size``: a new segment is ``kSmallBuffer`` (2 MiB) for a small request,
  ``kLargeBuffer`` (20 MiB) for one below ``kMinLargeAlloc`` (10 MiB), else the request rounded
  up to ``kRoundLarge`` (2 MiB).
- ``get_free_block``: the smallest cached free block at least as big as the request (the pool's
  ``std::set`` is ordered by size, then address: ``BlockComparatorSize``).
- ``should_split``: the block is split when what remains is at least 512 B (small pool) or more
  than ``kSmallSize`` (large pool); otherwise the whole block is handed out, and the
  ``allocated_bytes`` statistic counts the whole block (``stats.allocated_bytes ...
  increase(block->size)``), which is why ``max_memory_allocated`` can exceed the sum of requests.
- ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of its own
  segment and goes back to the pool; nothing is returned to the driver.
- ``alloc_block`` failing (the GPU is full): ``release_cached_blocks`` frees every segment that
  is entirely free, and the request is retried once; failing again is the out-of-memory error.
- ``empty_cache``: the same release, on demand (``torch.cuda.empty_cache()``).

Nothing here imports torch: an event list is plain data.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK_SIZE = 512  # kMinBlockSize
SMALL_SIZE = 1024 * 1024  # kSmallSize: largest small-pool request
SMALL_BUFFER = 2 * 1024 * 1024  # kSmallBuffer: small-pool segment
LARGE_BUFFER = 20 * 1024 * 1024  # kLargeBuffer: segment for requests of 1-10 MiB
MIN_LARGE_ALLOC = 10 * 1024 * 1024  # kMinLargeAlloc
ROUND_LARGE = 2 * 1024 * 1024  # kRoundLarge: granularity of larger segments

# an event: ("alloc", key, nbytes), ("free", key, 0), ("resize", key, nbytes) or
# ("empty_cache", 0, 0); keys name storages, nbytes are the requests before rounding
Event = tuple[str, int, int]


def round_size(nbytes: int) -> int:
    """``round_size``: the request rounded up to a multiple of 512 B (at least 512 B)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * -(-nbytes // MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc`` gets for a rounded request that no
    cached block can serve."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@dataclass(eq=False)
class Block:
    """A range of a segment: handed out (``allocated``) or cached free."""

    address: int
    size: int
    segment: int
    small: bool
    allocated: bool = False
    prev: "Block | None" = None
    next: "Block | None" = None


@dataclass
class CachingAllocator:
    """The caching allocator's state: segments, free blocks per pool, and the statistics
    ``torch.cuda.memory_stats`` keeps. ``capacity``: bytes ``cudaMalloc`` can hand out in all
    (None: unlimited, a GPU with room to spare)."""

    capacity: int | None = None
    allocated: int = 0
    reserved: int = 0
    max_allocated: int = 0
    max_reserved: int = 0
    out_of_memory: bool = False
    # free blocks per pool, ordered like the allocator's set: (size, address, id)
    _free: dict[bool, list[tuple[int, int, int]]] = field(
        default_factory=lambda: {True: [], False: []}
    )
    _blocks_by_id: dict[int, Block] = field(default_factory=dict)
    _live: dict[int, Block] = field(default_factory=dict)  # key -> allocated block
    _segments: dict[int, int] = field(default_factory=dict)  # segment id -> bytes
    _next_address: int = 0
    _next_segment: int = 0

    # --- the pools' ordered sets
    def _insert_free(self, block: Block) -> None:
        self._blocks_by_id[id(block)] = block
        bisect.insort(self._free[block.small], (block.size, block.address, id(block)))

    def _remove_free(self, block: Block) -> None:
        pool = self._free[block.small]
        index = bisect.bisect_left(pool, (block.size, block.address, id(block)))
        del pool[index]
        del self._blocks_by_id[id(block)]

    def _find_free(self, size: int, small: bool) -> Block | None:
        """``get_free_block``: the smallest cached block of the pool that holds ``size``."""
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1, -1))
        if index == len(pool):
            return None
        block = self._blocks_by_id[pool[index][2]]
        self._remove_free(block)
        return block

    # --- segments
    def _new_segment(self, segment_size: int, small: bool) -> Block | None:
        """``alloc_block``: a fresh segment, or None where ``cudaMalloc`` would fail."""
        if self.capacity is not None and self.reserved + segment_size > self.capacity:
            return None
        segment = self._next_segment
        self._next_segment += 1
        block = Block(self._next_address, segment_size, segment, small)
        self._next_address += segment_size
        self._segments[segment] = segment_size
        self.reserved += segment_size
        self.max_reserved = max(self.max_reserved, self.reserved)
        return block

    def release_cached_blocks(self) -> None:
        """``release_cached_blocks`` (and ``torch.cuda.empty_cache()``): every segment that is
        one free block goes back to the driver."""
        for small in (True, False):
            whole = [
                self._blocks_by_id[entry[2]]
                for entry in self._free[small]
                if self._blocks_by_id[entry[2]].prev is None
                and self._blocks_by_id[entry[2]].next is None
            ]
            for block in whole:
                self._remove_free(block)
                self.reserved -= self._segments.pop(block.segment)

    # --- requests
    def malloc(self, key: int, nbytes: int) -> None:
        """Hand out a block for storage ``key`` of ``nbytes``; sets ``out_of_memory`` where the
        GPU's capacity cannot hold it even after the cache is released."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._find_free(size, small)
        if block is None:
            segment_size = allocation_size(size)
            block = self._new_segment(segment_size, small)
            if block is None:
                self.release_cached_blocks()
                block = self._new_segment(segment_size, small)
            if block is None:
                self.out_of_memory = True
                return
        remaining = block.size - size
        if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
            rest = Block(block.address + size, remaining, block.segment, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.max_allocated = max(self.max_allocated, self.allocated)

    def free(self, key: int) -> None:
        """``free_block``: the block of ``key`` merges with its free neighbours and is cached."""
        block = self._live.pop(key, None)
        if block is None:
            return
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated:
                continue
            self._remove_free(neighbour)
            if neighbour is block.prev:
                block.address = neighbour.address
                block.prev = neighbour.prev
                if neighbour.prev is not None:
                    neighbour.prev.next = block
            else:
                block.next = neighbour.next
                if neighbour.next is not None:
                    neighbour.next.prev = block
            block.size += neighbour.size
        self._insert_free(block)

    def apply(self, event: Event) -> None:
        """One event of a trace (see ``Event``). A resize is a new block for the new size: the
        CUDA allocator has no realloc, ``resize_`` copies into a fresh allocation."""
        kind, key, nbytes = event
        if kind == "alloc":
            self.malloc(key, nbytes)
        elif kind == "free":
            self.free(key)
        elif kind == "resize":
            old = self._live.get(key)
            if nbytes:
                self.malloc(-1, nbytes)  # the new storage exists before the old one is freed
                new = self._live.pop(-1, None)
                self.free(key)
                if new is not None:
                    self._live[key] = new
            elif old is not None:
                self.free(key)
        elif kind == "empty_cache":
            self.release_cached_blocks()
        else:
            raise ValueError(f"unknown allocator event {kind!r}")

    def reset_peaks(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``: the peaks restart from what is held now."""
        self.max_allocated = self.allocated
        self.max_reserved = self.reserved


def replay(events, capacity: int | None = None) -> CachingAllocator:
    """The allocator after every event of ``events`` (its peaks are the run's
    ``max_memory_allocated`` / ``max_memory_reserved``)."""
    allocator = CachingAllocator(capacity=capacity)
    for event in events:
        allocator.apply(event)
    return allocator
