"""UUIDv7 ids made in Python (jobsd.ids.uuid7): version, order, clock, threads.

The database's ids, and both kinds together, are tested in tests/db/test_db_ids.py."""

from __future__ import annotations

import threading
import time
import uuid

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
