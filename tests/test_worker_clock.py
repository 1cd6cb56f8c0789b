"""The worker's reckoning of the Redis clock (worker.clock): the most precise reading is
kept, a stepped clock is followed at once."""

import pytest

from delayqueue_django.worker.clock import DRIFT, RedisClock

# A server clock 1,000 s ahead of the monotonic clock: a reading at monotonic t (s) says
# 1,000,000 + t * 1000 ms.
AHEAD_MS = 1_000_000.0


def read(clock: RedisClock, at: float, within: float, *, off_ms: float = 0.0) -> None:
    """A fetch that read the server's clock at monotonic ``at`` as it was (plus ``off_ms``,
    the error of taking the middle of the round trip), give or take ``within`` s."""
    clock.learn(AHEAD_MS + at * 1000 + off_ms, at, within)


def test_a_round_trip_held_up_on_this_side_does_not_replace_a_precise_reading() -> None:
    clock = RedisClock()
    read(clock, 10.0, 0.0002)  # a quick round trip: off by 0.2 ms at most
    # Handler threads held the GIL: a 60 ms round trip whose middle is 25 ms off.
    read(clock, 11.0, 0.030, off_ms=-25.0)
    # Still the precise reading's.
    assert clock.monotonic_at(AHEAD_MS + 20_000) == pytest.approx(20.0, abs=1e-9)


def test_a_reading_as_precise_as_the_kept_one_replaces_it() -> None:
    clock = RedisClock()
    read(clock, 10.0, 0.001)
    read(clock, 11.0, 0.001, off_ms=0.5)  # within both errors, and as precise
    assert clock.monotonic_at(AHEAD_MS + 20_000) == pytest.approx(20.0 - 0.0005, abs=1e-9)


def test_a_kept_reading_counts_as_less_precise_as_it_ages() -> None:
    clock = RedisClock()
    read(clock, 0.0, 0.0001)
    # 0.1 ms then, 0.1 ms + 100 ppm of the time since: after 100 s, 10.1 ms; a 5 ms reading
    # is then the better one.
    assert DRIFT == 1e-4
    read(clock, 100.0, 0.005, off_ms=3.0)
    assert clock.monotonic_at(AHEAD_MS + 200_000) == pytest.approx(200.0 - 0.003, abs=1e-9)


def test_a_server_clock_that_stepped_is_followed_at_once() -> None:
    clock = RedisClock()
    read(clock, 10.0, 0.0001)
    # 40 ms later than before, as no error of either reading explains (an NTP step, or
    # another server after a failover): the reading that disagrees wins, imprecise or not.
    read(clock, 11.0, 0.010, off_ms=40.0)
    assert clock.monotonic_at(AHEAD_MS + 20_040) == pytest.approx(20.0, abs=1e-9)


def test_the_first_reading_is_taken_whatever_its_precision() -> None:
    clock = RedisClock()
    read(clock, 5.0, 2.0, off_ms=100.0)
    assert clock.monotonic_at(AHEAD_MS + 10_100) == pytest.approx(10.0, abs=1e-9)
