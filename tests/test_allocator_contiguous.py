"""Scenario tests of ContiguousAllocator and its buddy / first-fit arenas."""
import pytest

from kvsim.allocator import BuddyArena, ContiguousAllocator, FirstFitArena


# prompt 100 + output 200: pow2 rounds the output only, 100 + 256
@pytest.mark.parametrize("policy, reserved", [("max", 2048), ("pow2", 356), ("oracle", 300)])
def test_each_policy_reserves_its_extent(policy, reserved):
    c = ContiguousAllocator(8192, policy, max_model_len=2048, placement="first-fit")
    assert c.reservation_tokens(300, num_prompt_tokens=100) == reserved
    assert c.allocate(0, 100, 300)
    assert c.breakdown() == {"token_states": 100, "reservation": 200,
                             "internal_fragmentation": reserved - 300,
                             "external_fragmentation": 0, "cached": 0,
                             "free": 8192 - reserved}
    c.check_invariants()


def test_buddy_rounds_up_and_counts_rounding_as_external():
    c = ContiguousAllocator(4096, "oracle", max_model_len=2048, placement="buddy")
    assert c.extent_tokens(300) == 512
    assert c.allocate(0, 100, 300)
    assert c.breakdown()["external_fragmentation"] == 212
    assert c.breakdown()["free"] == 4096 - 512
    snap = c.snapshot()
    assert snap.class_counts()["external_fragmentation"] == 212
    assert list(snap.block_tables[0]) == list(range(512))


def test_append_grows_inside_the_reservation_only():
    c = ContiguousAllocator(4096, "oracle", max_model_len=2048, placement="first-fit")
    c.allocate(0, 10, 12)
    assert c.append(0, 2)
    assert not c.append(0, 1)                       # oracle: no room past the true length
    assert c.num_tokens(0) == 12
    p = ContiguousAllocator(4096, "pow2", max_model_len=2048, placement="first-fit")
    p.allocate(0, 10, 13)                           # output 3 -> 4: reserves 14
    assert p.append(0, 4) and not p.append(0, 1)
    # ran past the announced final length: the overrun is token states, not fragmentation
    assert p.breakdown()["internal_fragmentation"] == 0 and p.breakdown()["token_states"] == 14
    p.check_invariants()


def test_buddy_splits_and_merges_back():
    arena = BuddyArena(1024)
    a = arena.allocate(100)      # 128 at 0: splits 1024 -> 512 + 256 + 128 (+128 used)
    assert a == 0 and arena.holes() == [(128, 128), (256, 256), (512, 512)]
    b = arena.allocate(128)      # the free 128 buddy
    c = arena.allocate(200)      # 256
    assert (b, c) == (128, 256)
    arena.free(a)
    assert arena.holes() == [(0, 128), (512, 512)]   # buddy of a (b) is used: no merge
    arena.free(b)                # a + b -> 256 at 0; its buddy c is still used
    assert arena.holes() == [(0, 256), (512, 512)]
    arena.free(c)                # 256 + 256 -> 512, + 512 -> 1024
    assert arena.holes() == [(0, 1024)]
    arena.check_invariants()


def test_buddy_capacity_not_a_power_of_two_is_cut_into_zones_that_never_merge():
    arena = BuddyArena(7168)                        # 4096 + 2048 + 1024
    assert arena.holes() == [(0, 4096), (4096, 2048), (6144, 1024)]
    assert arena.allocate(4096) == 0
    assert arena.allocate(4096) is None             # 3072 free, but no 4096 extent
    x = arena.allocate(2048)
    arena.free(x)
    arena.free(0)
    assert arena.holes() == [(0, 4096), (4096, 2048), (6144, 1024)]
    arena.check_invariants()


def test_first_fit_leaves_holes_and_fills_the_lowest_one_that_fits():
    arena = FirstFitArena(1000)
    a, b, c = arena.allocate(300), arena.allocate(100), arena.allocate(400)
    assert (a, b, c) == (0, 300, 400)
    arena.free(a)
    assert arena.holes() == [(0, 300), (800, 200)]
    assert arena.allocate(250) == 0                 # lowest hole that fits
    assert arena.allocate(100) == 800               # the 50-slot hole at 250 is too small
    arena.free(b)                                   # 250..400 merges with the hole before it
    assert arena.holes() == [(250, 150), (900, 100)]
    arena.check_invariants()


def test_external_fragmentation_is_measured_against_the_waiting_request():
    c = ContiguousAllocator(1000, "oracle", max_model_len=1000, placement="first-fit")
    for seq_id, size in enumerate([300, 100, 300, 100]):
        assert c.allocate(seq_id, size, size)
    c.free(0)
    c.free(2)                                       # holes of 300, 300 and the tail 200
    assert c.breakdown()["external_fragmentation"] == 0           # nothing waits
    assert not c.can_allocate(400, 400)                            # 800 free, no hole of 400
    bd = c.breakdown(waiting_num_tokens=400)
    assert bd["external_fragmentation"] == 800 and bd["free"] == 0
    bd = c.breakdown(waiting_num_tokens=250)        # the 200 tail is too small, holes of 300 fit
    assert bd["external_fragmentation"] == 200 and bd["free"] == 600
    assert c.snapshot(waiting_num_tokens=250).class_counts() == bd


def test_buddy_external_fragmentation_counts_free_extents_smaller_than_needed():
    c = ContiguousAllocator(1024, "oracle", max_model_len=1024, placement="buddy")
    c.allocate(0, 10, 100)                          # 128 at 0 -> free 128, 256, 512
    assert c.breakdown(waiting_num_tokens=300)["external_fragmentation"] == 28 + 128 + 256
    assert c.breakdown(waiting_num_tokens=600)["external_fragmentation"] == 28 + 896
    assert sum(c.breakdown(waiting_num_tokens=600).values()) == 1024


def test_does_not_fit_returns_false_and_changes_nothing():
    c = ContiguousAllocator(4096, "max", max_model_len=2048, placement="buddy")
    assert c.allocate(0, 10, 20) and c.allocate(1, 10, 20)
    before = c.breakdown()
    assert not c.can_allocate(10, 20)
    assert not c.allocate(2, 10, 20)
    assert c.breakdown() == before and c.seq_ids == [0, 1]
    c.free(0)
    assert c.allocate(2, 10, 20)


def test_bad_arguments_raise_with_the_numbers():
    with pytest.raises(ValueError, match="policy"):
        ContiguousAllocator(4096, "lazy")
    with pytest.raises(ValueError, match="placement"):
        ContiguousAllocator(4096, placement="best-fit")
    c = ContiguousAllocator(1000, "pow2", max_model_len=2048, placement="first-fit")
    with pytest.raises(ValueError, match="reserves 1034 slots .* the pool has 1000"):
        c.allocate(0, 10, 600)                      # 10 + next_pow2(590)
    with pytest.raises(ValueError, match="exceeds max_model_len 2048"):
        c.allocate(0, 10, 3000)
    with pytest.raises(ValueError, match="num_tokens 30 exceeds final_num_tokens 20"):
        c.allocate(0, 30, 20)
    c.allocate(0, 10, 20)
    with pytest.raises(ValueError, match="seq_id 0 is already allocated"):
        c.allocate(0, 10, 20)
    with pytest.raises(ValueError, match="unknown seq_id 4"):
        c.free(4)
    with pytest.raises(ValueError, match="got -1"):
        c.append(0, -1)


def test_pow2_rounds_the_output_not_prompt_plus_output():
    # vLLM paper 6.1: "if the true output length is 25, it reserves 32 positions for outputs"
    c = ContiguousAllocator(4096, "pow2", max_model_len=2048, placement="buddy")
    assert c.reservation_tokens(125, num_prompt_tokens=100) == 132     # 100 + 32
    assert c.extent_tokens(125, num_prompt_tokens=100) == 256          # buddy: 132 -> 256
    oracle = ContiguousAllocator(4096, "oracle", max_model_len=2048, placement="buddy")
    assert oracle.extent_tokens(125) == 128                            # so Pow2 != Oracle
    assert c.allocate(0, 100, 125)                  # num_prompt_tokens defaults to num_tokens
    assert c.breakdown() == {"token_states": 100, "reservation": 25,
                             "internal_fragmentation": 7,              # 132 - 125: output rounding
                             "external_fragmentation": 124,            # 256 - 132: buddy rounding
                             "cached": 0, "free": 4096 - 256}
    assert c.breakdown(125, waiting_num_prompt_tokens=100)["external_fragmentation"] == 124
    c.check_invariants()


def test_pow2_first_chunk_does_not_change_the_reservation():
    c = ContiguousAllocator(4096, "pow2", max_model_len=2048, placement="first-fit")
    assert c.can_allocate(16, 125, num_prompt_tokens=100)
    assert c.allocate(0, 16, 125, num_prompt_tokens=100)   # chunked prefill: 16 of 100 first
    assert c.breakdown()["internal_fragmentation"] == 7 and c.num_free_tokens == 4096 - 132
    assert c.append(0, 84 + 32) and not c.append(0, 1)      # room for 100 + 32, no more
    # a recomputed preempted sequence holds prompt + generated tokens, reserved as before
    assert c.allocate(1, 110, 125, num_prompt_tokens=100)
    assert c.num_free_tokens == 4096 - 2 * 132
    c.check_invariants()


def test_pow2_is_capped_at_max_model_len_and_never_below_final():
    c = ContiguousAllocator(4096, "pow2", max_model_len=200, placement="first-fit")
    assert c.reservation_tokens(190, num_prompt_tokens=100) == 200     # 100 + 128 capped
    assert c.reservation_tokens(200, num_prompt_tokens=72) == 200      # 72 + 128 exactly
    assert c.reservation_tokens(100, num_prompt_tokens=100) == 100     # no output to round
    assert c.reservation_tokens(101, num_prompt_tokens=100) == 101     # output 1 -> 1


def test_num_prompt_tokens_is_validated():
    c = ContiguousAllocator(4096, "pow2", max_model_len=2048, placement="buddy")
    with pytest.raises(ValueError, match="num_prompt_tokens 130 exceeds final_num_tokens 125"):
        c.allocate(0, 100, 125, num_prompt_tokens=130)
    with pytest.raises(ValueError, match="num_prompt_tokens must be an integer >= 1, got 0"):
        c.can_allocate(0, 125, num_prompt_tokens=0)
    with pytest.raises(ValueError, match="num_prompt_tokens must be an integer >= 1, got 2.5"):
        c.extent_tokens(125, num_prompt_tokens=2.5)
    with pytest.raises(ValueError, match="num_prompt_tokens must be an integer >= 1, got 0"):
        c.allocate(0, 0, 125)                       # None means num_tokens, here 0
    assert c.seq_ids == [] and c.num_free_tokens == 4096


def test_string_seq_ids_and_their_snapshot():
    a = ContiguousAllocator(64, policy="max", max_model_len=16)
    assert a.allocate("req-b", 5, 9) and a.allocate("req-a", 3, 7) and a.allocate(2, 4, 8)
    assert a.append("req-a", 2) and a.num_tokens("req-a") == 5
    snap = a.snapshot()
    assert list(snap.block_tables) == [2, "req-b", "req-a"]
    assert snap.owner_ids == (2, "req-b", "req-a")
    for seq_id, cells in snap.block_tables.items():
        assert {snap.owner_id(int(c)) for c in snap.owner[cells]} == {seq_id}
    a.free("req-b")
    with pytest.raises(ValueError, match="unknown seq_id 'req-b'"):
        a.free("req-b")
    a.check_invariants()
