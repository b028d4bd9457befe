"""A finished cell as self-contained HTML: what the notebook keeps once the cell ends.

The live widget view needs the kernel that drew it; a saved notebook reopened, a kernel
restarted, nbconvert, nbviewer and GitHub have none, and show "model not found" where a
widget was. So when a cell ends its view is replaced by this snapshot: the status chips,
the folded all-ranks text (each line with its rank, tracebacks included; open unless a rank
failed), one ``<details>`` block per rank (open on the rank that failed first; on the
rank, for a cell on one rank), each metric as an inline SVG chart, and the summary.
It uses plain HTML that sanitizers keep (``details``, ``pre``, ``svg``); the inline
styles only make it look like the live view where they are allowed.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_dist.display.metrics_charts import COLORS, MANY_RANKS, chart_ticks
from jupyter_dist.display.output_store import ViewOutput
from jupyter_dist.display.output_widgets import output_text
from jupyter_dist.display.rich_text import BAR_CHARS, html_to_text
from jupyter_dist.display.status_chips import RankStatus, chips_html
from jupyter_dist.text import strip_ansi

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: points per line drawn in a snapshot chart (longer series are thinned evenly)
SNAPSHOT_POINTS = 500
WIDTH, HEIGHT = 440, 230
LEFT, RIGHT, TOP, BOTTOM = 50, 15, 24, 34
#: long lines wrap between words, and within one only where a word is wider than the view
_PRE = "margin:0;white-space:pre-wrap;overflow-wrap:anywhere"
_CHARTS = "display:flex;flex-wrap:wrap;gap:8px"
_STDERR = f"{_PRE};background:var(--jp-rendermime-error-background,#fdd)"
Series = Mapping[int, tuple[Sequence[float], Sequence[float]]]


def snapshot_html(
    statuses: Sequence[RankStatus],
    rank_outputs: Mapping[int, ViewOutput],
    all_text: str | None,
    series: Mapping[str, Series],
    footer: str,
    log_hint: Mapping[int, str],
    now: float,
    widgets: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The whole finished view; ``widgets`` are the states of the widget models ranks
    made (comm id -> state), drawn as static HTML where their output was."""
    # the culprit's block is the open one: a rank that died or raised, else one that timed
    # out; ranks only stopped after another failed come last. Else every rank's output, as
    # the live view shows it first
    failed = [s.rank for s in statuses if s.state in ("dead", "error")]
    failed += [s.rank for s in statuses if s.state in ("timeout", "stuck", "interrupted")]
    first = statuses[0].rank if statuses and all_text is None else None
    opened = failed[0] if failed else first
    blocks = []
    if all_text is not None:
        blocks.append(
            f'<details class="jd-snap-all"{" open" if opened is None else ""}>'
            "<summary>all ranks</summary>"
            f'<pre style="{_PRE}">{html.escape(strip_ansi(all_text))}</pre></details>'
        )
    blocks += [
        _rank_block(s, rank_outputs[s.rank], opened, log_hint.get(s.rank, ""), widgets or {})
        for s in statuses
    ]
    charts = "".join(chart_svg(name, per_rank) for name, per_rank in sorted(series.items()))
    return (
        '<div class="jd-cell-view jd-snapshot">'
        f"{chips_html(list(statuses), now)}"
        f'<div class="jd-snap-ranks">{"".join(blocks)}</div>'
        + (f'<div class="jd-snap-charts" style="{_CHARTS}">{charts}</div>' if charts else "")
        + f'<div class="jd-footer">{footer}</div></div>'
    )


def _rank_block(
    status: RankStatus,
    output: ViewOutput,
    opened: int | None,
    log_hint: str,
    widgets: Mapping[str, Mapping[str, Any]],
) -> str:
    parts: list[str] = []
    if output.hidden:
        parts.append(
            f'<pre style="{_PRE};opacity:.7">... {output.hidden} earlier lines hidden; full '
            f"log: {html.escape(log_hint)}</pre>"
        )
    for out in output.as_outputs():
        parts.append(_output_html(out, widgets))
    body = "".join(parts) or f'<pre style="{_PRE};opacity:.7">(no output)</pre>'
    seconds = status.elapsed if status.elapsed is not None else 0.0
    title = f"rank {status.rank} · {status.state} · {seconds:.2f} s · {status.host}"
    return (
        f'<details class="jd-snap-rank" data-rank="{status.rank}" '
        f'data-state="{html.escape(status.state)}"{" open" if status.rank == opened else ""}>'
        f"<summary>{html.escape(title)}</summary>{body}</details>"
    )


def _output_html(out: Mapping[str, Any], widgets: Mapping[str, Mapping[str, Any]]) -> str:
    """One Jupyter output as HTML: a stream as text, an error as its traceback, rich output
    by its best static type, a rank's widget as its last state."""
    kind = out.get("output_type")
    if kind == "stream":
        style = _STDERR if out.get("name") == "stderr" else _PRE
        return f'<pre style="{style}">{html.escape(strip_ansi(str(out.get("text", ""))))}</pre>'
    if kind == "error":
        lines = out.get("traceback") or [f"{out.get('ename')}: {out.get('evalue')}"]
        text = strip_ansi("\n".join(str(line) for line in lines))
        return f'<pre class="jd-snap-error" style="{_STDERR}">{html.escape(text)}</pre>'
    data: Mapping[str, Any] = out.get("data", {})
    view = data.get(WIDGET_VIEW_MIME)
    if isinstance(view, Mapping) and str(view.get("model_id", "")) in widgets:
        drawn = widget_html(str(view["model_id"]), widgets)
        if drawn:
            return f'<div class="jd-snap-widget">{drawn}</div>'

    for kind in ("image/png", "image/jpeg"):
        if kind in data:
            raw = data[kind]
            encoded = raw if isinstance(raw, str) else base64.b64encode(raw).decode()
            return f'<img src="data:{kind};base64,{encoded.strip()}" style="max-width:100%">'
    if "image/svg+xml" in data:
        return str(data["image/svg+xml"])
    if "text/html" in data:
        return f"<div>{data['text/html']}</div>"
    text = data.get("text/plain", "")
    return f'<pre style="{_PRE}">{html.escape(strip_ansi(str(text)))}</pre>'


def widget_html(
    model_id: str, widgets: Mapping[str, Mapping[str, Any]], depth: int = 0
) -> str | None:
    """A widget's last state as static HTML: boxes, progress bars, HTML and labels (what
    ranks show: tqdm's bar is an HBox of HTML, a FloatProgress and HTML); None for other
    kinds, whose text/plain stands in."""
    state = widgets.get(model_id)
    if state is None or depth > 20:
        return None
    model = str(state.get("_model_name", ""))
    description = html.escape(str(state.get("description", "") or ""))
    label = f'<span style="margin-right:6px">{description}</span>' if description else ""
    if model in ("HBoxModel", "VBoxModel", "BoxModel", "GridBoxModel"):
        children = []
        for ref in state.get("children", ()):
            child = widget_html(str(ref).removeprefix("IPY_MODEL_"), widgets, depth + 1)
            if child is not None:
                children.append(child)
        direction = "column" if model == "VBoxModel" else "row"
        return (
            f'<div style="display:flex;flex-direction:{direction};align-items:center;gap:6px">'
            f"{''.join(children)}</div>"
        )
    if model in ("IntProgressModel", "FloatProgressModel"):
        value, low, high = (float(state.get(k, 0) or 0) for k in ("value", "min", "max"))
        return (
            f'<span style="display:inline-flex;align-items:center">{label}'
            f'<progress value="{value - low:g}" max="{max(high - low, 0):g}" '
            f'style="width:240px"></progress></span>'
        )
    if model in ("HTMLModel", "HTMLMathModel"):
        return f"<span>{label}{state.get('value', '')}</span>"
    if model == "LabelModel":
        return f"<span>{label}{html.escape(str(state.get('value', '')))}</span>"
    if model == "OutputModel":  # what the rank showed in it (rich's live display)
        outputs = [o for o in state.get("outputs", ()) if isinstance(o, Mapping)]
        return "".join(_output_html(o, widgets) for o in outputs)
    return None


def widget_text(
    model_id: str, widgets: Mapping[str, Mapping[str, Any]], depth: int = 0
) -> str | None:
    """A widget's last state as text, for the text a finished cell keeps (tqdm's bar as
    ``epoch: 100% [####################] 3/3 [...]``); None for kinds `widget_html`
    does not draw either."""
    state = widgets.get(model_id)
    if state is None or depth > 20:
        return None
    model = str(state.get("_model_name", ""))
    description = str(state.get("description", "") or "")
    parts: list[str] = [description] if description else []
    if model in ("HBoxModel", "VBoxModel", "BoxModel", "GridBoxModel"):
        for ref in state.get("children", ()):
            child = widget_text(str(ref).removeprefix("IPY_MODEL_"), widgets, depth + 1)
            if child:
                parts.append(child)
        return ("\n" if model == "VBoxModel" else " ").join(parts)
    if model in ("IntProgressModel", "FloatProgressModel"):
        value, low, high = (float(state.get(k, 0) or 0) for k in ("value", "min", "max"))
        done = (
            round(BAR_CHARS * min(max((value - low) / (high - low), 0.0), 1.0)) if high > low else 0
        )
        return " ".join([*parts, f"[{'#' * done}{'-' * (BAR_CHARS - done)}]"])
    if model in ("HTMLModel", "HTMLMathModel"):
        return " ".join([*parts, html_to_text(str(state.get("value", ""))).strip()]).strip()
    if model == "LabelModel":
        return " ".join([*parts, str(state.get("value", ""))]).strip()
    if model == "OutputModel":
        outputs = [o for o in state.get("outputs", ()) if isinstance(o, dict)]
        return "\n".join(output_text(o).rstrip("\n") for o in outputs)
    return None


def chart_svg(name: str, per_rank: Series) -> str:
    """One metric as an inline SVG line chart: a line per rank (mean and min-max band for
    many ranks), round ticks, a legend under the plot."""
    lines = {r: (list(xs), list(ys)) for r, (xs, ys) in sorted(per_rank.items()) if xs}
    if not lines:
        return ""
    ticks = chart_ticks([xs for xs, _ in lines.values()], [ys for _, ys in lines.values()])
    if ticks is None:
        return ""
    x_ticks, y_ticks = ticks
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts = [
        f'<text x="{WIDTH / 2}" y="15" text-anchor="middle" font-size="13">'
        f"{html.escape(name)}</text>"
    ]
    for t in x_ticks:
        parts.append(
            f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{TOP}" y2="{TOP + plot_h}" '
            'stroke="#8884" stroke-width="0.5"/>'
            f'<text x="{px(t):.1f}" y="{TOP + plot_h + 13}" text-anchor="middle" '
            f'font-size="10">{t:.4g}</text>'
        )
    for t in y_ticks:
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{py(t):.1f}" y2="{py(t):.1f}" '
            'stroke="#8884" stroke-width="0.5"/>'
            f'<text x="{LEFT - 4}" y="{py(t) + 3:.1f}" text-anchor="end" '
            f'font-size="10">{t:.4g}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle" '
        'font-size="11">step</text>'
    )
    keys: list[tuple[str, str]] = []
    if len(lines) > MANY_RANKS:
        by_step: dict[float, list[float]] = {}
        for xs, ys in lines.values():
            for x, y in zip(xs, ys, strict=True):
                by_step.setdefault(x, []).append(y)
        steps = _thin(sorted(by_step))
        low = [(px(s), py(min(by_step[s]))) for s in steps]
        high = [(px(s), py(max(by_step[s]))) for s in reversed(steps)]
        mean = [(px(s), py(sum(by_step[s]) / len(by_step[s]))) for s in steps]
        parts.append(f'<polygon points="{_points(low + high)}" fill="{COLORS[0]}" opacity="0.2"/>')
        parts.append(_polyline(mean, COLORS[0], "mean"))
        keys = [("mean", COLORS[0]), ("min-max", COLORS[0] + "55")]
    else:
        for i, (rank, (xs, ys)) in enumerate(lines.items()):
            color = COLORS[i % len(COLORS)]
            kept = _thin(list(range(len(xs))))
            points = [(px(xs[k]), py(ys[k])) for k in kept if math.isfinite(ys[k])]
            parts.append(_polyline(points, color, f"rank {rank}"))
            keys.append((f"rank {rank}", color))
    legend = "".join(
        f'<span style="display:inline-flex;align-items:center;gap:4px;margin-right:12px;'
        f'font-size:11px"><span style="display:inline-block;width:16px;height:3px;'
        f'background:{c}"></span>{html.escape(label)}</span>'
        for label, c in keys
    )
    return (
        f'<div class="jd-snap-chart" data-metric="{html.escape(name)}">'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" fill="currentColor" '
        f'role="img" aria-label="{html.escape(name)} by step">{"".join(parts)}</svg>'
        f'<div style="margin-left:{LEFT}px">{legend}</div></div>'
    )


def _thin(values: list[Any]) -> list[Any]:
    if len(values) <= SNAPSHOT_POINTS:
        return values
    step = -(-len(values) // SNAPSHOT_POINTS)
    return values[::step] + ([values[-1]] if (len(values) - 1) % step else [])


def _points(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _polyline(points: Sequence[tuple[float, float]], color: str, label: str) -> str:
    return (
        f'<polyline class="jd-snap-line" data-label="{html.escape(label)}" '
        f'points="{_points(points)}" fill="none" stroke="{color}" stroke-width="1.5"/>'
    )
