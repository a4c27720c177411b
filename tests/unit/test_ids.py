"""UUIDv7 ids made in Python (jobsd.ids.uuid7): version, order, clock, threads.

The database's ids, and both kinds together, are tested in tests/db/test_db_ids.py."""

from __future__ import annotations

import os
import pickle
import threading
import time
import uuid

import pytest
from support.ids import assert_v7, unix_ms

from jobsd.ids import uuid7


def test_python_ids_are_v7_strictly_increasing_and_carry_the_clock() -> None:
    before_ms = time.time_ns() // 1_000_000
    ids = [uuid7() for _ in range(20_000)]
    after_ms = time.time_ns() // 1_000_000

    assert_v7(ids)
    assert len(set(ids)) == len(ids)
    # many ids per millisecond, still in creation order
    assert ids == sorted(ids)
    assert before_ms <= unix_ms(ids[0]) <= unix_ms(ids[-1]) <= after_ms + 1


def test_python_ids_stay_increasing_across_threads() -> None:
    per_thread: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def make(out: list[uuid.UUID]) -> None:
        out.extend(uuid7() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    everything = [u for out in per_thread for u in out]
    assert len(set(everything)) == len(everything)
    for out in per_thread:
        assert out == sorted(out)


def test_python_ids_are_ordinary_uuids() -> None:
    # built without UUID.__init__: the same value, hash, text, pickle as one made by it
    made = uuid7()
    plain = uuid.UUID(int=made.int)

    assert made == plain and hash(made) == hash(plain) and str(made) == str(plain)
    assert made.is_safe is uuid.SafeUUID.unknown
    assert pickle.loads(pickle.dumps(made)) == made
    assert uuid.UUID(str(made)) == made


def test_python_ids_random_parts_differ_across_refills() -> None:
    # random bits are drawn ahead in batches: ids spanning several refills all differ
    # in their random 62 bits, not only in their (advanced) timestamps
    ids = [uuid7() for _ in range(5 * 512 + 3)]

    randoms = [u.int & ((1 << 62) - 1) for u in ids]
    assert len(set(randoms)) == len(randoms)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_reuse_the_parents_random_bits() -> None:
    uuid7()  # values are now drawn ahead in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, uuid7().bytes)
        os._exit(0)
    os.close(write)
    child = uuid.UUID(bytes=os.read(read, 16))
    os.close(read)
    os.waitpid(pid, 0)
    parent = uuid7()

    assert_v7([child, parent])
    assert child.int & ((1 << 62) - 1) != parent.int & ((1 << 62) - 1)


def test_a_batch_of_ids_increases_and_follows_every_id_made_before() -> None:
    from jobsd.ids import uuid7, uuid7_ints, uuid_of_int

    before = uuid7()
    batch = [uuid_of_int(i) for i in uuid7_ints(1000)]
    after = uuid7()
    assert batch == sorted(batch) and len(set(batch)) == 1000
    assert before < batch[0] and batch[-1] < after
    assert {u.version for u in batch} == {7} and {u.variant for u in batch} == {uuid.RFC_4122}
    assert uuid7_ints(0) == []
