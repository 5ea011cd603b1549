"""Logical KV cache: per-request block tables over a device pool and a CPU pool.

The scheduler talks to the KV cache only through this class. It decides which blocks a
request owns; the model runner moves the bytes (the copy lists returned here are its work).

- `allocate_slots` grows a request's device table to cover a token count (all or nothing).
- `match_prefix` attaches already-computed full blocks found by content hash (a shared
  instruction preamble is computed once).
- `fork` gives a new request the KV of another's first tokens: full blocks are shared
  (reference-counted), a partly filled last block is copied (copy-on-write at fork time),
  so a session query pays only for its question.
- `truncate` keeps KV up to a token LCP after an update. A partly valid last block is
  kept and overwritten from the LCP on; if that block is shared, it is copied first
  (copy-on-write). A swapped request is truncated on its CPU copy.
- `swap_out` / `swap_in` move a table between pools; `free` releases everything.
- `chunks` is the chunk KV store (chunk_store.py: retrieved passages' KV for reuse at any
  position, blend mode only), on the same pools; `plan_reuse` plans a blend-mode chunk's reuse
  and fills, `reclaim_chunks` frees its device blocks before anyone is preempted. KV that a blend
  made approximate never enters the prefix cache (`_approx_from`), so exact requests never see it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import islice

from inference_svc.engine.block_pool import BlockPool
from inference_svc.engine.chunk_store import MIN_CHUNK_TOKENS, Capture, ChunkReuse, ChunkStore, ReusedSpan, ReusePlan

BlockPairs = list[tuple[int, int]]


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    def __init__(self, num_device_blocks: int, num_cpu_blocks: int, block_size: int = 16,
                 enable_prefix_cache: bool = True, chunk_device_blocks: int | None = None,
                 spill_chunks: bool = True) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.device = BlockPool(num_device_blocks, "device")
        self.cpu = BlockPool(num_cpu_blocks, "cpu")
        self.enable_prefix_cache = enable_prefix_cache
        self.device_tables: dict[str, list[int]] = {}
        self.cpu_tables: dict[str, list[int]] = {}
        self._hash_chains: dict[str, list[int]] = {}  # hashes of a request's leading full blocks
        self._approx_from: dict[str, int] = {}  # first token whose KV a blend made approximate
        self.chunks = ChunkStore(self.device, self.cpu, block_size,
                                 device_capacity=(num_device_blocks // 4 if chunk_device_blocks is None
                                                  else chunk_device_blocks),
                                 cpu_capacity=num_cpu_blocks // 2, spill=spill_chunks)

    # --- queries --------------------------------------------------------------------
    def device_table(self, request_id: str) -> list[int]:
        return self.device_tables.get(request_id, [])

    def num_device_blocks(self, request_id: str) -> int:
        return len(self.device_tables.get(request_id, ()))

    def num_cpu_blocks(self, request_id: str) -> int:
        return len(self.cpu_tables.get(request_id, ()))

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """New device blocks to cover `num_tokens` (a swapped request also needs its CPU blocks back)."""
        have = self.num_device_blocks(request_id) or self.num_cpu_blocks(request_id)
        extra = max(0, blocks_for(num_tokens, self.block_size) - have)
        return extra + self.num_cpu_blocks(request_id)

    # --- allocation -----------------------------------------------------------------
    def allocate_slots(self, request_id: str, num_tokens: int) -> bool:
        """Grow the device table to cover `num_tokens`. False (and no change) if blocks run out."""
        table = self.device_tables.setdefault(request_id, [])
        missing = blocks_for(num_tokens, self.block_size) - len(table)
        if missing <= 0:
            return True
        if missing > self.device.num_free:
            if not table:
                del self.device_tables[request_id]
            return False
        table.extend(self.device.allocate(missing))
        return True

    def match_prefix(self, request_id: str, token_ids: Sequence[int], num_computed: int,
                     tail: Sequence[int] = ()) -> int:
        """Attach cached blocks continuing from `num_computed`; returns the new computed count.

        Only when the request's table ends exactly at a block boundary at `num_computed`; at
        least one token is always left to compute, so the request still gets its logits.
        The tokens are `token_ids` followed by `tail` (a request's prompt and outputs, unjoined).
        """
        if not self.enable_prefix_cache or num_computed % self.block_size:
            return num_computed
        table = self.device_tables.setdefault(request_id, [])
        if len(table) * self.block_size != num_computed:
            return num_computed
        limit = (len(token_ids) + len(tail) - 1) // self.block_size
        index = len(table)
        if index < limit and self.device.num_cached:
            chain = self._hash_chains.setdefault(request_id, [])
            lookup = self.device.lookup
            while index < limit:
                if index >= len(chain):  # hash lazily: stop at the first block not cached
                    self._extend_chain(chain, token_ids, tail, index + 1)
                block = lookup(chain[index])
                if block is None:
                    break
                self.device.incref(block)
                table.append(block)
                index += 1
        if not table:
            del self.device_tables[request_id]
        return len(table) * self.block_size if table else num_computed

    def cached_prefix_tokens(self, request_id: str, token_ids: Sequence[int], tail: Sequence[int] = ()) -> int:
        """How many leading tokens of `token_ids + tail` are in the device prefix cache (k-LPM's measure)."""
        if not self.enable_prefix_cache or not self.device.num_cached:
            return 0
        num_blocks = (len(token_ids) + len(tail)) // self.block_size
        chain = self._hash_chains.setdefault(request_id, [])
        known = min(len(chain), num_blocks)
        matched = self.device.num_leading_cached(islice(chain, known))
        if matched == known:
            lookup = self.device.lookup
            while matched < num_blocks:
                if matched >= len(chain):  # hash lazily: stop at the first block not cached
                    self._extend_chain(chain, token_ids, tail, matched + 1)
                if lookup(chain[matched]) is None:
                    break
                matched += 1
        return matched * self.block_size

    def register_computed(self, request_id: str, token_ids: Sequence[int], num_computed: int,
                          tail: Sequence[int] = ()) -> None:
        """Publish the request's full, computed blocks in the prefix cache."""
        if not self.enable_prefix_cache:
            return
        table = self.device_tables.get(request_id, [])
        full = min(num_computed, self._approx_from.get(request_id, num_computed)) // self.block_size
        full = min(full, len(table))
        chain = self._hash_chains.setdefault(request_id, [])
        if len(chain) < full:
            self._extend_chain(chain, token_ids, tail, full)
        register = self.device.register
        for index in range(full):
            register(table[index], chain[index])

    def _extend_chain(self, chain: list[int], token_ids: Sequence[int], tail: Sequence[int],
                      num_blocks: int) -> None:
        """Hash blocks onto `chain` (a request's cached hashes of its leading full blocks) up to `num_blocks`."""
        bs = self.block_size
        head = len(token_ids)
        parent = chain[-1] if chain else 0
        for i in range(len(chain), num_blocks):
            start, end = i * bs, (i + 1) * bs
            if end <= head:
                block = tuple(token_ids[start:end])
            elif start >= head:
                block = tuple(tail[start - head:end - head])
            else:
                block = tuple(token_ids[start:]) + tuple(tail[:end - head])
            parent = hash((parent, block))
            chain.append(parent)

    def fork(self, parent_id: str, child_id: str, num_tokens: int) -> tuple[int, BlockPairs]:
        """Give `child_id` (holding nothing) the parent's device KV of its first `num_tokens` tokens.

        Full blocks are shared; a partly covered last block is copied into a fresh block (the
        parent keeps writing into its own). Returns (tokens the child now holds, device copies the
        runner must make first). Without a free block for that copy the child holds only the full
        blocks and computes the rest.
        """
        if child_id in self.device_tables or child_id in self.cpu_tables:
            raise ValueError(f"{child_id} already holds blocks")
        parent = self.device_tables.get(parent_id, [])
        bs = self.block_size
        num_tokens = min(num_tokens, len(parent) * bs)
        full = num_tokens // bs
        table = parent[:full]
        for block in table:
            self.device.incref(block)
        copies: BlockPairs = []
        if num_tokens % bs and self.device.num_free:
            (fresh,) = self.device.allocate(1)
            copies.append((parent[full], fresh))
            table.append(fresh)
        else:
            num_tokens = full * bs
        if table:
            self.device_tables[child_id] = table
            chain = self._hash_chains.get(parent_id)
            if chain:
                self._hash_chains[child_id] = chain[:full]
            approx = self._approx_from.get(parent_id)
            if approx is not None and approx < num_tokens:
                self._approx_from[child_id] = approx
        return num_tokens, copies

    # --- invalidation ---------------------------------------------------------------
    def truncate(self, request_id: str, num_valid_tokens: int) -> BlockPairs:
        """Keep KV for the first `num_valid_tokens` tokens; free the rest.

        Returns device-to-device copies the runner must perform now (copy-on-write of a
        shared, partly valid last block). If no block is free for that copy, the partial
        block is dropped instead; the caller learns it from `valid_tokens_after_truncate`.
        """
        bs = self.block_size
        keep = blocks_for(num_valid_tokens, bs)
        chain = self._hash_chains.get(request_id)
        if chain is not None:
            del chain[num_valid_tokens // bs:]
        if self._approx_from.get(request_id, num_valid_tokens) >= num_valid_tokens:
            self._approx_from.pop(request_id, None)   # the approximate KV is gone
        copies: BlockPairs = []
        for pool, tables in ((self.device, self.device_tables), (self.cpu, self.cpu_tables)):
            table = tables.get(request_id)
            if table is None:
                continue
            pool.decref_all(table[keep:])
            del table[keep:]
            partial = num_valid_tokens % bs and len(table) == keep and keep > 0
            if not partial:
                continue
            last = table[-1]
            if pool.ref_counts[last] > 1:      # shared: copy before overwriting
                if pool.num_free == 0:
                    pool.decref(table.pop())  # no room to copy: recompute the partial block
                    continue
                (fresh,) = pool.allocate(1)
                copies.append((last, fresh))
                pool.decref(last)
                table[-1] = fresh
            else:
                pool.unregister(last)         # its content is about to change
        return copies

    def valid_tokens_after_truncate(self, request_id: str, num_valid_tokens: int) -> int:
        held = self.num_device_blocks(request_id) or self.num_cpu_blocks(request_id)
        return min(num_valid_tokens, held * self.block_size)

    # --- preemption -----------------------------------------------------------------
    def can_swap_out(self, request_id: str) -> bool:
        return self.num_device_blocks(request_id) <= self.cpu.num_free + self.chunks.reclaimable_cpu()

    def swap_out(self, request_id: str) -> BlockPairs:
        """Move the device table to the CPU pool; returns (device, cpu) copies to perform."""
        self.chunks.reclaim_cpu(self.num_device_blocks(request_id))   # a request's KV before cached chunks
        table = self.device_tables.pop(request_id, [])
        cpu_blocks = self.cpu.allocate(len(table))
        self.device.decref_all(table)
        self.cpu_tables[request_id] = cpu_blocks
        return list(zip(table, cpu_blocks, strict=True))

    def swap_in(self, request_id: str) -> BlockPairs | None:
        """Move the CPU table back to the device; None if the device lacks blocks."""
        cpu_blocks = self.cpu_tables.get(request_id, [])
        if len(cpu_blocks) > self.device.num_free:
            return None
        device_blocks = self.device.allocate(len(cpu_blocks))
        self.cpu.decref_all(cpu_blocks)
        del self.cpu_tables[request_id]
        self.device_tables[request_id] = device_blocks
        return list(zip(cpu_blocks, device_blocks, strict=True))

    def free(self, request_id: str) -> None:
        """Release everything the request holds on both pools (recompute preemption, finish, abort)."""
        for pool, tables in ((self.device, self.device_tables), (self.cpu, self.cpu_tables)):
            pool.decref_all(tables.pop(request_id, ()))
        self._hash_chains.pop(request_id, None)
        self._approx_from.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """Drop the cached hash chain (its tokens changed beyond repair) without freeing."""
        self._hash_chains.pop(request_id, None)

    # --- the chunk store (blend mode) ------------------------------------------------
    def begin_step(self) -> None:
        """A scheduling step starts: the chunk store's pins of the last step are over."""
        self.chunks.begin_step()

    def reclaim_chunks(self, num_blocks: int) -> BlockPairs | None:
        """Evict cached chunks until `num_blocks` device blocks are free (or none is left to evict).
        Returns the device->CPU spill copies (in order, before the forward), or None if nothing changed."""
        return self.chunks.reclaim_device(num_blocks)

    def plan_reuse(self, request_id: str, prompt_token_ids: Sequence[int], spans: Sequence[tuple[int, int]],
                   start: int, num_tokens: int, fraction: float, reuse: bool = True) -> ReusePlan:
        """A blend-mode chunk computing positions [start, start + num_tokens) of a request whose keyed
        context segments (retrieved passages) sit at `spans`: the cached passages it reuses (any
        position; the part inside the chunk) and the passages it completes, to capture. The request's
        device table already covers the chunk. Without `reuse` (an exact-mode chunk filling the
        store) nothing is looked up or reused: only the captures."""
        plan = ReusePlan()
        end = start + num_tokens
        spans_used: list[ReusedSpan] = []
        captures: list[Capture] = []
        for a, b in spans:
            if b <= start or a >= end or b - a < MIN_CHUNK_TOKENS:
                continue
            tokens = prompt_token_ids[a:b]
            first_look = reuse and b <= end      # counted once per passage: in the chunk that completes it
            plan.lookups += first_look
            entry = self.chunks.lookup(tokens) if reuse else None
            if entry is not None:
                plan.hits += first_look
                lo, hi = max(a, start), min(b, end)
                spans_used.append(ReusedSpan(lo, hi - lo, tuple(entry.blocks), entry.on_cpu, lo - a, entry.position))
            elif b <= end and not self.chunks.contains(tokens):
                entry, moves = self.chunks.capture(tokens, a)
                plan.moves += moves
                if entry is not None:
                    captures.append(Capture(a, b - a, tuple(entry.blocks)))
        if spans_used:
            first = spans_used[0].start
            self._approx_from[request_id] = min(self._approx_from.get(request_id, first), first)
        if spans_used or captures:
            plan.reuse = ChunkReuse(tuple(spans_used), tuple(captures), fraction)
        return plan

    # --- invariants -----------------------------------------------------------------
    def check_invariants(self) -> None:
        """Every block is free or held by tables (and cached chunks) exactly as often as its reference count."""
        for pool, tables, on_cpu in ((self.device, self.device_tables, False), (self.cpu, self.cpu_tables, True)):
            owners = Counter(block for table in tables.values() for block in table)
            owners.update(self.chunks.owners(on_cpu))
            pool.check(owners)
        for request_id in self.cpu_tables:
            assert request_id not in self.device_tables, f"{request_id} holds blocks on both pools"
