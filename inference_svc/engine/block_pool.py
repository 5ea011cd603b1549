"""A pool of fixed-size KV blocks: free list, reference counts and the prefix-cache index.

A block is either free (reference count 0, in the free queue) or owned (count > 0, out of
the queue). A full block whose content is known can be registered under a content hash;
it stays findable after it is freed, until the pool hands it out again, so a shared
preamble survives the request that computed it. Freed blocks without content are reused
first; cached ones are reused least-recently-freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import islice, takewhile


class NoFreeBlocksError(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int, name: str) -> None:
        if num_blocks < 0:
            raise ValueError(f"{name} pool: num_blocks must be >= 0, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._hash_of: dict[int, int] = {}      # block -> content hash
        self._block_of: dict[int, int] = {}     # content hash -> block

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks (all or nothing), each with reference count 1."""
        free = self._free
        if n > len(free):
            raise NoFreeBlocksError(f"{self.name} pool: need {n} blocks, {len(free)} free")
        blocks = list(islice(free, n))  # the first n in line
        ref_counts, hash_of = self.ref_counts, self._hash_of
        for block in blocks:
            del free[block]
            if block in hash_of:
                self.unregister(block)  # its old content is about to be overwritten
            ref_counts[block] = 1
        return blocks

    def incref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        count = self.ref_counts[block]
        if count <= 0:
            raise AssertionError(f"{self.name} pool: block {block} freed twice")
        self.ref_counts[block] = count - 1
        if count == 1:
            self._free[block] = None
            if block not in self._hash_of:  # plain blocks go first in line for reuse
                self._free.move_to_end(block, last=False)

    def decref_all(self, blocks: Iterable[int]) -> None:
        """`decref` each block, in order."""
        ref_counts, free, hash_of = self.ref_counts, self._free, self._hash_of
        for block in blocks:
            count = ref_counts[block]
            if count <= 0:
                raise AssertionError(f"{self.name} pool: block {block} freed twice")
            ref_counts[block] = count - 1
            if count == 1:
                free[block] = None
                if block not in hash_of:  # plain blocks go first in line for reuse
                    free.move_to_end(block, last=False)

    # --- prefix cache ---------------------------------------------------------------
    def lookup(self, content_hash: int) -> int | None:
        return self._block_of.get(content_hash)

    def num_leading_cached(self, content_hashes: Iterable[int]) -> int:
        """How many of `content_hashes`, from the first, are in the index (stops at the first miss)."""
        return len(list(takewhile(self._block_of.__contains__, content_hashes)))

    def register(self, block: int, content_hash: int) -> None:
        if content_hash in self._block_of or block in self._hash_of:
            return  # first writer wins; a block holds one content
        self._hash_of[block] = content_hash
        self._block_of[content_hash] = block

    def unregister(self, block: int) -> None:
        content_hash = self._hash_of.pop(block, None)
        if content_hash is not None:
            del self._block_of[content_hash]

    def is_cached(self, block: int) -> bool:
        return block in self._hash_of

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def check(self, owners: dict[int, int]) -> None:
        """Assert the accounting invariant given how many tables hold each block."""
        for block in range(self.num_blocks):
            held = owners.get(block, 0)
            assert self.ref_counts[block] == held, (
                f"{self.name} block {block}: refcount {self.ref_counts[block]} but held by {held} tables")
            assert (held == 0) == (block in self._free), f"{self.name} block {block}: free/owned mismatch"
        assert len(self._free) + sum(1 for c in self.ref_counts if c > 0) == self.num_blocks
        for block, content_hash in self._hash_of.items():
            assert self._block_of[content_hash] == block
