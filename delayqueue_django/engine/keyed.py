"""How a keyed message's key travels with its payload.

A message sent with a key stores it at the start of its payload body, as
``~<key bytes>~<generation>~<key>`` before the payload text (which may itself start with the
trace mark, see records.split_trace). JSON text and the trace mark never start with "~", so
an unkeyed message's body is stored as it always was and costs nothing to read: the scripts
that hand bodies out (fetch, peek, list, claim_exhausted) pass the prefix along and this module
splits it off. The generation (the store's ms when the message was created or last replaced,
strictly increasing per message) tells one content of a message id from a later one:
EXACTLY_ONCE keeps its records per id and generation.
"""

from delayqueue_django.engine.records import NewMessage

KEY_MARK = "~"
# The longest key, in bytes of UTF-8: keys are stored with every message and in the key index.
KEY_MAX_BYTES = 256


def keyed_body(key: str, generation: int, payload: str) -> str:
    """The stored body of a keyed message (the memory store's twin of send_keyed.lua)."""
    size = len(key.encode("utf-8", "surrogateescape"))
    return f"{KEY_MARK}{size}{KEY_MARK}{generation}{KEY_MARK}{key}{payload}"


def split_keyed(body: str) -> tuple[str | None, int, str]:
    """``(key, generation, payload)`` of a stored body; ``(None, 0, body)`` when unkeyed or
    when the prefix is unreadable (a foreign write: the body is then handed on as it is)."""
    if body[:1] != KEY_MARK:
        return None, 0, body
    length_end = body.find(KEY_MARK, 1)
    generation_end = body.find(KEY_MARK, length_end + 1) if length_end > 0 else -1
    if generation_end < 0:
        return None, 0, body
    length, generation = body[1:length_end], body[length_end + 1 : generation_end]
    if not (
        length.isascii() and length.isdigit() and generation.isascii() and generation.isdigit()
    ):
        return None, 0, body
    rest = body[generation_end + 1 :]
    encoded = rest.encode("utf-8", "surrogateescape")
    size = int(length)
    if size < 1 or size > len(encoded):
        return None, 0, body
    key = encoded[:size].decode("utf-8", "surrogateescape")
    return key, int(generation), encoded[size:].decode("utf-8", "surrogateescape")


def check_relayable(message: NewMessage) -> None:
    """A relayed message (relay.lua) decides its key with keep or replace only: a relay has
    no caller to raise DuplicateKey to, and a send through the outbox refuses "error"."""
    if message.key is not None and message.if_exists == "error":
        raise ValueError(
            f"a relayed message cannot have if_exists='error' (id {message.id!r}): "
            "no caller would learn of the refusal"
        )
