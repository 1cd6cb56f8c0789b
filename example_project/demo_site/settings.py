"""Settings of the example site: SQLite for Django, Redis (REDIS_URL) for the queues."""

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
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
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "demo_site.urls"

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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEMO_DATABASE", str(BASE_DIR.parent / ".demo" / "db.sqlite3")),
    }
}

STATIC_URL = "static/"

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
    }
}

# --8<-- [start:queues]
# The queues share the django-redis cache's connection pool. Both are sent to through the
# transactional outbox (the worker relays it); the order timers' handler runs exactly once.
DELAYQUEUES: dict[str, dict[str, Any]] = {
    "orders": {
        "REDIS": "default",
        "KEY_PREFIX": "delayqueue-demo",
        "HANDLER": "shop.handlers.on_order_message",
        "OUTBOX": True,
        "EXACTLY_ONCE": True,
    },
    "warehouse": {
        "REDIS": "default",
        "KEY_PREFIX": "delayqueue-demo",
        "HANDLER": "shop.handlers.notify_warehouse",
        "OUTBOX": True,
        "RETRY_COUNT": 2,
        "NACK_REDELIVERY_DELAY": [2, 4],
    },
}
# --8<-- [end:queues]

# Seconds an order may stay unpaid, and when the payment reminder goes out.
SHOP_PAY_WINDOW = int(os.environ.get("SHOP_PAY_WINDOW", "30"))
SHOP_REMINDER_AFTER = int(os.environ.get("SHOP_REMINDER_AFTER", "10"))
