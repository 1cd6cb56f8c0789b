"""Reading the admin's pages in tests: their URLs, a logged-in superuser, and a message
page's rows as text."""

import html
import re

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

# How the admin shows a time (Redis's clock, UTC).
SHOWN_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def superuser() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def cells(page: str) -> dict[str, str]:
    """The message page's rows, heading -> the text of its cell (tags dropped, unescaped)."""
    rows = re.findall(r"<tr><th>(.*?)</th><td[^>]*>(.*?)</td></tr>", page, re.S)
    return {
        html.unescape(re.sub(r"<[^>]+>", "", head)): " ".join(
            html.unescape(re.sub(r"<[^>]+>", " ", cell)).split()
        )
        for head, cell in rows
    }
