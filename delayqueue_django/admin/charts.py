"""The queue page's charts of the metrics history (Queue.metrics): throughput by outcome and
the lag of what was handed out, over the last hour, day or 14 days, drawn here as inline
SVG (no script, no file from elsewhere), each with a title, a description and a table of
the same figures for readers that do not see the drawing."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from delayqueue_django.core.queue import Metrics

# name -> (how far back, step, label); the page picks one with ?history=<name>.
RANGES = {
    "hour": (timedelta(hours=1), timedelta(minutes=1), "last hour, per minute"),
    "day": (timedelta(days=1), timedelta(minutes=15), "last day, per 15 minutes"),
    "14d": (timedelta(days=14), timedelta(hours=3), "last 14 days, per 3 hours"),
}
DEFAULT_RANGE = "hour"
WIDTH, HEIGHT = 720, 180
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 10, 24


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    dash: str  # a dash pattern too, so that no line is told apart by its colour alone
    values: list[float | None]


# The outcomes, each drawn by its own colour and dash pattern.
OUTCOMES = (
    ("sent", "sent", "#1565c0", "1 0"),
    ("acked", "acked", "#2e7d32", "1 0"),
    ("nacked", "nacked (to be retried)", "#ef6c00", "6 3"),
    ("dead", "dead", "#c62828", "2 2"),
    ("expired", "expired", "#6a1b9a", "8 3 2 3"),
)


def range_of(value: str | None) -> str:
    return value if value in RANGES else DEFAULT_RANGE


def history_context(points: Sequence[Metrics], chosen: str) -> dict[str, Any]:
    """The queue page's "History" section: the range links, both charts with their
    legends, and the steps with anything in them for the table."""
    label = RANGES[chosen][2]
    outcomes, lags = throughput_series(points), lag_series(points)
    return {
        "label": label,
        "ranges": [(name, text, name == chosen) for name, (_, _, text) in RANGES.items()],
        "throughput_chart": svg_chart(
            "dq-history-throughput",
            f"Throughput by outcome, {label}",
            "Messages sent, and deliveries acked, nacked, dead and expired, per step: "
            "the table below has the same figures.",
            points,
            outcomes,
            "",
        ),
        "throughput_legend": legend(outcomes),
        "lag_chart": svg_chart(
            "dq-history-lag",
            f"Lag of what was handed out, {label}",
            "How late after their due time deliveries were handed out, on average and at "
            "most, per step (no line where nothing was handed out).",
            points,
            lags,
            "s",
        ),
        "lag_legend": legend(lags),
        "rows": [
            p for p in points if p.sent or p.acked or p.nacked or p.dead or p.expired or p.handed
        ],
    }


def throughput_series(points: Sequence[Metrics]) -> list[Series]:
    return [
        Series(label, color, dash, [float(getattr(point, name)) for point in points])
        for name, label, color, dash in OUTCOMES
    ]


def lag_series(points: Sequence[Metrics]) -> list[Series]:
    return [
        Series("average lag", "#00838f", "1 0", [_seconds(p.lag_avg_ms) for p in points]),
        Series("largest lag", "#ad1457", "5 3", [_seconds(p.lag_max_ms) for p in points]),
    ]


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def svg_chart(
    chart_id: str, title: str, desc: str, points: Sequence[Metrics], series: list[Series], unit: str
) -> SafeString:
    """One chart: a line per series over the points' steps, the largest value and the first
    and last step's time as labels; a step without a value (no lag: nothing handed out)
    breaks its line."""
    peak = max([v for s in series for v in s.values if v is not None] + [0.0]) or 1.0
    count = max(len(points), 2)
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + inner_w * i / (count - 1)

    def y(value: float) -> float:
        return TOP + inner_h * (1 - value / peak)

    parts = [
        format_html(
            '<svg class="dq-chart" role="img" viewBox="0 0 {} {}"'
            ' aria-labelledby="{}-title {}-desc" xmlns="http://www.w3.org/2000/svg">'
            '<title id="{}-title">{}</title><desc id="{}-desc">{}</desc>',
            WIDTH,
            HEIGHT,
            chart_id,
            chart_id,
            chart_id,
            title,
            chart_id,
            desc,
        ),
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888"/>'
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888"/>',
            LEFT,
            TOP,
            LEFT,
            TOP + inner_h,
            LEFT,
            TOP + inner_h,
            LEFT + inner_w,
            TOP + inner_h,
        ),
        format_html(
            '<text x="{}" y="{}" text-anchor="end" font-size="11">{} {}</text>'
            '<text x="{}" y="{}" text-anchor="end" font-size="11">0</text>',
            LEFT - 4,
            TOP + 10,
            _number(peak),
            unit,
            LEFT - 4,
            TOP + inner_h,
        ),
    ]
    if points:
        parts.append(
            format_html(
                '<text x="{}" y="{}" font-size="11">{}</text>'
                '<text x="{}" y="{}" text-anchor="end" font-size="11">{}</text>',
                LEFT,
                HEIGHT - 6,
                _when(points[0]),
                LEFT + inner_w,
                HEIGHT - 6,
                _when(points[-1]),
            )
        )
    for line in series:
        for run in _runs(line.values):
            coordinates = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            parts.append(
                format_html(
                    '<polyline fill="none" stroke="{}" stroke-width="2" stroke-dasharray="{}"'
                    ' stroke-linecap="round" points="{}"><title>{}</title></polyline>',
                    line.color,
                    line.dash,
                    coordinates,
                    line.label,
                )
            )
    parts.append(mark_safe("</svg>"))
    return mark_safe("".join(parts))


def _runs(values: list[float | None]) -> list[list[tuple[int, float]]]:
    """The stretches of consecutive values that are there; a lone one is drawn as a short
    stroke (a polyline of one point shows nothing)."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, value in enumerate(values):
        if value is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, value))
    if current:
        runs.append(current)
    return [
        run if len(run) > 1 else [(run[0][0], run[0][1]), (run[0][0], run[0][1])] for run in runs
    ]


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.3g}"


def _when(point: Metrics) -> str:
    return point.start.strftime("%Y-%m-%d %H:%M UTC")


def legend(series: list[Series]) -> SafeString:
    """The lines' names beside a sample of each (colour and dash), as a list."""
    items = [
        format_html(
            '<li><svg width="28" height="10" aria-hidden="true"><line x1="0" y1="5" x2="28"'
            ' y2="5" stroke="{}" stroke-width="2" stroke-dasharray="{}"/></svg> {}</li>',
            s.color,
            s.dash,
            s.label,
        )
        for s in series
    ]
    return format_html('<ul class="dq-chart-legend">{}</ul>', mark_safe("".join(items)))
