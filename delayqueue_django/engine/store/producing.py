"""A ``RedisStore``'s producer calls: send (plain, keyed, relayed from an outbox), look up,
cancel, reschedule and remove."""

from collections.abc import Sequence

from redis.exceptions import ResponseError

from delayqueue_django.engine.keyed_calls import (
    cancel_key_args,
    cancelled_id,
    duplicate_key,
    keyed_sent,
    reschedule_args,
    rescheduled_due,
    send_keyed_calls,
    wire,
)
from delayqueue_django.engine.outcomes import outcome_arg
from delayqueue_django.engine.records import KeyedSent, NewMessage, StoredMessage
from delayqueue_django.engine.store.base import RedisStoreBase, log_warnings
from delayqueue_django.engine.store.calls import (
    one_send_call,
    relay_calls,
    send_calls,
    send_error,
    sent_alone,
)
from delayqueue_django.engine.store.replies import described, removed_state


class RedisProducing(RedisStoreBase):
    """Writing messages, and changing or removing one that waits."""

    def send(self, messages: Sequence[NewMessage]) -> list[int]:
        """Schedule messages; returns each one's due time in ms (server clock)."""
        alone = sent_alone(messages)
        if alone is not None:
            return [self._send_one(alone)]
        calls = send_calls(self._channel, messages, self.limits.send_batch_size)
        try:
            self.check_server()
            if len(calls) <= 1 or self.is_cluster:
                # A cluster sends chunk by chunk, each straight to the queue's node.
                replies = [self._send_call(args) for args in calls]
            else:
                keys = self._send_keys
                replies = self._lua.pipelined("send", [(keys, args) for args in calls])
            for reply in replies:
                log_warnings(self.keys.queue, reply[-1])
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        return [int(due) for reply in replies for due in reply[:-1]]

    def _send_one(self, message: NewMessage) -> int:
        """One message with no group or expiry (see one_send_call)."""
        self.check_server()
        args = one_send_call(self._channel, message)
        try:
            due, warnings = self._send_call(args)
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        if warnings:
            log_warnings(self.keys.queue, warnings)
        return int(due)

    def relay(
        self, messages: Sequence[NewMessage], *, forget: Sequence[str], keep_ms: int
    ) -> list[int | None]:
        """Write messages relayed from a database outbox, each once however often it comes
        (relay.lua; a keyed one decided by its key as send_keyed decides it); returns each
        one's due time, or None for one not written (relayed before, or kept or held by its
        key). ``forget``: ids whose outbox rows are deleted for good. Every message needs its
        ``at_ms``."""
        calls = relay_calls(self._channel, messages, forget, keep_ms, self.limits.send_batch_size)
        record = [self.keys.key("relayed")]
        try:
            if len(calls) <= 1 or self.is_cluster:
                replies = [self._run("relay", args, extra_keys=record) for args in calls]
            else:
                self.check_server()
                keys = [*self._layout, *record]
                replies = self._lua.pipelined("relay", [(keys, args) for args in calls])
                for reply in replies:
                    log_warnings(self.keys.queue, reply[-1])
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        return [None if int(due) < 0 else int(due) for reply in replies for due in reply[:-1]]

    def send_keyed(self, messages: Sequence[NewMessage]) -> list[KeyedSent]:
        """Schedule keyed messages (send_keyed.lua), one call per SEND_BATCH_SIZE chunk in
        turn, each straight to the queue's node: a chunk refused (DuplicateKey) writes
        nothing, and stops the chunks after it."""
        sent: list[KeyedSent] = []
        for chunk, args in send_keyed_calls(self._channel, messages, self.limits.send_batch_size):
            try:
                reply = self._run("send_keyed", args)
            except ResponseError as error:
                raise duplicate_key(error, chunk) or send_error(error, self.keys.queue) from None
            sent += keyed_sent(reply[:-1])
        return sent

    def lookup(self, key: str) -> StoredMessage | None:
        """The key's message (its waiting one, else the latest sent with it while still
        stored), or None when the key names nothing stored."""
        message_id, *reply = self._run("lookup", [wire(key)])
        return described(message_id, reply) if message_id else None

    def cancel_key(self, key: str) -> str | None:
        """Remove the key's message if it waits; returns its id, or None."""
        args = [*cancel_key_args(key), *outcome_arg(self.limits)]
        return cancelled_id(self._run("remove", args))

    def reschedule(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        at_ms: int | None = None,
        delay_us: int = 0,
    ) -> int | None:
        """Give a waiting message (by id, or the key's) a new due time; returns it, or None
        when nothing waits under that id or key (reschedule.lua)."""
        args = reschedule_args(self._channel, message_id, key, at_ms, delay_us)
        return rescheduled_due(self._run("reschedule", args))

    def remove(
        self,
        message_id: str,
        *,
        include_in_flight_and_dead: bool = False,
        only_from: str | None = None,
    ) -> str | None:
        """Remove a message; returns the state it left, or None if nothing was removed.

        By default only a waiting message (pending, ready, retry) is removed: that is a
        cancel, after which the message is never delivered. With ``only_from``, only a
        message in that state is removed.
        """
        mode = "delete" if include_in_flight_and_dead else "cancel"
        ended = outcome_arg(self.limits)  # ARGV[5], after ARGV[4] (not by key)
        args = [wire(message_id), mode, only_from or "", *(["", *ended] if ended else [])]
        return removed_state(self._run("remove", args))
