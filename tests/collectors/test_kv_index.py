"""The residency index: copies per hash, salt inheritance, bounds, deletion."""

from __future__ import annotations

import random

from warmscope.collectors.kv.index import ResidencyIndex, bytes_per_block

from tests.collectors.kv_events import B, toks


def put(idx: ResidencyIndex, hashes, parent, blocks, salt=None, ts=1.0):
    sb = idx.read_store(hashes, parent, toks(*blocks), B, salt)
    idx.store(sb, parent, B, ts)
    return sb


def test_second_copy_under_the_same_hash_is_counted():
    idx = ResidencyIndex(max_blocks=16)
    put(idx, [1, 2], None, [10, 20])
    # a prompt of exactly 2 blocks, fully cached: vLLM hits 1 block ((8 - 1) // 4 = 1),
    # recomputes block 2 and stores it again under hash 2 (parent 1)
    put(idx, [2], 1, [20])
    assert idx.copies(2) == 2 and idx.resident_blocks() == 2 and idx.resident_copies() == 3
    idx.remove([2], 2.0)
    assert idx.copies(2) == 1 and idx.removed_at(2) is None  # one copy left: still resident
    idx.remove([2], 3.0)
    assert idx.copies(2) == 0 and idx.removed_at(2) == 3.0
    idx.remove([2], 4.0)  # a removal of a block not resident: counted
    assert idx.faults["removed_unknown"] == 1 and idx.faults["second_copies"] == 1


def test_salt_is_inherited_through_the_parent_chain():
    idx = ResidencyIndex(max_blocks=16)
    put(idx, [1, 2], None, [10, 20], salt="tenant-b")  # the salt rides on block 1 only
    put(idx, [3], 2, [30])                              # a later store: no extra keys
    label = idx.row(1)["salt"]
    assert label.startswith("salt:") and "tenant-b" not in label  # a digest is exported
    assert idx.row(2)["salt"] == idx.row(3)["salt"] == label
    assert idx.row(3)["depth"] == 2 and idx.row(3)["parent"] == 2
    # the same tokens without the salt: another hash, the same content key
    a = idx.read_store([7], None, toks(10), B, None)
    b = idx.read_store([8], None, toks(10), B, "tenant-b")
    assert a.contents == b.contents and a.salt != b.salt
    assert idx.per_salt()[label] == {"stores": 3, "reuses": 0, "evictions": 0, "resident": 3}


def test_unknown_parent_is_counted_and_has_no_position():
    idx = ResidencyIndex(max_blocks=16)
    put(idx, [5], 99, [1])
    assert idx.faults["unknown_parent"] == 1 and idx.row(5)["depth"] == 0xFFFF


def test_hard_bound_with_drop_counts():
    idx = ResidencyIndex(max_blocks=3, max_removed=2)
    put(idx, [1, 2, 3, 4, 5], None, [1, 2, 3, 4, 5])
    assert idx.resident_blocks() == 3 and idx.dropped["resident"] == 2
    idx.remove([1, 2, 3], 5.0)  # three removals into a memory of two: the oldest is forgotten
    assert idx.dropped["removed"] == 1
    assert idx.removed_at(1) is None and idx.removed_at(2) == 5.0 and idx.removed_at(3) == 5.0
    before = idx.nbytes()
    put(idx, list(range(100, 200)), None, list(range(100)))
    assert idx.nbytes() == before and idx.resident_blocks() == 3  # fixed arrays


def test_open_addressing_matches_a_dict_under_churn():
    # a table of 64 rows gets keys that collide (multiples of its capacity) and
    # random removals: backward-shift deletion must keep every key findable
    rnd = random.Random(3)
    idx = ResidencyIndex(max_blocks=64, max_removed=1000)
    cap = idx.main.cap
    model: dict[int, int] = {}
    for step in range(4000):
        if model and rnd.random() < 0.45:
            h = rnd.choice(list(model))
            idx.remove([h], float(step))
            model[h] -= 1
            if not model[h]:
                del model[h]
        elif len(model) < 64:
            h = rnd.randrange(1, 40) * cap + rnd.randrange(3)
            put(idx, [h], None, [h % 7])
            model[h] = model.get(h, 0) + 1
    assert {idx.main.keys[s]: idx.copies(idx.main.keys[s]) for s in idx.main.live()} == model
    assert idx.dropped["resident"] == 0


def test_clear_remembers_every_block_as_removed():
    idx = ResidencyIndex(max_blocks=16)
    put(idx, [1, 2], None, [1, 2])
    idx.clear(9.0)
    assert idx.resident_blocks() == 0 and idx.removed_at(1) == idx.removed_at(2) == 9.0
    assert idx.content_copies(idx.read_store([1], None, toks(1), B, None).contents[0]) == 0


def test_bytes_per_block_within_target():
    assert bytes_per_block(100_000) <= 150


def test_fifo_memory_forgets_the_first_put():
    from warmscope.collectors.kv.index import _Fifo
    f = _Fifo(3)
    for k in (1, 2, 3):
        f.put(k, float(k))
    f.put(4, 4.0)          # full: 1 (the first put) goes
    f.put(2, 20.0)         # present: its value changes, its age does not
    f.put(5, 5.0)          # full: 2 goes (put before 3 and 4)
    assert [f.get(k) for k in (1, 2, 3, 4, 5)] == [None, None, 3.0, 4.0, 5.0]
    assert f.forgotten == 2 and f.t.n == 3
    for k in range(100, 130):  # wraps the ring many times, stays at 3
        f.put(k, 0.0)
    assert f.t.n == 3 and f.forgotten == 32 and f.get(129) == 0.0 and f.get(126) is None
