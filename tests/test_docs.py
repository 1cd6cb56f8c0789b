"""The reference pages of the documentation site, checked against the code: every
``DELAYQUEUES`` option, every management command's option, every system check id and every
signal must be documented, so a new one cannot ship undocumented. (``make test`` also
builds the site with ``mkdocs build --strict``: broken links and anchors fail there.)"""

import argparse
import re
from pathlib import Path

import pytest
from django.core.management import BaseCommand, load_command_class
from django.dispatch import Signal

import delayqueue_django
from delayqueue_django import exceptions, signals
from delayqueue_django.core import conf

PACKAGE = Path(delayqueue_django.__file__).parent
REFERENCE = PACKAGE.parent / "docs" / "reference"
COMMANDS = sorted(path.stem for path in (PACKAGE / "management" / "commands").glob("[!_]*.py"))


def section(page: str, heading: str, docs: Path = REFERENCE) -> str:
    """The text under ``heading`` (a whole heading line) of ``page`` (under ``docs``), up to
    the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    lines = (docs / page).read_text().splitlines()
    assert heading in lines, f"{page} has no heading {heading!r}"
    start = lines.index(heading) + 1
    end = next(
        (i for i in range(start, len(lines)) if re.match(rf"#{{1,{len(level)}}} ", lines[i])),
        len(lines),
    )
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("option", list(conf.DEFAULTS))
def test_every_queue_option_has_its_own_entry_in_the_settings_reference(option: str) -> None:
    text = section("settings.md", f"### `{option}`")
    assert len(text.split()) >= 10, f"the entry for {option} says next to nothing"


def own_options(name: str) -> list[str]:
    """The command's options and positional arguments, without those every Django command
    has (--verbosity, --settings, ...)."""
    common = {
        action.dest
        for action in BaseCommand().create_parser("manage.py", "any")._actions
        if action.dest != "help"
    }
    parser = load_command_class("delayqueue_django", name).create_parser("manage.py", name)
    found: list[str] = []
    for action in parser._actions:
        if action.dest in common or isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            found.extend(option for option in action.option_strings if option.startswith("--"))
        else:
            found.append(str(action.metavar or action.dest))
    return found


def test_the_package_has_the_commands_the_reference_describes() -> None:
    assert COMMANDS == [
        "delayqueue_check",
        "delayqueue_pause",
        "delayqueue_relay",
        "delayqueue_shards",
        "delayqueue_stats",
        "run_delayqueue",
    ]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_option_is_in_its_section_of_the_commands_reference(name: str) -> None:
    options = own_options(name)
    assert options, f"{name} has no options of its own: the helper found nothing"
    text = section("commands.md", f"## `{name}`")
    missing = [option for option in options if f"`{option}" not in text]
    assert not missing, f"commands.md, section {name}: undocumented {missing}"


def test_every_system_check_id_is_in_the_checks_reference() -> None:
    source = "\n".join(path.read_text() for path in PACKAGE.rglob("*.py"))
    ids = sorted(set(re.findall(r"delayqueue_django\.[EW]\d{3}", source)))
    assert len(ids) >= 20, ids
    page = (REFERENCE / "checks.md").read_text()
    missing = [check for check in ids if f"| `{check}` |" not in page]
    assert not missing, f"checks.md: undocumented {missing}"


def test_every_signal_is_in_the_signals_reference() -> None:
    names = [name for name, value in vars(signals).items() if isinstance(value, Signal)]
    assert names == ["message_acked", "message_nacked", "message_exhausted", "message_expired"]
    page = (REFERENCE / "signals.md").read_text()
    missing = [name for name in names if f"| `{name}` |" not in page]
    assert not missing, f"signals.md: undocumented {missing}"


def test_every_exception_is_in_the_api_reference() -> None:
    names = [name for name in exceptions.__all__ if isinstance(getattr(exceptions, name), type)]
    assert {"DuplicateKey", "InvalidKey"} <= set(names)
    listed = section("api.md", "## Exceptions")
    missing = [name for name in names if f"        - {name}\n" not in listed + "\n"]
    assert not missing, f"api.md: exceptions not listed {missing}"


def test_the_flow_control_guide_leaves_the_sharded_machinery_to_its_explanation_page() -> None:
    """The guide's section on sharded queues held 76 lines of reservations, settlings and
    copies between shards, in the middle of a user's guide: they are an explanation page
    of their own now, in the site's navigation, and the guide says what a user notices."""
    guides = REFERENCE.parent / "guides"
    text = section("flow-control.md", "## Sharded queues", docs=guides)
    assert len(text.strip().splitlines()) <= 30
    assert "](../explanation/sharded-flow-control.md)" in text
    assert "flow_reserve" not in (guides / "flow-control.md").read_text()
    navigation = (REFERENCE.parent.parent / "mkdocs.yml").read_text()
    assert "explanation/sharded-flow-control.md" in navigation
