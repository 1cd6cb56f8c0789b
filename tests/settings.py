"""Settings for the test suite. Queues point at the private redis-server that conftest
starts; the placeholder URL below is replaced before any test runs."""

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.databases import server_databases

# The example project's shop app is tested as a user would use it (tests/test_example.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "example_project"))

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "delayqueue_django",
    "shop",
    "tests.task_app",
]

# Django 5.2 has the task framework only as the django-tasks backport, an app of its own.
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")
    _TASKS_PACKAGE = "django_tasks"
else:
    _TASKS_PACKAGE = "django.tasks"

# The aliases tests/task_app declares tasks for (@task needs its backend to exist), all the
# framework's default backend; tests/test_tasks.py puts DelayQueueBackends in their place.
TASKS = {
    alias: {"BACKEND": f"{_TASKS_PACKAGE}.backends.immediate.ImmediateBackend", "QUEUES": []}
    for alias in ("default", "second", "elsewhere")
}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

ROOT_URLCONF = "tests.urls"
SHOP_PAY_WINDOW = 1
SHOP_REMINDER_AFTER = 0
STATIC_URL = "static/"

# A file, not SQLite's shared in-memory database: worker threads write while the test runs,
# and only a file database waits for a lock instead of failing at once.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
        "TEST": {
            "NAME": str(Path(tempfile.gettempdir()) / f"delayqueue-tests-{os.getpid()}.sqlite3")
        },
    }
}

# PostgreSQL and MariaDB, where this machine has them, for the outbox and exactly-once tests
# (tests/databases.py): aliases "postgresql" and "mariadb".
DATABASES.update(server_databases())
# No relay in the tests' workers unless a test asks for one: most tests have no database.
DELAYQUEUE_OUTBOX_DATABASES: list[str] = []

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

DELAYQUEUES: dict[str, dict[str, Any]] = {"default": {"URL": "redis://127.0.0.1:1/0"}}

# Tests create many users; the real hashers are slow on purpose.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
