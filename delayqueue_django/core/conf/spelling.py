"""What a misspelt setting or option most likely meant, for the system checks' hints: the
names are compared in capitals without underscores (``RATELIMIT`` and ``rate_limit`` both
mean ``RATE_LIMIT``), and near misses found with difflib."""

import difflib
from collections.abc import Iterable

# How close a name must come to a known one to be taken for its misspelling (difflib's
# ratio): a letter or two off, not another word.
CLOSE_ENOUGH = 0.8


def folded(name: str) -> str:
    """``name`` as the comparison sees it: capitals, no ``_``, ``-`` or spaces."""
    return "".join(character for character in name.upper() if character not in "_- ")


def meant(name: str, known: Iterable[str]) -> str | None:
    """The known name that ``name`` most likely misspells, or None."""
    by_folded = {folded(candidate): candidate for candidate in known}
    guesses = difflib.get_close_matches(folded(name), by_folded, n=1, cutoff=CLOSE_ENOUGH)
    return by_folded[guesses[0]] if guesses else None
