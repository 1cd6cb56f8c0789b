"""The Redis clock as a worker reckons it between fetches: the server's time, read by each
fetch, against this process's ``time.monotonic()``.

A fetch tells when the server read its clock only to within half its round trip: the
reading lies somewhere between sending and receiving. A round trip held up on this side
(handler threads holding the GIL, a busy machine) makes that window wide, and its middle a
poor guess: taken as it comes, one such fetch would have the worker wake up to tens of
milliseconds late until the next one. So, as NTP clients do, the estimate keeps its most
precise reading, and lets a later one replace it only when the later one is as precise
(the kept one's error counted as growing with its age, for the clocks' drift), or when it
cannot agree with the kept one within both errors: the server's clock stepped, or another
server answers now (a failover).
"""

import math
import time

# How fast the two clocks may drift apart (s per s): 100 ppm, well above what NTP's
# slewing does to either.
DRIFT = 1e-4


class RedisClock:
    def __init__(self) -> None:
        # Redis clock = monotonic clock + offset (ms); how far the offset may be off (ms),
        # as of when it was read (monotonic s).
        self._offset_ms = 0.0
        self._error_ms = math.inf
        self._read_at = 0.0

    def learn(self, server_ms: float, read_at: float, read_within: float) -> None:
        """A fetch read the server's clock at ``server_ms``, at ``read_at`` (monotonic s),
        give or take ``read_within`` s."""
        offset_ms, error_ms = server_ms - read_at * 1000, read_within * 1000
        kept_error_ms = self._error_ms + abs(read_at - self._read_at) * 1000 * DRIFT
        agrees = abs(offset_ms - self._offset_ms) <= error_ms + kept_error_ms
        if error_ms <= kept_error_ms or not agrees:
            self._offset_ms, self._error_ms, self._read_at = offset_ms, error_ms, read_at

    def now_ms(self) -> float:
        """The Redis clock now, by this estimate."""
        return time.monotonic() * 1000 + self._offset_ms

    def monotonic_at(self, server_ms: float) -> float:
        """A time on the Redis clock, on this process's ``time.monotonic()`` clock."""
        return (server_ms - self._offset_ms) / 1000
