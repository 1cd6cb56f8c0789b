"""The databases the outbox and exactly-once tests run on, besides SQLite: PostgreSQL and
MariaDB (or MySQL) servers on this machine, found at settings time.

Each gets a database alias ("postgresql", "mariadb") whose test database pytest-django
creates under a name of this run's own (``delayqueue_test_<pid>``) and drops at the end; no
other database on the server is touched. Where a server or its driver is missing, the alias
is left out and the tests on it are skipped with what to install (``missing``).

The servers are 127.0.0.1:5432 (user postgres, no password) and 127.0.0.1:3306 (user root,
no password) unless DQ_TEST_POSTGRES and DQ_TEST_MARIADB give ``host:port:user[:password]``.
"""

import importlib.util
import os
import socket
from typing import Any

TEST_NAME = f"delayqueue_test_{os.getpid()}"

POSTGRES = os.environ.get("DQ_TEST_POSTGRES", "127.0.0.1:5432:postgres")
MARIADB = os.environ.get("DQ_TEST_MARIADB", "127.0.0.1:3306:root")

INSTALL = {
    "postgresql": "a PostgreSQL server on 127.0.0.1:5432 (Debian: apt-get install postgresql; "
    "or DQ_TEST_POSTGRES=host:port:user[:password]) and the psycopg driver "
    "(pip install -e '.[test]')",
    "mariadb": "a MariaDB or MySQL server on 127.0.0.1:3306 (Debian: apt-get install "
    "mariadb-server; or DQ_TEST_MARIADB=host:port:user[:password]) and the PyMySQL driver "
    "(pip install -e '.[test]')",
}


def _parts(spec: str) -> tuple[str, int, str, str]:
    host, port, user, *password = spec.split(":", 3)
    return host, int(port), user, password[0] if password else ""


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _postgresql() -> dict[str, Any] | None:
    host, port, user, password = _parts(POSTGRES)
    if importlib.util.find_spec("psycopg") is None or not _listening(host, port):
        return None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",  # connected to only to create and drop the test database
        "USER": user,
        "PASSWORD": password,
        "HOST": host,
        "PORT": port,
        "TEST": {"NAME": TEST_NAME, "DEPENDENCIES": []},
    }


def _mariadb() -> dict[str, Any] | None:
    host, port, user, password = _parts(MARIADB)
    if importlib.util.find_spec("pymysql") is None or not _listening(host, port):
        return None
    import pymysql

    # Django's MySQL backend is written for mysqlclient, which needs the client library's
    # headers to build; PyMySQL, pure Python, stands in for it.
    pymysql.install_as_MySQLdb()
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": "mysql",  # connected to only to create and drop the test database
        "USER": user,
        "PASSWORD": password,
        "HOST": host,
        "PORT": port,
        "OPTIONS": {"charset": "utf8mb4"},
        # The server's default collation, which ignores case: the tables must not.
        "TEST": {"NAME": TEST_NAME, "CHARSET": "utf8mb4", "DEPENDENCIES": []},
    }


def server_databases() -> dict[str, dict[str, Any]]:
    """The aliases of the servers found (none, one or both)."""
    found = {"postgresql": _postgresql(), "mariadb": _mariadb()}
    return {alias: settings for alias, settings in found.items() if settings is not None}


def missing(alias: str) -> str:
    """Why the tests on ``alias`` are skipped: what to install."""
    return f"database {alias!r} not available: needs {INSTALL[alias]}"


# The databases every outbox and exactly-once test runs on: SQLite (the tests' default
# database) and the servers found. Used as ``@pytest.mark.parametrize``-style params of the
# ``database`` fixtures (tests/test_outbox.py), each with its django_db mark.
ALIASES = ("default", "postgresql", "mariadb")
NAMES = {"default": "sqlite", "postgresql": "postgresql", "mariadb": "mariadb"}


def database_params(aliases: tuple[str, ...] = ALIASES) -> list[Any]:
    """One pytest param per database of ``aliases``: the alias, marked to have its test
    database set up (transactions commit for real: relays and workers in other threads and
    processes see the rows), or skipped with what to install."""
    import pytest
    from django.conf import settings

    params = []
    for alias in aliases:
        if alias in settings.DATABASES:
            mark = pytest.mark.django_db(transaction=True, databases=[alias])
        else:
            mark = pytest.mark.skip(reason=missing(alias))
        params.append(pytest.param(alias, id=NAMES[alias], marks=mark))
    return params


def subprocess_settings(alias: str) -> dict[str, Any]:
    """The test database ``alias`` as the "default" database of a worker or relay process
    (its settings as pytest-django set them up, the test database's name included)."""
    from django.db import connections

    configured = connections[alias].settings_dict
    keys = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
    return {"default": {key: configured[key] for key in keys if key in configured}}
