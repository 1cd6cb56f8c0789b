"""A ``RedisStore``'s consumer calls: fetch, the verdicts (ack, nack, release, extend), the
exhausted messages' announcements, and the wake-up subscriptions."""

import time
from collections.abc import Collection, Mapping, Sequence

from delayqueue_django.engine.expiry_calls import refusal_args
from delayqueue_django.engine.flow import GATES_OWN, rate_wire
from delayqueue_django.engine.history import AttemptNote
from delayqueue_django.engine.keyed import KEY_MARK, split_keyed
from delayqueue_django.engine.pubsub import RedisWakeups
from delayqueue_django.engine.quick_records import quick
from delayqueue_django.engine.records import Delivery, ExhaustedClaim, FetchResult, NackOutcome
from delayqueue_django.engine.store.base import RedisStoreBase
from delayqueue_django.engine.store.calls import _fetch_tail, _id_rows
from delayqueue_django.engine.store.replies import (
    _id,
    _optional_shown,
    _payload_text,
    _shown,
    _text,
    nack_outcomes,
)

# Deliveries, built without Delivery's frozen __init__ (see quick_records).
_delivery = quick(Delivery)


class RedisConsuming(RedisStoreBase):
    """Handing out due messages and committing what became of them."""

    def fetch(
        self,
        count: int,
        *,
        fetcher: str = "",
        request: str = "",
        gates: str = GATES_OWN,
        leased_from: int | None = None,
        gated: bool = False,
    ) -> FetchResult:
        """Hand out up to ``count`` due messages, leased until now + consume_ms.

        A ``fetcher`` that names each ``request`` can repeat one whose reply it did not get:
        the repeat hands out again what that fetch took (see fetch.lua). ``gates``: how
        the flow gates apply, ``leased_from``: from when the leases run, if not now, and
        ``gated``: whether a reservation bound ``count`` (see engine.flow)."""
        limits = self.limits
        sent_at = time.monotonic()
        reply = self._run(
            "fetch",
            [
                *(self._channel, count, limits.consume_ms, limits.stage_limit, request),
                *(rate_wire(limits.rate_limit), limits.max_in_flight, gates),
                *_fetch_tail(leased_from, gated, limits.history_attempts),
            ],
            extra_keys=[self.keys.key(f"fetch:{fetcher}")],
        )
        # Redis read its clock between sending and receiving: the middle is the best guess.
        received_at = time.monotonic()
        now, next_ms, expired, flat, owed, now_us, tracked, groups, unreserved, capped, _ = reply
        read_at = (sent_at + received_at) / 2
        deadline = (now if leased_from is None else leased_from) + limits.consume_ms
        deliveries = []
        is_tracked = bool(tracked)
        # Six fields a delivery, read in step (one iterator zipped with itself), ids and
        # payloads decoded inline: this runs for every message a worker handles.
        fields = iter(flat)
        for position, (raw_id, raw_payload, attempt, lease, budget, due) in enumerate(
            zip(fields, fields, fields, fields, fields, fields, strict=True)
        ):
            key, generation, group = None, 0, None
            try:
                message_id = raw_id.decode() if type(raw_id) is bytes else raw_id
                payload = raw_payload.decode() if type(raw_payload) is bytes else raw_payload
                unreadable = ""
                if payload[:1] == KEY_MARK:  # (a plain payload pays this test only)
                    key, generation, payload = split_keyed(payload)
                if groups and groups[position]:  # (empty unless the queue has had groups)
                    group = _text(groups[position])
            except UnicodeDecodeError as error:
                message_id, payload = _id(raw_id), _shown(raw_payload)
                unreadable = f"its id or payload is not UTF-8 text ({error})"
            # Positional, in Delivery's field order: keywords cost the hot path more.
            deliveries.append(
                _delivery(
                    message_id,
                    payload,
                    int(attempt),
                    int(lease),
                    int(budget),
                    deadline,
                    int(due),
                    unreadable,
                    key,
                    generation,
                    group,
                    is_tracked,
                )
            )
        return FetchResult(
            now_ms=int(now),
            next_ms=None if next_ms < 0 else int(next_ms),
            expired=int(expired),
            deliveries=deliveries,
            exhaustions_owed=bool(owed),
            now_us=int(now_us),
            read_at=read_at,
            read_within=(received_at - sent_at) / 2,
            unreserved=bool(unreserved),
            capped=bool(capped),
        )

    def _commit_record(self, fetcher: str, request: str) -> list[str]:
        """The extra key of a named ack or nack request: its caller's record (see ack.lua)."""
        return [self.keys.key(f"commit:{fetcher}")] if request else []

    def ack(
        self,
        leases: Sequence[tuple[str, int]],
        *,
        fetcher: str = "",
        request: str = "",
        plain: bool = False,
        untracked: bool = False,
    ) -> set[str]:
        """Forget delivered messages; returns the ids whose lease still held.

        A ``fetcher`` that names each ``request`` can repeat one whose reply it did not get:
        the repeat answers what that request did (see ack.lua). ``plain``: none of them was
        sent with a key (their deliveries say so), so the key index is not looked at;
        ``untracked``: none was handed out while the queue had expiries or postpone counts
        (Delivery.tracked), so those are not looked at."""
        if not leases:
            return set()
        acked, _ = self._run(
            "ack",
            [
                request,
                self.limits.consume_ms,
                len(leases),
                *_id_rows(leases),
                *(["plain"] if plain else []),
                *(["untracked"] if untracked else []),
            ],
            extra_keys=self._commit_record(fetcher, request),
        )
        # (_id inlined: one id a message, every message a worker acks)
        return {
            raw.decode("utf-8", "surrogateescape") if type(raw) is bytes else raw for raw in acked
        }

    def nack(
        self,
        refusals: Sequence[tuple[str, int, int]],
        *,
        fetcher: str = "",
        request: str = "",
        postponed: Collection[str] = (),
        max_postpones: int = 0,
        attempts: Mapping[str, AttemptNote] | None = None,
    ) -> list[NackOutcome]:
        """Refuse deliveries: ``(id, lease, delay_ms)``; delay ``BURY`` buries at once.
        The ids in ``postponed`` are postponed: no attempt counted, and buried once
        postponed more than ``max_postpones`` times (see nack.lua). ``attempts``: each
        refusal's attempt record (see engine.history).

        Returns the outcome of each refusal whose lease still held. A repeated ``request``
        answers what that request did, as for ack.
        """
        if not refusals:
            return []
        refused = {refusal[0] for refusal in refusals}
        flat, _ = self._run(
            "nack",
            [
                *(self._channel, request, self.limits.consume_ms, len(refusals)),
                *_id_rows(refusals),
                *refusal_args(
                    refused, postponed, max_postpones, attempts, self.limits.history_attempts
                ),
            ],
            extra_keys=self._commit_record(fetcher, request),
        )
        return nack_outcomes(flat)

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        """Hand back deliveries that were never started, without using a retry."""
        if not leases:
            return []
        released, _ = self._run("release", [self._channel, len(leases), *_id_rows(leases)])
        return [_id(message_id) for message_id in released]

    def extend(self, leases: Sequence[tuple[str, int]]) -> tuple[int, list[str]]:
        """Push deadlines to now + consume_ms; returns the new deadline and the ids extended."""
        if not leases:
            return 0, []
        deadline, extended, _ = self._run(
            "extend", [self.limits.consume_ms, len(leases), *_id_rows(leases)]
        )
        return int(deadline), [_id(message_id) for message_id in extended]

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """Claim exhausted messages whose announcement is owed (see confirm_exhausted)."""
        flat, _ = self._run("claim_exhausted", [count, claim_ms])
        claims = []
        for i in range(0, len(flat), 6):
            key, payload = None, _payload_text(flat[i + 1])
            if payload is not None:
                key, _, payload = split_keyed(payload)
            claims.append(
                ExhaustedClaim(
                    _id(flat[i]),
                    payload,
                    int(flat[i + 2]),
                    int(flat[i + 3]),
                    key,
                    reason=_shown(flat[i + 4]),
                    group=_optional_shown(flat[i + 5]),
                )
            )
        return claims

    def confirm_exhausted(self, claims: Sequence[tuple[str, int]]) -> int:
        """Record that claimed exhaustions were announced, each only while its claim holds."""
        if not claims:
            return 0
        confirmed, _ = self._run("confirm_exhausted", [len(claims), *_id_rows(claims)])
        return int(confirmed)

    def subscribe_wakeups(self) -> RedisWakeups:
        """Listen on the wake-up channel the scripts publish to."""
        return RedisWakeups(self.client, [self._channel])

    def subscribe_channels(self, channels: Sequence[str]) -> RedisWakeups:
        """Listen on several queues' wake-up channels (a sharded queue's), on this store's
        server: one subscription, one connection."""
        return RedisWakeups(self.client, channels)
