"""``%dist status`` as tables: one row per session, then one row per rank of each.

A session's row says who owns it (this kernel, or the Jupyter server), the notebooks
attached to it, how long it has been up, the cells it ran (from every notebook), the cell
it runs now and the cells waiting. A rank's row says where it runs, its state (with how
long it has been busy), its memory and its last error. The same facts go out as an HTML
table (JupyterLab, nbconvert) and as aligned text (a terminal, the text copy).
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_dist.common.payloads import SessionStatus

#: a rank's last error line is cut to this many characters in the table
ERROR_CHARS = 80


def format_duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``, ``2 d 4 h``; ``-`` when unknown."""
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def format_mib(mib: float | None) -> str:
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _notebook_name(entry: Mapping[str, Any]) -> str:
    path = str(entry.get("path") or "")
    return path.rsplit("/", 1)[-1] or f"kernel {str(entry.get('kernel_id', '?'))[:8]}"


def group_summary(session: SessionStatus) -> str:
    """The session's process group as its ranks reported it after their last cells:
    ``gloo``; ``none``; ``none: a cell destroyed it, ...``; or per rank where they differ.
    ``-`` while no rank is up, or from a control plane that does not report it."""
    reported: dict[str, list[int]] = {}
    for r in session["ranks"]:
        extra: Mapping[str, Any] = r
        if r["state"] in ("idle", "busy") and isinstance(extra.get("group"), str):
            reported.setdefault(str(extra["group"]) or "none", []).append(r["rank"])
    if not reported:
        return "-"
    if len(reported) > 1:
        return ", ".join(f"{group} on {_ranks(ranks)}" for group, ranks in sorted(reported.items()))
    (group,) = reported
    spec: Mapping[str, Any] = session.get("spec") or {}
    if group == "none" and spec.get("init_process_group"):
        return "none: a cell destroyed it, the next cell on all ranks makes it again"
    return group


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def session_rows(
    sessions: Sequence[SessionStatus], owner: str, now: float | None = None
) -> list[dict[str, str]]:
    """One dict of column -> text per session."""
    now = time.time() if now is None else now
    rows = []
    for s in sessions:
        extra: Mapping[str, Any] = s  # fields a newer control plane adds, read if there
        started = extra.get("started_at")
        notebooks = extra.get("notebooks") or []
        running = extra.get("running")
        queue = extra.get("queue") or []
        now_running = "-"
        if running:
            since = format_duration(now - float(running.get("started", now)))
            now_running = f"a cell from {_notebook_name(running)} ({since})"
        rows.append(
            {
                "session": s["name"],
                "state": s["state"] + (f": {s['broken_reason']}" if s["broken_reason"] else ""),
                "shape": s["shape"],
                "owner": owner,
                "notebooks": ", ".join(_notebook_name(n) for n in notebooks) or "-",
                "up": format_duration(now - float(started)) if started else "-",
                "cells run": str(s["cells_run"]),
                "running": now_running,
                "waiting": str(len(queue)) if queue else "-",
                "process group": group_summary(s),
            }
        )
    return rows


def rank_rows(
    session: SessionStatus, memory: Mapping[int, float], now: float | None = None
) -> list[dict[str, str]]:
    """One dict of column -> text per rank; ``memory`` is RSS in MiB by rank, where known."""
    now = time.time() if now is None else now
    rows = []
    for r in session["ranks"]:
        extra: Mapping[str, Any] = r
        state = str(r["state"])
        busy_since = extra.get("busy_since")
        if state == "busy" and busy_since:
            state += f" {format_duration(now - float(busy_since))}"
        if r["exit"]:
            state += f" ({r['exit']})"
        error = str(extra.get("last_error") or "")
        if len(error) > ERROR_CHARS:
            error = error[: ERROR_CHARS - 3] + "..."
        rows.append(
            {
                "rank": str(r["rank"]),
                "node": f"{r['node_rank']} · {r['host']}",
                "local rank": str(r["local_rank"]),
                "pid": str(r["pid"] or "-"),
                "state": state,
                "memory": format_mib(memory.get(r["rank"])),
                "last error": error or "-",
            }
        )
    return rows


def text_table(rows: Sequence[Mapping[str, str]], indent: str = "") -> str:
    """Rows as aligned columns under a header line."""
    if not rows:
        return ""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(row[c].ljust(widths[c]) for c in columns).rstrip() for row in rows]
    return "\n".join(indent + line for line in lines)


def html_table(rows: Sequence[Mapping[str, str]], caption: str = "") -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    head = "".join(f'<th scope="col">{html.escape(c)}</th>' for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(row[c])}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (
        '<table class="jd-status-table" style="border-collapse:collapse;font-size:12px;'
        f'text-align:left">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )


def status_bundle(
    sessions: Sequence[SessionStatus],
    owner: str,
    headline: str,
    memory: Mapping[str, Mapping[int, float]],
    now: float | None = None,
) -> dict[str, str]:
    """``%dist status`` as a display bundle: text/plain and text/html. ``memory`` is RSS in
    MiB by session name and rank."""
    if not sessions:
        return {"text/plain": headline, "text/html": f"<p>{html.escape(headline)}</p>"}
    rows = session_rows(sessions, owner, now)
    text = [headline, "", text_table(rows)]
    parts = [f"<p>{html.escape(headline)}</p>", html_table(rows)]
    for s in sessions:
        ranks = rank_rows(s, memory.get(s["name"], {}), now)
        caption = f"session {s['name']!r}: {s['shape']}"
        if s["master"]:
            caption += f", master {s['master']}"
        text += ["", caption, text_table(ranks, "  ")]
        parts.append(html_table(ranks, caption))
    return {"text/plain": "\n".join(text), "text/html": "".join(parts)}
