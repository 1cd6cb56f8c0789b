"""The queue page's search box: the text typed is looked up both as a key (Queue.lookup) and
as a message id (Queue.message; both find a message that ended by its outcome record, on a
queue with HISTORY_RETENTION), since an operator pasting "order-42" from a log cannot always say
which of the two it is. Reading only: the form is a GET and nothing is changed."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from redis.exceptions import RedisError

from delayqueue_django.admin.display import as_datetime
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import StoredMessage, printable
from delayqueue_django.exceptions import InvalidKey

# The payload is not shown in the results: peek and lookup cut it to nothing in Redis.
NO_PAYLOAD = 0


@dataclass(frozen=True)
class Match:
    """A message the search found, and how (``by`` is "key" or "id")."""

    by: str
    stored: StoredMessage
    # None for an id that cannot travel in a URL (bytes that are not UTF-8: a foreign write).
    url: str | None

    @property
    def shown_id(self) -> str:
        return printable(self.stored.id)

    @property
    def when(self) -> datetime | None:
        """Its due time, deadline or burial; when it ended, for an outcome record."""
        return self.stored.ended_at or as_datetime(self.stored.score_ms)


@dataclass(frozen=True)
class SearchResult:
    text: str
    matches: list[Match]
    # Why the text is no key (too long, a lone surrogate): it was searched as an id only.
    not_a_key: str | None = None
    # Redis could not answer (a shard down): the rest of the page still shows.
    error: str | None = None


def search_messages(queue: Queue, text: str, message_url: Callable[[str], str]) -> SearchResult:
    """The message ``text`` names as a key, and the one it names as an id (once when both are
    the same message)."""
    matches: list[Match] = []
    not_a_key = None
    try:
        try:
            by_key = queue.lookup(text)
        except InvalidKey as error:
            by_key, not_a_key = None, str(error)
        if by_key is not None:
            matches.append(_match("key", by_key, message_url))
        if by_key is None or by_key.id != text:
            by_id = queue.message(text, preview_bytes=NO_PAYLOAD)
            if by_id is not None:
                matches.append(_match("id", by_id, message_url))
    except RedisError as error:
        return SearchResult(text, matches, not_a_key, error=str(error))
    return SearchResult(text, matches, not_a_key)


def _match(by: str, stored: StoredMessage, message_url: Callable[[str], str]) -> Match:
    url = message_url(stored.id) if printable(stored.id) == stored.id else None
    return Match(by, stored, url)
