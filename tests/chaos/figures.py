"""The chaos suite's figures: its pytest options, and the table printed at the end of a run
(and written as JSON with ``--chaos-report``)."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

FIGURES = pytest.StashKey[list["Figures"]]()


@dataclass(frozen=True)
class Figures:
    scenario: str
    messages: int  # acknowledged by send
    lost: int
    duplicates: int
    # The longest end-to-end recovery after a fault, in seconds (see each scenario).
    recovery_s: float | None
    note: str = ""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "fault scenarios (tests/chaos)")
    group.addoption(
        "--chaos-messages",
        type=int,
        default=3000,
        help="messages in the crash soak (default: 3000; make chaos: 100000)",
    )
    group.addoption(
        "--chaos-rounds",
        type=int,
        default=1,
        help="faults injected per scenario (default: 1; make chaos: 5)",
    )
    group.addoption(
        "--chaos-schedule-seconds",
        type=int,
        default=8,
        help="how long the 1-second schedule runs under kill -9 (default: 8; make chaos: 300)",
    )
    group.addoption(
        "--chaos-all-databases",
        action="store_true",
        help="run every outbox fault scenario on every database found (default: each on "
        "the one it names; make chaos: all)",
    )
    group.addoption("--chaos-report", metavar="PATH", help="also write the figures as JSON")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[FIGURES] = []


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    figures = config.stash.get(FIGURES, [])
    if not figures:
        return
    terminalreporter.section("chaos figures")
    for line in table(figures):
        terminalreporter.write_line(line)
    path = config.getoption("chaos_report")
    if path:
        Path(path).write_text(json.dumps([asdict(f) for f in figures], indent=2) + "\n")


def table(figures: list[Figures]) -> list[str]:
    """A Markdown table, ready for the docs' Reliability page."""
    lines = [
        "| scenario | messages | lost | duplicates | recovery | note |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for f in figures:
        recovery = "-" if f.recovery_s is None else f"{f.recovery_s:.2f} s"
        lines.append(
            f"| {f.scenario} | {f.messages} | {f.lost} | {f.duplicates} | {recovery} | {f.note} |"
        )
    return lines
