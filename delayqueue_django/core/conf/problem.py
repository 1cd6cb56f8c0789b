"""What a problem with the ``DELAYQUEUES`` setting is, as a system check and an exception
word it: every check of the setting reports in these terms."""

from dataclasses import dataclass

SETTING = "DELAYQUEUES"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the setting, as a system check and an exception will word it."""

    id: str
    msg: str
    hint: str | None = None
