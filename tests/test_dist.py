"""The package as ``make dist`` builds it: an sdist, a wheel built from that sdist, and the
wheel installed elsewhere works, with the data files that are not Python (the Lua scripts,
the admin's templates and static files) inside.

Nothing is published on PyPI yet, so the built wheel is how a project outside this clone
installs the package (the README and the quickstart say so).
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "delayqueue_django"
# The folders of the checkout a build never reads (virtualenvs, caches, outputs).
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", ".tox", "*cache*", "site", "dist", "build", "*.egg-info", ".demo"
)

pytestmark = pytest.mark.timeout(300)


def data_files() -> set[str]:
    """The package's files that are not Python, as paths inside a wheel."""
    kept = {".lua", ".html", ".css", ".js", ".typed"}
    return {
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix in kept
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built as ``make dist`` does, from a copy of the checkout."""
    source = tmp_path_factory.mktemp("source") / "delayqueue-django"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert len(list(out.glob("*.tar.gz"))) == 1, "no sdist"
    (found,) = out.glob("*.whl")
    return found


def test_the_wheel_holds_every_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert data_files() - names == set()
    assert {"delayqueue_django/migrations/0001_initial.py"} <= names


def test_the_installed_wheel_runs_a_queue(
    wheel: Path, tmp_path: Path, redis_server: RedisServer
) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(target), str(wheel)],
        check=True, timeout=120,
    )  # fmt: skip
    # The installed copy, not this checkout: PYTHONPATH puts it first; its dependencies
    # (Django, redis-py) come from this virtualenv.
    program = f"""
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth",
                    "django.contrib.contenttypes", "django.contrib.staticfiles",
                    "delayqueue_django"],
    TEMPLATES=[{{"BACKEND": "django.template.backends.django.DjangoTemplates",
                 "APP_DIRS": True}}],
    STATIC_URL="static/",
    DELAYQUEUES={{"default": {{"URL": {redis_server.url!r}}}}},
)
django.setup()
import delayqueue_django
from django.contrib.staticfiles import finders
from django.template.loader import get_template

assert delayqueue_django.__file__.startswith({str(target)!r}), delayqueue_django.__file__
get_template("admin/delayqueue_django/queue.html")
assert finders.find("delayqueue_django/admin.css")
message_id = delayqueue_django.send({{"hello": "wheel"}})
print(delayqueue_django.get_queue().peek(message_id).payload)
"""
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    ran = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip() == '{"hello":"wheel"}'
