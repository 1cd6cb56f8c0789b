"""Deleting rows by primary key, as the outbox relay and the pruning of processed records
both do, in SQL that locks no row but those deleted on every supported database."""

from typing import Any


def delete_by_keys(connection: Any, table: str, key: str, count: int) -> str:
    """The DELETE of ``count`` rows of ``table`` (quoted) by their ``key`` (quoted), to run
    with the keys as parameters.

    On MySQL/MariaDB, ``DELETE ... WHERE id IN (...)`` may be planned as a full scan when
    the table's statistics are stale (a young table), FORCE INDEX or not; the scan then waits
    for rows other transactions hold (another relay's batch, a running handler's record),
    and they for it. Joining a derived table of the keys, read first, leaves only lookups
    by key."""
    if connection.vendor != "mysql":
        return f"DELETE FROM {table} WHERE {key} IN ({', '.join(['%s'] * count)})"
    keys = " UNION ALL ".join([f"SELECT %s AS {key}"] + ["SELECT %s"] * (count - 1))
    return (
        f"DELETE {table} FROM ({keys}) AS taken STRAIGHT_JOIN {table} FORCE INDEX (PRIMARY) "
        f"ON {table}.{key} = taken.{key}"
    )
