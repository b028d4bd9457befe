"""The header of a cell view: one status chip per rank, grouped by node, as HTML.

A chip (a button that shows its rank's view) shows the rank, its state (queued, running,
done, error, dead; interrupted, stuck or timeout for a rank stopped rather than failed of
its own; input or debugging for a rank waiting for the person, `input_state`), its time
on the cell as a bar against the slowest rank (stragglers stand out), and the latest
process sample (CPU, memory, GPU) in its tooltip and under it.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field

STATE_OF_FINISH = {
    "ok": "done",
    "error": "error",
    "died": "dead",
    "timeout": "timeout",
    "interrupted": "interrupted",
    "stuck": "stuck",
    "aborted": "error",
}

# colours from JupyterLab's theme variables (light and dark alike), with fallbacks for
# pages without them (nbconvert's HTML, viewers)
_TINT = "color-mix(in srgb,{} 18%,var(--jp-layout-color1,#fff))"
STYLE = (
    """<style>
.jd-cell-view .jd-node{display:flex;flex-wrap:wrap;align-items:center;gap:4px;margin:2px 0}
.jd-cell-view .jd-node-label{font-size:11px;color:var(--jp-ui-font-color2,#666);min-width:9em}
.jd-cell-view .jd-chip{display:inline-flex;flex-direction:column;min-width:5.5em;padding:2px 6px;
 border-radius:10px;font-size:11px;line-height:1.3;border:1px solid var(--jp-border-color1,#bbb);
 background:var(--jp-layout-color2,#f4f4f4);color:var(--jp-ui-font-color1,#222);
 font-family:inherit;text-align:left;cursor:pointer}
.jd-cell-view .jd-chip:hover{outline:1px solid var(--jp-brand-color1,#5b9bd5)}
.jd-cell-view .jd-chip[data-state=running]{background:RUNNING;
 border-color:var(--jp-brand-color1,#5b9bd5)}
.jd-cell-view .jd-chip[data-state=done]{background:DONE;
 border-color:var(--jp-success-color1,#5cb85c)}
.jd-cell-view .jd-chip[data-state=error]{background:ERROR;
 border-color:var(--jp-error-color1,#d9534f)}
.jd-cell-view .jd-chip:is([data-state=interrupted],[data-state=stuck],[data-state=timeout]){
 background:WARN;border-color:var(--jp-warn-color1,#f0ad4e)}
.jd-cell-view .jd-chip:is([data-state=input],[data-state=debugging]){background:INPUT;
 border-color:var(--jp-accent-color1,#9c27b0);border-width:2px}
.jd-cell-view .jd-chip[data-state=dead]{background:var(--jp-inverse-layout-color3,#3b3b3b);
 border-color:var(--jp-inverse-layout-color1,#000);color:var(--jp-ui-inverse-font-color1,#fff)}
.jd-cell-view .jd-bar{height:3px;background:var(--jp-brand-color1,#5b9bd5);border-radius:2px;
 margin-top:1px}
.jd-cell-view .jd-chip[data-state=error] .jd-bar{background:var(--jp-error-color1,#d9534f)}
.jd-cell-view .jd-proc{font-size:10px;opacity:.75}
.jd-cell-view .jd-footer{font-size:11px;color:var(--jp-ui-font-color2,#666)}
.jp-OutputArea:has(.jd-cell-view) .jp-OutputArea-output pre{word-break:normal;
 overflow-wrap:anywhere}
</style>""".replace("RUNNING", _TINT.format("var(--jp-brand-color1,#5b9bd5)"))
    .replace("DONE", _TINT.format("var(--jp-success-color1,#5cb85c)"))
    .replace("ERROR", _TINT.format("var(--jp-error-color1,#d9534f)"))
    .replace("WARN", _TINT.format("var(--jp-warn-color1,#f0ad4e)"))
    .replace("INPUT", _TINT.format("var(--jp-accent-color1,#9c27b0)"))
)
#: prompts of the debuggers a rank may be in: Python's pdb (also torch's), IPython's
DEBUGGER_PROMPTS = ("(Pdb)", "ipdb>")


def input_state(prompt: str) -> str:
    """A waiting rank's chip state: ``debugging`` at a debugger's prompt, else ``input``."""
    return "debugging" if prompt.strip().endswith(DEBUGGER_PROMPTS) else "input"


def input_line(asking: dict[int, str], running: list[int]) -> str:
    """What the cell waits for while ranks ask (``asking``: rank -> `input_state`):
    ``rank 1 is in the debugger, waiting for you (the prompt below); rank 0 runs on until
    it waits for it``; empty when none asks."""
    from jupyter_dist.text import ranks_label

    if not asking:
        return ""
    debugging = sorted(r for r, state in asking.items() if state == "debugging")
    inputs = sorted(r for r, state in asking.items() if state != "debugging")
    parts = []
    if debugging:
        parts.append(f"{ranks_label(debugging)} in the debugger")
    if inputs:
        parts.append(f"{ranks_label(inputs)} asking for input")
    text = f"{' and '.join(parts)}: the prompt is below, one rank at a time"
    others = sorted(set(running) - set(asking))
    if others:
        them = "it" if len(asking) == 1 else "them"
        goes = "runs on until it waits" if len(others) == 1 else "run on until they wait"
        text += f"; {ranks_label(others)} {goes} for {them}"
    return text


@dataclass
class RankStatus:
    rank: int
    host: str
    node: int
    state: str = "queued"
    started: float | None = None
    elapsed: float | None = None
    process: dict[str, float] = field(default_factory=dict)

    def seconds(self, now: float) -> float:
        if self.elapsed is not None:
            return self.elapsed
        return now - self.started if self.started is not None else 0.0


def chips_html(statuses: list[RankStatus], now: float | None = None) -> str:
    """The header's HTML: chips in rank order, one row per node when there are several."""
    now = time.monotonic() if now is None else now
    slowest = max((s.seconds(now) for s in statuses), default=0.0) or 1.0
    nodes: dict[int, list[RankStatus]] = {}
    index = {s.rank: i for i, s in enumerate(statuses)}  # the rank's place in the selector
    for status in statuses:
        nodes.setdefault(status.node, []).append(status)
    rows = []
    for node, members in sorted(nodes.items()):
        label = (
            f'<span class="jd-node-label">node {node} · {html.escape(members[0].host)}</span>'
            if len(nodes) > 1
            else ""
        )
        chips = "".join(_chip(s, now, slowest, index[s.rank]) for s in members)
        rows.append(f'<div class="jd-node" data-node="{node}">{label}{chips}</div>')
    return STYLE + f'<div role="group" aria-label="ranks">{"".join(rows)}</div>'


# A chip is a button that shows its rank: in the live view it picks the rank in the view
# selector (the same change as clicking the selector, made in the browser, so it answers
# while the cell runs); in a finished cell's snapshot it opens the rank's block. Where a
# sanitizer drops the handler (an untrusted notebook, a viewer) the chip is only a label.
# Keyboard users have the selector itself, which keeps its focus; the chips are redrawn
# every tick and would lose it, so they stay out of the tab order. The chip acts as it is
# pressed (pointerdown), not on click: a click fires only where press and release landed
# on the same element, and a redraw between the two (each tick) would swallow it.
_CHIP_CLICK = (
    "var v=this.closest('.jd-cell-view');if(!v)return;"
    "var d=v.querySelector('details[data-rank=\"RANK\"]');"
    "if(d){d.open=true;d.scrollIntoView({block:'nearest'});return}"
    "var s=v.querySelector('.jd-select select');"
    "if(s){s.selectedIndex=INDEX;s.dispatchEvent(new Event('change'));return}"
    "var b=v.querySelectorAll('.jd-select button')[INDEX];if(b)b.click()"
)


def _chip(status: RankStatus, now: float, slowest: float, index: int) -> str:
    seconds = status.seconds(now)
    width = 100.0 * seconds / slowest
    proc = _process_text(status.process)
    title = f"rank {status.rank} on {status.host}: {status.state}, {seconds:.1f} s"
    if proc:
        title += f"; {proc}"
    click = _CHIP_CLICK.replace("RANK", str(status.rank)).replace("INDEX", str(index))
    return (
        f'<button type="button" tabindex="-1" class="jd-chip" data-rank="{status.rank}" '
        f'data-state="{status.state}" title="{html.escape(title)}" '
        f'aria-label="{html.escape(title)}" onpointerdown="{html.escape(click)}">'
        f"<span>{status.rank} · {status.state} {seconds:.1f}s</span>"
        f'<span class="jd-bar" style="width:{width:.0f}%"></span>'
        + (f'<span class="jd-proc">{html.escape(proc)}</span>' if proc else "")
        + "</button>"
    )


def _process_text(sample: dict[str, float]) -> str:
    parts = []
    if "cpu_percent" in sample:
        parts.append(f"CPU {sample['cpu_percent']:.0f}%")
    if "rss_mb" in sample:
        parts.append(f"{sample['rss_mb']:.0f} MB")
    if "gpu_percent" in sample:
        parts.append(f"GPU {sample['gpu_percent']:.0f}%")
    if "gpu_mem_mb" in sample:
        parts.append(f"{sample['gpu_mem_mb']:.0f} MB GPU")
    return " · ".join(parts)


def cell_summary(statuses: list[RankStatus]) -> str:
    """One line per cell: ``done on ranks 0-1 in 0.31 s (rank 0 0.30 s, rank 1 0.31 s)``;
    failed ranks are named first."""
    from jupyter_dist.text import ranks_label

    if not statuses:
        return "no ranks ran"
    now = time.monotonic()
    by_state: dict[str, list[int]] = {}
    for s in statuses:
        by_state.setdefault(s.state, []).append(s.rank)
    seconds = {s.rank: s.seconds(now) for s in statuses}
    slowest = max(seconds, key=lambda r: seconds[r])
    if len(statuses) <= 8:
        times = ", ".join(f"rank {r} {t:.2f} s" for r, t in sorted(seconds.items()))
    else:
        fastest = min(seconds.values())
        times = f"fastest {fastest:.2f} s, slowest rank {slowest} {seconds[slowest]:.2f} s"
    done = by_state.pop("done", [])
    parts = [f"{state} on {ranks_label(ranks)}" for state, ranks in sorted(by_state.items())]
    if done:
        parts.append(f"done on {ranks_label(done)}")
    spread = f" ({times})" if len(statuses) > 1 else ""
    return f"{'; '.join(parts)} in {seconds[slowest]:.2f} s{spread}"
