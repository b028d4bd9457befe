"""What every peer driver shares.

A driver measures the workloads it can and returns one `Metric` per metric key; a
workload it cannot run is `Metric(na=reason)`, one that failed is `Metric(error=reason)`,
so one broken peer never stops the run. `KernelPeer` is the base of the peers driven from
a real notebook kernel (jupyter_dist, ipyparallel, nbdistributed): one warm session for
W1/W3/W4/W4w/W5, fresh kernels for W2, and teardown (the peer's own, then the reaper) in
`finally`.
"""

from __future__ import annotations

import contextlib
import functools
import re
import statistics
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from notebook_kernel import CellResult, NotebookKernel
from workloads import (
    ALLREDUCE_BODY,
    ALLREDUCE_MARKER,
    CPU_PER_LINES,
    METRICS,
    N_LINES,
    N_RANKS,
    PRINT_BODY,
    PRINT_DISTINCT_BODY,
    PUSH_ARRAY_CODE,
    PUSH_BYTES,
    PUSH_CHECK_BODY,
    PUSH_CHECK_MARKER,
    TRIVIAL_BODY,
    W1_RUNS,
    W1_WARMUP,
    W5_BODY,
    Metric,
    count_lines,
    parse_w5,
    summarize,
)

Results = dict[str, Metric]

CPU_WHAT = (
    "notebook kernel process CPU seconds (user + system, all threads; from its CPU-time "
    "clock, psutil cpu_times in psutil_cpu_times_samples, 10 ms ticks) during the cell "
    f"({{window}}), per {CPU_PER_LINES} of the {N_RANKS * N_LINES} lines printed"
)

# W4w measures jupyter_dist's widget cell view; the other peers have nothing like it
W4W_NA = "jupyter_dist only: W4w measures its widget cell view"


@dataclass(frozen=True)
class Config:
    repo_root: Path
    log_dir: Path
    w1_runs: int = W1_RUNS
    w1_warmup: int = W1_WARMUP
    cold_repeats: int = 3
    push_repeats: int = 5
    w5_repeats: int = 5
    w4_repeats: int = 3
    w4_grace_s: float = 3.0
    cell_timeout_s: float = 180.0


def short_error(exc: BaseException) -> str:
    """One line naming the failure: the exception, and the first line of its message."""
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(exc).__name__}: {first}"[:300]


def w5_metric(runs: list[dict[str, Any]]) -> Metric:
    """Median over runs of the mean steps/s over ranks."""
    values = [float(r["value"]) for r in runs]
    return Metric(
        statistics.median(values),
        "steps/s",
        detail={
            "runs_steps_per_s": values,
            "per_rank": [r["per_rank"] for r in runs],
            "torch_threads": runs[0]["torch_threads"],
        },
    )


def keys_of(workload: str) -> list[str]:
    return [m.key for m in METRICS if m.workload == workload]


def kernel_cpu(nk: NotebookKernel, precise: bool = True) -> float | None:
    """CPU seconds the notebook kernel process used so far, None if it cannot be read."""
    with contextlib.suppress(Exception):
        return nk.cpu_seconds(precise)
    return None


class KernelCpu:
    """The notebook kernel's CPU time over one cell: precise clock and psutil's ticks."""

    def __init__(self, nk: NotebookKernel) -> None:
        self.nk = nk
        self.start = (kernel_cpu(nk), kernel_cpu(nk, precise=False))
        self.end: tuple[float | None, float | None] = (None, None)

    def stop(self) -> KernelCpu:
        self.end = (kernel_cpu(self.nk), kernel_cpu(self.nk, precise=False))
        return self

    def per_10k(self) -> float | None:
        return cpu_per_10k(self.start[0], self.end[0])

    def per_10k_psutil(self) -> float | None:
        return cpu_per_10k(self.start[1], self.end[1])


def cpu_per_10k(before: float | None, after: float | None) -> float | None:
    """Notebook kernel CPU seconds per CPU_PER_LINES printed lines, for one flood cell."""
    if before is None or after is None:
        return None
    return (after - before) / (N_RANKS * N_LINES / CPU_PER_LINES)


class Driver(ABC):
    """One peer: measures the selected workloads and never raises."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.leaks: list[str] = []

    @abstractmethod
    def run(self, workloads: set[str]) -> Results: ...

    def guarded(self, workload: str, fn: Callable[[], Results]) -> Results:
        """Run one workload; any exception becomes an error in each of its metrics."""
        try:
            return fn()
        except Exception as exc:
            detail = {"traceback": traceback.format_exc()[-3000:]}
            err = short_error(exc)
            self.log(f"{workload} failed: {err}")
            return {k: Metric(error=err, detail=detail) for k in keys_of(workload)}

    def log(self, msg: str) -> None:
        line = f"  [{self.name}] {time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.cfg.log_dir / "run.log").open("a") as f:
            f.write(line + "\n")


class KernelPeer(Driver):
    """A peer whose cells run from a real notebook kernel."""

    # matches a rank prefix at the start of an output line; groups `ranks` and `rest`
    line_prefix: ClassVar[re.Pattern[str]]
    # whether the peer has jupyter_dist's widget cell view (W4w)
    cell_view: ClassVar[bool] = False

    # -- what each peer says differently --------------------------------------------------

    @abstractmethod
    def cell(self, body: str) -> str:
        """A notebook cell that runs body on every rank of the warm session."""

    @abstractmethod
    def start_session(self, nk: NotebookKernel) -> None:
        """Bring up 2 ranks with torch.distributed (gloo) initialised in this kernel."""

    @abstractmethod
    def teardown_code(self) -> str:
        """The peer's own way to stop everything it started (run before the reaper)."""

    @abstractmethod
    def cold_start(self, nk: NotebookKernel) -> float:
        """From nothing to the first all_reduce result in the notebook, in seconds."""

    def push_code(self) -> str:
        """A cell sending the notebook's `a` to every rank as `a`."""
        raise NotImplementedError

    def push_na(self) -> str | None:
        return None

    def restart(self, nk: NotebookKernel) -> float | None:
        """`%dist restart`-like: seconds to the first all_reduce after a restart, if any."""
        return None

    def w2_extra_na(self) -> dict[str, str]:
        """Reasons a peer has no measurement for some W2 metrics."""
        return {}

    def kernel_env(self) -> dict[str, str]:
        """Environment the peer's notebook kernels get on top of the runner's."""
        return {}

    def measure_w4w(self, nk: NotebookKernel) -> Results:
        """The widget cell view under W4's flood (peers with `cell_view`)."""
        return {k: Metric(na=W4W_NA) for k in keys_of("W4w")}

    # -- sessions -----------------------------------------------------------------------

    @contextmanager
    def kernel(self, label: str, plain: bool = False) -> Iterator[NotebookKernel]:
        """A started notebook kernel, always shut down and reaped; `plain`: one without the
        peer (its environment, its teardown), as a user's other notebook would be."""
        stamp = time.strftime("%H%M%S")
        nk = NotebookKernel(
            cwd=self.cfg.repo_root,
            log_path=self.cfg.log_dir / f"{self.name}-{label}-{stamp}.log",
            extra_env=None if plain else self.kernel_env(),
        )
        try:
            nk.start()
            yield nk
        finally:
            nk.shutdown(None if plain else self.teardown_code())
            if nk.leaked:
                self.leaks.extend(nk.leaked)
                self.log(f"reaped {len(nk.leaked)} process(es) its teardown left: {nk.leaked}")

    def run(self, workloads: set[str]) -> Results:
        results: Results = {}
        if "W4w" in workloads and not self.cell_view:
            results.update({k: Metric(na=W4W_NA) for k in keys_of("W4w")})
            workloads = workloads - {"W4w"}
        warm: list[str] = [w for w in ("W1", "W3", "W4", "W4w", "W5") if w in workloads]
        if warm:
            results.update(self._run_warm(warm))
        if "W2" in workloads:
            results.update(self.guarded("W2", self.measure_w2))
        return results

    def _run_warm(self, warm: list[str]) -> Results:
        results: Results = {}
        try:
            with self.kernel("warm") as nk:
                t0 = time.perf_counter()
                try:
                    self.start_session(nk)
                except Exception as exc:
                    err = "session start failed: " + short_error(exc)
                    detail = {"traceback": traceback.format_exc()[-3000:]}
                    for w in warm:
                        for k in keys_of(w):
                            results[k] = Metric(error=err, detail=detail)
                    return results
                self.log(f"warm session up in {time.perf_counter() - t0:.1f}s")
                measures: dict[str, Callable[[NotebookKernel], Results]] = {
                    "W1": self.measure_w1,
                    "W3": self.measure_w3,
                    "W4": self.measure_w4,
                    "W4w": self.measure_w4w,
                    "W5": self.measure_w5,
                }
                for w in warm:
                    t1 = time.perf_counter()
                    results.update(self.guarded(w, functools.partial(measures[w], nk)))
                    self.log(f"{w} done in {time.perf_counter() - t1:.1f}s")
        except Exception as exc:
            err = short_error(exc)
            for w in warm:
                for k in keys_of(w):
                    results.setdefault(k, Metric(error=err))
        return results

    # -- workloads ------------------------------------------------------------------------

    def measure_w1(self, nk: NotebookKernel) -> Results:
        code = self.cell(TRIVIAL_BODY)
        timeout = self.cfg.cell_timeout_s
        for _ in range(self.cfg.w1_warmup):
            nk.run(code, timeout=timeout)
        samples = []
        for _ in range(self.cfg.w1_runs):
            samples.append(nk.run(code, timeout=timeout, track=False).elapsed * 1000)
        s = summarize(samples)
        # context: the same cell run locally in the notebook kernel (protocol floor)
        local = [nk.run(TRIVIAL_BODY, track=False).elapsed * 1000 for _ in range(20)]
        detail = {
            "samples_ms": [round(x, 3) for x in samples],
            **s,
            "notebook_local_cell_median_ms": statistics.median(local),
        }
        return {
            "w1.median_ms": Metric(s["median"], "ms", detail=detail),
            "w1.p90_ms": Metric(s["p90"], "ms", detail={"see": "w1.median_ms"}),
        }

    def measure_w2(self) -> Results:
        colds: list[float] = []
        restarts: list[float] = []
        errors: list[str] = []
        restart_errors: list[str] = []
        for i in range(self.cfg.cold_repeats):
            with self.kernel(f"cold{i}") as nk:
                try:
                    colds.append(self.cold_start(nk))
                    self.log(f"W2 cold start {i}: {colds[-1]:.2f}s")
                except Exception as exc:
                    errors.append(short_error(exc))
                    self.log(f"W2 cold start {i} failed: {errors[-1]}")
                    continue
                if i == 0 or not restarts:
                    for j in range(self.cfg.cold_repeats):
                        try:
                            r = self.restart(nk)
                        except Exception as exc:
                            restart_errors.append(short_error(exc))
                            self.log(f"W2 restart {j} failed: {restart_errors[-1]}")
                            break
                        if r is None:
                            break
                        restarts.append(r)
                        self.log(f"W2 restart {j}: {r:.2f}s")
        results: Results = {}
        if colds:
            results["w2.cold_s"] = Metric(
                statistics.median(colds),
                "s",
                detail={"samples_s": colds, "errors": errors, "kernel_start_excluded": True},
            )
        else:
            results["w2.cold_s"] = Metric(error="; ".join(errors) or "no sample")
        if restarts:
            results["w2.restart_s"] = Metric(
                statistics.median(restarts),
                "s",
                detail={"samples_s": restarts, "errors": restart_errors},
            )
        else:
            reason = self.w2_extra_na().get("w2.restart_s")
            if reason:
                results["w2.restart_s"] = Metric(na=reason)
            elif restart_errors:
                results["w2.restart_s"] = Metric(error="; ".join(restart_errors))
            else:
                results["w2.restart_s"] = Metric(error="not measured: the cold start failed")
        return results

    def measure_w3(self, nk: NotebookKernel) -> Results:
        na = self.push_na()
        if na:
            return {"w3.mb_per_s": Metric(na=na)}
        nk.run(PUSH_ARRAY_CODE, timeout=60)
        code = self.push_code()
        samples = []
        for _ in range(self.cfg.push_repeats):
            res = nk.run(code, timeout=self.cfg.cell_timeout_s)
            samples.append(res.elapsed)
        check = nk.run(self.cell(PUSH_CHECK_BODY), timeout=60)
        expected = f"nbytes={PUSH_BYTES} last={float(PUSH_BYTES // 8 - 1)}"
        ok = check.text.count(expected)
        if ok < N_RANKS:
            raise RuntimeError(f"push check: {ok}/{N_RANKS} ranks have `a` whole: {check.tail()}")
        mb = PUSH_BYTES / 1e6
        med = statistics.median(samples)
        return {
            "w3.mb_per_s": Metric(
                mb / med,
                "MB/s",
                detail={
                    "samples_s": samples,
                    "median_s": med,
                    "mb_per_rank": mb,
                    "aggregate_mb_per_s": mb * N_RANKS / med,
                    "cell": code,
                    "marker": PUSH_CHECK_MARKER,
                },
            )
        }

    def measure_w4(self, nk: NotebookKernel) -> Results:
        results = self._print_lines(nk, PRINT_BODY, "w4", distinct=False)
        cpu = results["w4.seconds"].detail.get("cpu_per_10k_samples") or []
        cpu_psutil = results["w4.seconds"].detail.get("cpu_per_10k_psutil_samples")
        if results["w4.seconds"].error is not None:
            results["w4.cpu_per_10k"] = Metric(error=results["w4.seconds"].error)
        elif None in cpu or not cpu:
            results["w4.cpu_per_10k"] = Metric(error="the notebook kernel's CPU time unreadable")
        else:
            results["w4.cpu_per_10k"] = Metric(
                statistics.median(cpu),
                "cpu_s",
                detail={
                    "samples": cpu,
                    "psutil_cpu_times_samples": cpu_psutil,
                    "what": CPU_WHAT.format(window="send to all lines in"),
                },
            )
        results.update(self._print_lines(nk, PRINT_DISTINCT_BODY, "w4b", distinct=True))
        return results

    def _print_lines(self, nk: NotebookKernel, body: str, key: str, distinct: bool) -> Results:
        """Median over `w4_repeats` runs of the time until every line was in."""

        def all_in(res: CellResult) -> bool:
            return count_lines(self.w4_texts(res), self.line_prefix, distinct).lost() == 0

        samples: list[float] = []
        runs: list[dict[str, Any]] = []
        lost: list[int] = []
        cpu: list[float | None] = []
        cpu_psutil: list[float | None] = []
        try:
            for _ in range(self.cfg.w4_repeats):
                clock = KernelCpu(nk)
                res = nk.run(
                    self.cell(body),
                    timeout=self.cfg.cell_timeout_s,
                    done=all_in,
                    grace=self.cfg.w4_grace_s,
                )
                clock.stop()
                cpu.append(clock.per_10k())
                cpu_psutil.append(clock.per_10k_psutil())
                lc = count_lines(self.w4_texts(res), self.line_prefix, distinct=distinct)
                samples.append(max(res.elapsed, res.last_output_at or 0.0))
                lost.append(lc.lost())
                runs.append(
                    {
                        **lc.detail(),
                        "reply_idle_s": res.elapsed,
                        "last_output_s": res.last_output_at,
                        "output_msgs": res.n_output_msgs,
                        "output_msgs_other_parent": res.n_foreign_msgs,
                    }
                )
        except Exception as exc:
            tb = {"traceback": traceback.format_exc()[-3000:], "runs": runs}
            err = short_error(exc)
            return {
                f"{key}.seconds": Metric(error=err, detail=tb),
                f"{key}.lost": Metric(error=err),
            }
        return {
            f"{key}.seconds": Metric(
                statistics.median(samples),
                "s",
                detail={
                    "samples_s": samples,
                    "runs": runs,
                    "cpu_per_10k_samples": cpu,
                    "cpu_per_10k_psutil_samples": cpu_psutil,
                },
            ),
            f"{key}.lost": Metric(
                float(max(lost)), "lines", detail={"lost_per_run": lost, "worst": "reported"}
            ),
        }

    def w4_texts(self, res: CellResult) -> list[str]:
        return [res.stream("stdout"), *res.displays.values(), *res.plain]

    def measure_w5(self, nk: NotebookKernel) -> Results:
        runs = []
        for _ in range(self.cfg.w5_repeats):
            res = nk.run(self.cell(W5_BODY), timeout=self.cfg.cell_timeout_s)
            runs.append(parse_w5(res.text))
        return {"w5.steps_per_s": w5_metric(runs)}

    # -- helpers for cold starts ----------------------------------------------------------

    def allreduce_after(self, nk: NotebookKernel, first: CellResult, cell: str) -> float:
        """Run the all_reduce cell; seconds from `first` being sent to the result showing."""
        res = nk.run(cell, timeout=self.cfg.cell_timeout_s, marker=ALLREDUCE_MARKER)
        if res.marker_at is None:
            raise RuntimeError(f"no all_reduce result in the output: {res.tail()}")
        expected = f"{ALLREDUCE_MARKER}{float(sum(range(1, N_RANKS + 1)))}"
        if expected not in res.text:
            raise RuntimeError(f"wrong all_reduce result, wanted {expected}: {res.tail()}")
        return res.sent_at + res.marker_at - first.sent_at

    @staticmethod
    def allreduce_body() -> str:
        return ALLREDUCE_BODY
