"""jupyter_dist: `%load_ext jupyter_dist`, then `%%distributed --procs 2` cells on 2 rank
kernels; `%dist restart`, `%dist push`, `%dist shutdown`.

Its notebook kernels run with `JUPYTER_DIST_OUTPUT=text`, so rank output arrives on the
kernel's stdout stream prefixed `[rank N] ` (or folded `[ranks 0-1] ` when ranks print
the same line), as W1-W5 count it. W4w alone asks for the widget cell view
(`--output widget`) and follows its widgets on IOPub as a frontend does.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from notebook_kernel import NotebookKernel
from other_kernel import OtherKernelProbe, ProbeResult, describe_ms, perf_to_monotonic
from widget_frontend import CellViewWatcher
from workloads import (
    N_LINES,
    N_RANKS,
    OTHER_KERNEL_CELL,
    OTHER_KERNEL_PAUSE_S,
    PRINT_BODY,
    W4W_LAST_LINE,
    Metric,
)

from drivers.base import CPU_WHAT, KernelCpu, KernelPeer, Results, short_error

LOAD = "%load_ext jupyter_dist\n"
FIRST = f"%%distributed --procs {N_RANKS}\n"
WARMUP_BODY = """\
import torch.distributed as dist
print(f"ready {dist.get_rank()}/{dist.get_world_size()}")
"""
TEARDOWN = """\
if "distributed" in get_ipython().magics_manager.magics["cell"]:
    get_ipython().run_line_magic("dist", "shutdown")
"""
TEXT_MODE = {"JUPYTER_DIST_OUTPUT": "text"}

# W4w: the flood cell in widget mode, and what the view kept (read after the cell)
WIDGET_CELL = "%%distributed --output widget\n"
# long enough for the view to go live (a quicker cell shows only its snapshot)
WIDGET_WARMUP_BODY = 'print("cell view warm-up")\nimport time\ntime.sleep(0.5)\n'
# the other kernel's probe runs alone this long before the first flood (its baseline)
PROBE_BASELINE_S = 0.5
VIEW_STATE_MARKER = "W4W_VIEW_STATE "
VIEW_STATE_CELL = f"""\
import json as _bench_json
_bench_view = get_ipython().magics_manager.registry["DistMagics"].last_view.state()
print({VIEW_STATE_MARKER!r} + _bench_json.dumps({{
    "logs": _bench_view["logs"],
    "hidden": _bench_view["hidden"],
    "kept_lines": {{r: len(t.splitlines()) for r, t in _bench_view["lines"].items()}},
    "last_kept": {{r: (t.splitlines() or [""])[-1] for r, t in _bench_view["lines"].items()}},
    "chips": _bench_view["chips"],
    "footer": _bench_view["footer"],
}}))
del _bench_view
"""


class JupyterDistDriver(KernelPeer):
    name = "jupyter_dist"
    description = "jupyter_dist %%distributed --procs 2 (rank ipykernels, gloo)"
    line_prefix: ClassVar[re.Pattern[str]] = re.compile(
        r"^\[ranks? (?P<ranks>[\d,\- ]+)\] ?(?P<rest>.*)$"
    )
    cell_view = True

    def kernel_env(self) -> dict[str, str]:
        return dict(TEXT_MODE)

    def cell(self, body: str) -> str:
        return "%%distributed\n" + body

    def start_session(self, nk: NotebookKernel) -> None:
        nk.run(LOAD, timeout=60)
        res = nk.run(FIRST + WARMUP_BODY, timeout=self.cfg.cell_timeout_s)
        if res.text.count(f"/{N_RANKS}") < 1:
            raise RuntimeError(f"warm-up cell printed no rank greeting: {res.tail()}")

    def teardown_code(self) -> str:
        return TEARDOWN

    def cold_start(self, nk: NotebookKernel) -> float:
        first = nk.run(LOAD, timeout=60)
        return self.allreduce_after(nk, first, FIRST + self.allreduce_body())

    def restart(self, nk: NotebookKernel) -> float | None:
        first = nk.run("%dist restart\n", timeout=self.cfg.cell_timeout_s)
        return self.allreduce_after(nk, first, self.cell(self.allreduce_body()))

    def push_code(self) -> str:
        return "%dist push a\n"

    # -- W4w: the widget cell view under W4's flood --------------------------------------------

    def measure_w4w(self, nk: NotebookKernel) -> Results:
        """Time to each rank's last line drawn, lines in the logs, kernel CPU; then the same
        floods again while another notebook kernel answers `1+1`, for its round trips."""
        log_folders: list[str] = []
        try:
            # untimed: the first widget cell imports ipywidgets and the view's modules
            nk.run(WIDGET_CELL + WIDGET_WARMUP_BODY, timeout=self.cfg.cell_timeout_s)
            log_folders.append(str(self._view_state(nk)["logs"]))
            timed = [self._w4w_flood(nk, log_folders) for _ in range(self.cfg.w4_repeats)]
            results = self._w4w_results(timed)
            try:
                results.update(self._w4w_other_kernel(nk, log_folders))
            except Exception as exc:
                err = short_error(exc)
                self.log(f"W4w other kernel failed: {err}")
                detail = {"traceback": traceback.format_exc()[-3000:]}
                for key in ("w4w.other_kernel_ms", "w4w.other_kernel_median_ms"):
                    results[key] = Metric(error=err, detail=detail)
            return results
        finally:
            _remove_cell_logs(log_folders)

    def _w4w_flood(self, nk: NotebookKernel, log_folders: list[str]) -> dict[str, Any]:
        """One flood cell in widget mode, followed as a frontend; what it showed and cost."""
        want = {f"rank {r}": W4W_LAST_LINE for r in range(N_RANKS)}
        watcher = CellViewWatcher(want)
        clock = KernelCpu(nk)
        res = nk.execute(
            WIDGET_CELL + PRINT_BODY,
            timeout=self.cfg.cell_timeout_s,
            done=lambda _res: watcher.all_seen(),
            grace=self.cfg.w4_grace_s,
            on_iopub=watcher,
        )
        clock.stop()
        res.check()
        view = self._view_state(nk)
        log_folders.append(str(view["logs"]))
        seen = {label: watcher.seen_at(label) for label in want}
        drawn_s = (
            None
            if any(t is None for t in seen.values())
            else max(t for t in seen.values() if t is not None) - res.sent_at
        )
        lost, per_rank_lost = _lost_in_logs(Path(view["logs"]))
        return {
            "drawn_s": drawn_s,
            "sent_at": res.sent_at,
            "end_at": res.sent_at + max(res.elapsed, drawn_s or 0.0),
            "reply_idle_s": res.elapsed,
            "cpu_per_10k": clock.per_10k(),
            "cpu_per_10k_psutil": clock.per_10k_psutil(),
            "lost": lost,
            "lost_per_rank": per_rank_lost,
            "view_state": {k: v for k, v in view.items() if k != "logs"},
            "frontend": watcher.summary(res.sent_at),
            "notebook_stream_chars": len(res.stream("stdout")) + len(res.stream("stderr")),
        }

    def _view_state(self, nk: NotebookKernel) -> dict[str, Any]:
        res = nk.run(VIEW_STATE_CELL, timeout=60)
        for line in res.stream("stdout").splitlines():
            if line.startswith(VIEW_STATE_MARKER):
                state: dict[str, Any] = json.loads(line[len(VIEW_STATE_MARKER) :])
                return state
        raise RuntimeError(f"no cell view state in the output: {res.tail()}")

    def _w4w_results(self, runs: list[dict[str, Any]]) -> Results:
        detail_runs = [{k: v for k, v in r.items() if k not in ("sent_at", "end_at")} for r in runs]
        drawn = [r["drawn_s"] for r in runs]
        results: Results = {}
        if any(d is None for d in drawn):
            missing = [
                label
                for r in runs
                for label, v in r["frontend"]["views"].items()
                if v.get("awaited_line") is not None and v.get("awaited_line_at_s") is None
            ]
            views = ", ".join(sorted(set(missing)))
            results["w4w.seconds"] = Metric(
                error=f"a rank's view never showed its last line ({views})",
                detail={"runs": detail_runs},
            )
        else:
            results["w4w.seconds"] = Metric(
                statistics.median(drawn),
                "s",
                detail={
                    "samples_s": drawn,
                    "what": "execute_request sent -> a comm_msg update of every rank's view, "
                    "or the cell's snapshot (a cell that ended before its view went live), "
                    f"whose outputs end with that rank's last line ({W4W_LAST_LINE!r})",
                    "runs": detail_runs,
                },
            )
        lost = [int(r["lost"]) for r in runs]
        results["w4w.lost"] = Metric(
            float(max(lost)),
            "lines",
            detail={"lost_per_run": lost, "worst": "reported", "from": "rank-N.log files"},
        )
        cpu = [r["cpu_per_10k"] for r in runs]
        if None in cpu:
            results["w4w.cpu_per_10k"] = Metric(error="the notebook kernel's CPU time unreadable")
        else:
            results["w4w.cpu_per_10k"] = Metric(
                statistics.median(cpu),
                "cpu_s",
                detail={
                    "samples": cpu,
                    "psutil_cpu_times_samples": [r["cpu_per_10k_psutil"] for r in runs],
                    "what": CPU_WHAT.format(window="send to every rank's last line drawn"),
                },
            )
        return results

    def _w4w_other_kernel(self, nk: NotebookKernel, log_folders: list[str]) -> Results:
        """The same floods again while a second plain notebook kernel, started before them,
        answers `1+1` over and over; its round trips during the floods."""
        runs: list[dict[str, Any]] = []
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.cfg.log_dir / f"{self.name}-other-kernel-probe.log").open("ab")
        try:
            with (
                self.kernel("other", plain=True) as other,
                OtherKernelProbe(other.connection_file, stderr=log) as probe,
            ):
                time.sleep(PROBE_BASELINE_S)  # round trips with nothing else running first
                for _ in range(self.cfg.w4_repeats):
                    runs.append(self._w4w_flood(nk, log_folders))
                result: ProbeResult = probe.stop()
        finally:
            log.close()
        offset = perf_to_monotonic()
        windows = [(r["sent_at"] + offset, r["end_at"] + offset) for r in runs]
        inside, outside = result.during(windows)
        if not inside:
            raise RuntimeError(f"no `{OTHER_KERNEL_CELL}` round trip fell inside a flood")
        stats = describe_ms(inside)
        detail = {
            "during_floods_ms": stats,
            "between_floods_ms": describe_ms(outside),
            "samples_during_ms": [round(x, 3) for x in inside],
            "probe_errors": result.errors,
            "floods": len(windows),
            "flood_windows_s": [round(b - a, 4) for a, b in windows],
            "other_kernel": "a second notebook kernel (plain ipykernel, jupyter_dist not "
            f"loaded) started before the floods; a separate client process runs "
            f"`{OTHER_KERNEL_CELL}` in it again and again ({OTHER_KERNEL_PAUSE_S * 1000:.0f} ms "
            "apart); a round trip counts when it overlaps a flood (execute_request sent to "
            "every rank's last line drawn, or reply + idle if later)",
            "flood_seconds_with_probe": [r["drawn_s"] for r in runs],
            "flood_cpu_per_10k_with_probe": [r["cpu_per_10k"] for r in runs],
            "flood_lost_with_probe": [r["lost"] for r in runs],
        }
        return {
            "w4w.other_kernel_ms": Metric(float(stats["max"]), "ms", detail=detail),
            "w4w.other_kernel_median_ms": Metric(
                float(stats["median"]), "ms", detail={"see": "w4w.other_kernel_ms"}
            ),
        }


def _lost_in_logs(folder: Path) -> tuple[int, dict[int, int]]:
    """Lines of PRINT_BODY missing from each rank's log (every rank prints 0..N_LINES-1)."""
    per_rank: dict[int, int] = {}
    for rank in range(N_RANKS):
        path = folder / f"rank-{rank}.log"
        counts: Counter[int] = Counter()
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if line.strip().isdigit():
                    counts[int(line)] += 1
        per_rank[rank] = sum(1 for i in range(N_LINES) if counts[i] < 1)
    return sum(per_rank.values()), per_rank


def _remove_cell_logs(folders: list[str]) -> None:
    """Remove the log folders the W4w cells left (cell-N under <root>/<session>/)."""
    for folder in folders:
        path = Path(folder)
        if path.name.startswith("cell-"):
            shutil.rmtree(path, ignore_errors=True)
            for parent in (path.parent, path.parent.parent):
                try:
                    parent.rmdir()  # only when empty
                except OSError:
                    break
