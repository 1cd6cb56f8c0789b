"""The Markdown table: one row per figure, the median of its runs and their spread."""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value below which ``fraction`` of the values lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * fraction), len(ordered) - 1)]


@dataclass(frozen=True)
class Row:
    measure: str
    runs: Sequence[float]
    unit: str
    target: str = ""
    digits: int = 0

    def result(self) -> str:
        median = self._number(statistics.median(self.runs))
        if len(self.runs) == 1:
            return f"{median} {self.unit}".rstrip()
        low, high = self._number(min(self.runs)), self._number(max(self.runs))
        return f"{median} {self.unit} ({low} to {high}, {len(self.runs)} runs)".replace("  ", " ")

    def _number(self, value: float) -> str:
        return f"{value:,.{self.digits}f}"


def table(rows: Sequence[Row]) -> str:
    lines = ["| measure | median (min-max over runs) | target |", "| --- | --- | --- |"]
    lines += [f"| {row.measure} | {row.result()} | {row.target} |" for row in rows]
    return "\n".join(lines)
