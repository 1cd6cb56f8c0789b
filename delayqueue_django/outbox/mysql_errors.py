"""The MySQL/MariaDB error codes the outbox relay and exactly-once handlers act on."""

from typing import Final

# A transaction chosen as a deadlock's victim: the server rolled the whole of it back.
DEADLOCK: Final = 1213
# A lock wait that timed out: the statement alone is rolled back, or the whole transaction
# with innodb_rollback_on_timeout (off by default).
LOCK_WAIT_TIMEOUT: Final = 1205
# A statement names an index the table does not have (FORCE INDEX before its migration).
KEY_DOES_NOT_EXIST: Final = 1176


def error_code(error: BaseException) -> int | None:
    """The server's error code a database driver's exception carries (PyMySQL and
    mysqlclient put it first in ``args``), or None for any other exception."""
    code = error.args[0] if error.args else None
    return code if isinstance(code, int) else None
