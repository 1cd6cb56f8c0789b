"""Worker subprocess settings with a project's LOGGING (DQ_TEST_LOGGING): "root", a console
handler on the root logger; "package", one on the delayqueue_django logger; "" none. Each
handler's lines start with its name, so a test can tell who printed them."""

import os

from tests.worker_settings import *  # noqa: F403


def _console(name: str) -> dict[str, str]:
    return {"class": "logging.StreamHandler", "formatter": name, "stream": "ext://sys.stdout"}


_WHERE = os.environ.get("DQ_TEST_LOGGING", "")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "root": {"format": "ROOT %(levelname)s %(name)s: %(message)s"},
        "package": {"format": "PACKAGE %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {"root": _console("root"), "package": _console("package")},
    "root": {"handlers": ["root"] if _WHERE == "root" else []},
    "loggers": {
        "delayqueue_django": {"handlers": ["package"] if _WHERE == "package" else []},
    },
}
