"""The chunk KV store: the KV of retrieved passages, kept for reuse at any position (blend mode).

A part of the KV manager (`KVCacheManager.chunks`), not a second cache beside it: its blocks come
from the manager's device and CPU pools and count in the same accounting (`owners`). An entry is
one passage's KV, keyed by its token ids (one store per engine, so per model and dtype), in whole
blocks from slot 0, with the position its first token had when it was computed (the keys are
rotated by the position delta when the passage is reused elsewhere: `blend.py`).

- Filled (`capture`) when a request in blend mode prefills a keyed context segment (a retrieved
  passage) as its own segment: after the forward that computes its last token the runner copies
  the passage's KV from the request's blocks into the entry's blocks. By default exact-mode
  requests never fill it, so exact mode holds no store block and is unchanged; with
  `EngineConfig.chunk_store_fill = "all"` (`--chunk-store-fill all`) they fill it too (their KV
  is the model's own; they never read the store).
- LRU under the eviction mode: past its device capacity, or when a request needs device blocks
  (`reclaim_device`, before any preemption), the least recently used entry spills to the CPU pool
  (eviction `swap`/`cost`) or is dropped (`recompute`); CPU entries are dropped, least recently
  used first, when the CPU pool is full or a swap-out needs their blocks (`reclaim_cpu`).
- A capture with no room (no free device block, or no unpinned entry to evict under the device
  capacity) is skipped, never forced: the passage is simply not kept. Skips are counted
  (`ChunkStoreStats.captures_skipped`, the engine's `chunk_captures_skipped` counter).
- An entry a step uses (read by a blended chunk, or written by a capture) is pinned for that step:
  nothing evicts it until the next `begin_step`; a captured entry is readable from the next step.

The data the runner needs for a step travels in `ChunkReuse` on the chunk (`ChunkInput.reuse`).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from inference_svc.engine.block_pool import BlockPool

BlockPairs = list[tuple[int, int]]

MIN_CHUNK_TOKENS = 16          # shorter passages are not worth an entry


@dataclass(frozen=True)
class ReusedSpan:
    """Positions [start, start + length) of the chunk take their KV from a store entry: its tokens
    from `offset` on, computed at positions `cached_position + offset ...`."""

    start: int
    length: int
    blocks: tuple[int, ...]
    on_cpu: bool
    offset: int
    cached_position: int

    @property
    def delta(self) -> int:
        """Position shift to rotate the cached keys by."""
        return self.start - (self.cached_position + self.offset)


@dataclass(frozen=True)
class Capture:
    """After the forward: copy the KV of positions [start, start + length) into `blocks` (device)."""

    start: int
    length: int
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class ChunkReuse:
    """What a scheduled chunk does with the store this step (the runner's work)."""

    spans: tuple[ReusedSpan, ...] = ()
    captures: tuple[Capture, ...] = ()
    fraction: float = 0.0        # share of the reused tokens recomputed

    @property
    def reused_tokens(self) -> int:
        return sum(s.length for s in self.spans)

    @property
    def recomputed_tokens(self) -> int:
        return recompute_count(self.reused_tokens, self.fraction)


def recompute_count(reused: int, fraction: float) -> int:
    """How many of `reused` tokens a blend recomputes at `fraction` (0 -> none, 1 -> all)."""
    return min(reused, math.ceil(reused * fraction - 1e-9))


@dataclass(eq=False)
class ChunkEntry:
    token_ids: tuple[int, ...]
    position: int
    blocks: list[int]
    on_cpu: bool = False
    ready_step: int = 0          # readable from this step on (a capture is written during its step)
    pinned_step: int = -1        # in use during this step: not evicted
    hits: int = 0


@dataclass
class ChunkStoreStats:
    lookups: int = 0
    hits: int = 0
    captures: int = 0
    captures_skipped: int = 0    # passages not captured for want of device blocks (free, or evictable under capacity)
    spills: int = 0
    drops: int = 0


class ChunkStore:
    def __init__(self, device: BlockPool, cpu: BlockPool, block_size: int, *, device_capacity: int,
                 cpu_capacity: int, spill: bool) -> None:
        self.device, self.cpu, self.block_size = device, cpu, block_size
        self.device_capacity, self.cpu_capacity, self.spill = device_capacity, cpu_capacity, spill
        self.entries: OrderedDict[tuple[int, ...], ChunkEntry] = OrderedDict()   # least recently used first
        self.step = 0
        self.stats = ChunkStoreStats()

    # --- queries --------------------------------------------------------------------
    def blocks_held(self, on_cpu: bool) -> int:
        return sum(len(e.blocks) for e in self.entries.values() if e.on_cpu == on_cpu)

    def owners(self, on_cpu: bool) -> Counter:
        return Counter(b for e in self.entries.values() if e.on_cpu == on_cpu for b in e.blocks)

    def lookup(self, token_ids: Sequence[int]) -> ChunkEntry | None:
        """A readable entry for exactly these tokens (marked used: LRU, pinned for the step)."""
        entry = self.entries.get(tuple(token_ids))
        if entry is None or entry.ready_step > self.step:
            return None
        self.entries.move_to_end(entry.token_ids)
        entry.pinned_step = self.step
        entry.hits += 1
        return entry

    def contains(self, token_ids: Sequence[int]) -> bool:
        return tuple(token_ids) in self.entries

    # --- steps ----------------------------------------------------------------------
    def begin_step(self) -> None:
        """A new scheduling step: last step's pins are over (its forward has run)."""
        self.step += 1

    # --- filling --------------------------------------------------------------------
    def capture(self, token_ids: Sequence[int], position: int) -> tuple[ChunkEntry | None, BlockPairs]:
        """A new entry for a passage computed this step, on free device blocks (evicting least recently
        used entries past the device capacity). Returns (the entry or None, device->CPU spill copies to
        make before this step's forward)."""
        key = tuple(token_ids)
        if len(key) < MIN_CHUNK_TOKENS or key in self.entries:
            return None, []
        need = -(-len(key) // self.block_size)
        if need > self.device_capacity:
            return None, []
        moves: BlockPairs = []
        while self.blocks_held(False) + need > self.device_capacity:
            if not self._evict_device(moves):
                self.stats.captures_skipped += 1
                return None, moves
        if need > self.device.num_free:
            self.stats.captures_skipped += 1
            return None, moves      # never preempts or evicts for a capture beyond its capacity
        entry = ChunkEntry(key, position, self.device.allocate(need), ready_step=self.step + 1,
                           pinned_step=self.step)
        self.entries[key] = entry
        self.stats.captures += 1
        return entry, moves

    # --- eviction -------------------------------------------------------------------
    def reclaim_device(self, num_blocks: int) -> BlockPairs | None:
        """Free device blocks until `num_blocks` are free, least recently used entries first (spilled to
        the CPU pool when the eviction mode swaps, else dropped). Returns the spill copies, or None when
        no unpinned device entry was left to evict (nothing changed then)."""
        moves: BlockPairs = []
        evicted = False
        while self.device.num_free < num_blocks and self._evict_device(moves):
            evicted = True
        return moves if evicted else None

    def reclaim_cpu(self, num_blocks: int) -> None:
        """Drop CPU entries, least recently used first, until `num_blocks` CPU blocks are free (no copies)."""
        for entry in [e for e in self.entries.values() if e.on_cpu]:
            if self.cpu.num_free >= num_blocks:
                return
            if entry.pinned_step != self.step:
                self._drop(entry)

    def reclaimable_cpu(self) -> int:
        return sum(len(e.blocks) for e in self.entries.values() if e.on_cpu and e.pinned_step != self.step)

    def _evict_device(self, moves: BlockPairs) -> bool:
        victim = next((e for e in self.entries.values() if not e.on_cpu and e.pinned_step != self.step), None)
        if victim is None:
            return False
        n = len(victim.blocks)
        if self.spill and n <= self.cpu_capacity:
            while self.blocks_held(True) + n > self.cpu_capacity or self.cpu.num_free < n:
                older = next((e for e in self.entries.values() if e.on_cpu and e.pinned_step != self.step), None)
                if older is None:
                    break
                self._drop(older)
            if self.blocks_held(True) + n <= self.cpu_capacity and self.cpu.num_free >= n:
                cpu_blocks = self.cpu.allocate(n)
                moves.extend(zip(victim.blocks, cpu_blocks, strict=True))
                self.device.decref_all(victim.blocks)
                victim.blocks, victim.on_cpu = cpu_blocks, True
                self.stats.spills += 1
                return True
        self._drop(victim)
        return True

    def _drop(self, entry: ChunkEntry) -> None:
        (self.cpu if entry.on_cpu else self.device).decref_all(entry.blocks)
        del self.entries[entry.token_ids]
        self.stats.drops += 1

    def clear(self) -> None:
        for entry in list(self.entries.values()):
            self._drop(entry)


@dataclass
class ReusePlan:
    """`KVCacheManager.plan_reuse`'s answer: the chunk's reuse (None: nothing to do) and spill copies."""

    reuse: ChunkReuse | None = None
    moves: BlockPairs = field(default_factory=list)
    lookups: int = 0
    hits: int = 0


def keyed_spans(encode, segments, offset: int) -> list[tuple[int, int]]:
    """Token spans [start, end) of the keyed segments (retrieved passages) among `segments`, which
    start at token `offset`; `encode` is the engine's per-segment tokenizer (cached by key)."""
    spans = []
    for segment in segments:
        n = len(encode(segment))
        if segment.key:
            spans.append((offset, offset + n))
        offset += n
    return spans
