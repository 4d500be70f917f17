"""Tally: the lock-free counter of the decorator's hot path."""

from __future__ import annotations

import threading

from infersight.collectors import Tally


def test_incr_and_add_count_and_reads_do_not() -> None:
    t = Tally()
    for _ in range(5):
        t.incr()
    t.add(1000)
    t.add(0)
    t.add(-3)  # nothing to add
    assert t.value() == 1005
    assert t.value() == 1005  # reading does not count


def test_concurrent_increments_are_not_lost() -> None:
    t = Tally()

    def work() -> None:
        for _ in range(20_000):
            t.incr()
        for _ in range(100):
            t.add(50)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.value() == 4 * (20_000 + 100 * 50)
