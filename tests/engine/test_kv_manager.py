"""Block tables, LCP truncation arithmetic, copy-on-write, swap and the prefix cache."""

from __future__ import annotations

import pytest

from inference_svc.engine.block_pool import BlockPool, NoFreeBlocksError
from inference_svc.engine.kv_manager import KVCacheManager


def test_pool_allocation_is_all_or_nothing():
    pool = BlockPool(3, "device")
    pool.allocate(2)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(2)
    assert pool.num_free == 1


def test_pool_refuses_a_double_free():
    pool = BlockPool(2, "device")
    (block,) = pool.allocate(1)
    pool.decref(block)
    with pytest.raises(AssertionError, match="freed twice"):
        pool.decref(block)


@pytest.mark.parametrize(
    ("computed", "lcp", "blocks_kept", "valid"),
    [
        (40, 32, 2, 32),  # cut exactly at a block boundary: whole blocks kept
        (40, 33, 3, 33),  # one token into block 2: the partly valid block stays
        (40, 47, 3, 40),  # LCP beyond what was computed: nothing computed is lost
        (40, 0, 0, 0),  # nothing in common
        (40, 15, 1, 15),  # inside the first block
    ],
)
def test_truncate_keeps_blocks_up_to_the_lcp(computed, lcp, blocks_kept, valid):
    kv = KVCacheManager(num_device_blocks=8, num_cpu_blocks=8, block_size=16)
    assert kv.allocate_slots("r", computed)
    copies = kv.truncate("r", min(lcp, computed))
    assert copies == []
    assert kv.num_device_blocks("r") == blocks_kept
    assert kv.valid_tokens_after_truncate("r", min(lcp, computed)) == valid
    assert kv.device.num_free == 8 - blocks_kept
    kv.check_invariants()


def test_truncate_inside_a_shared_block_copies_it_first():
    kv = KVCacheManager(num_device_blocks=8, num_cpu_blocks=0, block_size=4)
    tokens = list(range(100, 112))  # 3 full blocks
    assert kv.allocate_slots("a", 12)
    kv.register_computed("a", tokens, 12)
    assert kv.match_prefix("b", [*tokens, 1], 0) == 12  # b shares a's three blocks
    shared = kv.device_table("b")[2]
    copies = kv.truncate("b", 10)  # cut inside the shared third block
    assert len(copies) == 1 and copies[0][0] == shared
    assert kv.device_table("b")[2] == copies[0][1] != shared
    assert kv.device_table("a")[2] == shared  # a's KV is untouched
    assert kv.device.ref_counts[shared] == 1
    kv.check_invariants()


def test_truncate_inside_an_unshared_cached_block_unregisters_it():
    kv = KVCacheManager(num_device_blocks=4, num_cpu_blocks=0, block_size=4)
    tokens = list(range(8))
    kv.allocate_slots("a", 8)
    kv.register_computed("a", tokens, 8)
    kv.truncate("a", 6)
    assert kv.cached_prefix_tokens("x", tokens) == 4  # block 0 still cached, block 1 is not
    kv.check_invariants()


def test_truncate_of_a_swapped_request_frees_on_the_cpu_copy():
    kv = KVCacheManager(num_device_blocks=8, num_cpu_blocks=8, block_size=16)
    kv.allocate_slots("r", 64)
    pairs = kv.swap_out("r")
    assert len(pairs) == 4 and kv.num_device_blocks("r") == 0
    kv.truncate("r", 20)
    assert kv.num_cpu_blocks("r") == 2 and kv.cpu.num_free == 6
    assert kv.valid_tokens_after_truncate("r", 20) == 20
    back = kv.swap_in("r")
    assert len(back) == 2 and kv.num_device_blocks("r") == 2 and kv.cpu.num_free == 8
    kv.check_invariants()


def test_prefix_match_leaves_at_least_one_token_to_compute():
    kv = KVCacheManager(num_device_blocks=8, num_cpu_blocks=0, block_size=4)
    tokens = list(range(8))
    kv.allocate_slots("a", 8)
    kv.register_computed("a", tokens, 8)
    assert kv.match_prefix("b", tokens, 0) == 4  # not 8: the last token must run for logits
    kv.free("a")
    kv.free("b")
    assert kv.match_prefix("c", [*tokens, 9], 0) == 8  # freed blocks stay findable until reused
    kv.check_invariants()


def test_free_blocks_are_reused_before_cached_ones():
    kv = KVCacheManager(num_device_blocks=4, num_cpu_blocks=0, block_size=4)
    tokens = list(range(8))
    kv.allocate_slots("a", 8)
    kv.register_computed("a", tokens, 8)
    kv.free("a")
    kv.allocate_slots("b", 8)  # two plain blocks are enough
    assert kv.cached_prefix_tokens("c", tokens) == 8
    kv.check_invariants()


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_device_blocks=2, num_cpu_blocks=0, block_size=4)
    assert not kv.allocate_slots("r", 12)
    assert kv.device.num_free == 2 and kv.num_device_blocks("r") == 0
    kv.check_invariants()
