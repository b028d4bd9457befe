"""Benchmark jupyter_dist against ipyparallel, nbdistributed and torchrun, side by side.

    .venv/bin/python bench/run.py                       # everything (~2-5 min on 2 cores)
    .venv/bin/python bench/run.py --only W1,W3 --peers jupyter_dist,ipyparallel

Prints a markdown table (one row per metric, one column per peer, then the target and
whether jupyter_dist meets it) and writes the full results, samples included, to
bench/results/bench-<time>.json. See bench/README.md for what each workload measures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from drivers import DRIVERS
from drivers.base import Config, Results, keys_of
from noise import ForeignLoad
from workloads import (
    METRICS,
    W1_RUNS,
    W1_WARMUP,
    WORKLOADS,
    ZERO_LOST,
    Metric,
    MetricSpec,
    absolute_target,
    ratio_target,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SUBJECT = "jupyter_dist"
# warn when other processes use more than this much CPU (% of one core) before the run
BUSY_WARN_PERCENT = 20.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--only", default=",".join(WORKLOADS), help="workloads, e.g. W1,W3 (default: all)"
    )
    p.add_argument(
        "--peers", default=",".join(DRIVERS), help=f"peers (default: {','.join(DRIVERS)})"
    )
    p.add_argument("--w1-runs", type=int, default=W1_RUNS, help="timed W1 cells")
    p.add_argument("--w1-warmup", type=int, default=W1_WARMUP, help="untimed W1 cells first")
    defaults = Config(repo_root=REPO_ROOT, log_dir=BENCH_DIR)
    p.add_argument(
        "--cold-repeats", type=int, default=defaults.cold_repeats, help="W2 cold starts per peer"
    )
    p.add_argument(
        "--push-repeats", type=int, default=defaults.push_repeats, help="W3 pushes per peer"
    )
    p.add_argument(
        "--w4-repeats",
        type=int,
        default=defaults.w4_repeats,
        help="W4/W4b/W4w cells per peer (W4w: per phase)",
    )
    p.add_argument(
        "--w5-repeats", type=int, default=defaults.w5_repeats, help="W5 training runs per peer"
    )
    p.add_argument(
        "--out", type=Path, default=BENCH_DIR / "results", help="where JSON and kernel logs go"
    )
    args = p.parse_args(argv)
    args.only = _split(args.only, WORKLOADS, "--only")
    args.peers = _split(args.peers, tuple(DRIVERS), "--peers")
    return args


def _split(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise SystemExit(f"{flag} {','.join(bad)}: expected some of {','.join(allowed)}")
    return items


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "ipykernel", "jupyter_client", "ipyparallel", "nbdistributed", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        from jupyter_dist import _version

        out["jupyter_dist"] = str(getattr(_version, "__version__", "?"))
    except Exception as exc:
        out["jupyter_dist"] = f"import failed: {exc}"
    out["cpus"] = str(os.cpu_count())
    return out


def prime() -> None:
    """Import the heavy modules once so every peer's cold start finds them in page cache."""
    subprocess.run(
        [sys.executable, "-c", "import torch, torch.distributed, numpy, ipykernel, zmq"],
        check=False,
        capture_output=True,
        timeout=300,
    )


# -- the table ------------------------------------------------------------------------------


def fmt_value(m: Metric | None, unit: str) -> str:
    if m is None:
        return "-"
    if m.error is not None:
        return "error: " + _cell_text(m.error, 90)
    if m.na is not None:
        return "n/a"
    if m.value is None or math.isnan(m.value):
        return "-"
    v = m.value
    if unit == "ms":
        return f"{v:.2f} ms"
    if unit == "s":
        return f"{v:.2f} s"
    if unit == "MB/s":
        return f"{v:.0f} MB/s"
    if unit == "steps/s":
        return f"{v:.1f}"
    if unit == "lines":
        return f"{v:.0f}"
    if unit == "cpu_s":
        return f"{v:.3f} s CPU"
    return f"{v:.3g}"


def _cell_text(text: str, limit: int) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _value(results: dict[str, Results], peer: str, key: str) -> float | None:
    m = results.get(peer, {}).get(key)
    if m is None or m.error is not None or m.na is not None or m.value is None:
        return None
    return m.value


def target_cells(spec: MetricSpec, results: dict[str, Results]) -> tuple[str, str]:
    """(target text, verdict text) for one metric row."""
    if spec.key in ZERO_LOST:
        mine = _value(results, SUBJECT, spec.key)
        verdict = "-" if mine is None else ("PASS" if mine == 0 else f"FAIL ({mine:.0f} lost)")
        return "0 lost", verdict
    limit = absolute_target(spec.key)
    if limit is not None:
        bound, at_most = limit
        text = f"{'<=' if at_most else '>='} {bound:g} {spec.unit}"
        mine = _value(results, SUBJECT, spec.key)
        if mine is None:
            return text, "-"
        ok = mine <= bound if at_most else mine >= bound
        return text, "PASS" if ok else "FAIL"
    target = ratio_target(spec.key)
    if target is None:
        return "", ""
    ref_peer, ref_key, factor, at_most = target
    text = f"{'<=' if at_most else '>='} {factor:g}x {ref_peer}" + (
        "" if ref_key == spec.key else f" ({ref_key})"
    )
    mine = _value(results, SUBJECT, spec.key)
    ref = _value(results, ref_peer, ref_key)
    if mine is not None and ref is None and ref_peer == SUBJECT:
        return text, f"- (no {ref_key} in this run)"
    if mine is None or ref is None or ref == 0:
        return text, "-"
    ratio = mine / ref
    ok = ratio <= factor if at_most else ratio >= factor
    return text, f"{'PASS' if ok else 'FAIL'} ({ratio:.2f}x)"


def render(results: dict[str, Results], peers: list[str], workloads: list[str]) -> str:
    header = ["metric", *peers, "target (jupyter_dist)", "verdict"]
    rows = [header, ["---"] * len(header)]
    for spec in METRICS:
        if spec.workload not in workloads:
            continue
        cells = [spec.title]
        cells += [fmt_value(results.get(p, {}).get(spec.key), spec.unit) for p in peers]
        cells += list(target_cells(spec, results)) if SUBJECT in peers else ["", ""]
        rows.append(cells)
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    # one note per (peer, reason), naming every metric it applies to
    grouped: dict[tuple[str, str], list[str]] = {}
    for p in peers:
        for spec in METRICS:
            m = results.get(p, {}).get(spec.key)
            if m is None:
                continue
            if m.na:
                grouped.setdefault((p, f"n/a: {m.na}"), []).append(spec.key)
            elif m.error:
                grouped.setdefault((p, f"error: {_cell_text(m.error, 300)}"), []).append(spec.key)
    notes = [f"- {p} ({', '.join(keys)}): {why}" for (p, why), keys in grouped.items()]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir: Path = args.out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cfg = Config(
        repo_root=REPO_ROOT,
        log_dir=out_dir / "logs" / stamp,
        w1_runs=args.w1_runs,
        w1_warmup=args.w1_warmup,
        cold_repeats=args.cold_repeats,
        push_repeats=args.push_repeats,
        w4_repeats=args.w4_repeats,
        w5_repeats=args.w5_repeats,
    )
    workloads = set(args.only)
    print(f"workloads {','.join(args.only)}; peers {','.join(args.peers)}", flush=True)
    monitor = ForeignLoad().start()
    prime()
    busy_before = monitor.busy_now()
    if busy_before > BUSY_WARN_PERCENT:
        print(
            f"warning: other processes use {busy_before:.0f}% CPU (of one core) right now; "
            "on this machine that makes the numbers noisy",
            flush=True,
        )
    results: dict[str, Results] = {}
    leaks: dict[str, list[str]] = {}
    timings: dict[str, float] = {}
    foreign: dict[str, float | None] = {}
    t_all = time.perf_counter()
    for peer in args.peers:
        t0 = time.perf_counter()
        print(f"== {peer}", flush=True)
        driver = DRIVERS[peer](cfg)
        try:
            results[peer] = driver.run(workloads)
        except Exception as exc:  # a driver bug must not lose the other peers' numbers
            err = f"{type(exc).__name__}: {exc}"
            results[peer] = {k: Metric(error=err) for w in args.only for k in keys_of(w)}
        leaks[peer] = driver.leaks
        timings[peer] = time.perf_counter() - t0
        foreign[peer] = monitor.mean_between(t0, time.perf_counter())
        print(f"== {peer} done in {timings[peer]:.0f}s", flush=True)

    monitor.stop()
    table = render(results, args.peers, args.only)
    busy = ", ".join(f"{p} {v:.0f}%" for p, v in foreign.items() if v is not None)
    table += (
        f"\n\nCPU used by other processes while each peer ran (% of one core): {busy or '-'}; "
        f"{os.cpu_count()} CPUs; {time.perf_counter() - t_all:.0f} s in all."
    )
    print()
    print(table)
    payload: dict[str, Any] = {
        "when": stamp,
        "versions": versions(),
        "config": {
            "workloads": args.only,
            "peers": args.peers,
            "w1_runs": cfg.w1_runs,
            "w1_warmup": cfg.w1_warmup,
            "cold_repeats": cfg.cold_repeats,
            "push_repeats": cfg.push_repeats,
            "w4_repeats": cfg.w4_repeats,
            "w5_repeats": cfg.w5_repeats,
        },
        "foreign_cpu_percent": {"before": busy_before, "per_peer_mean": foreign},
        "results": {p: {k: m.to_json() for k, m in r.items()} for p, r in results.items()},
        "processes_reaped_after_teardown": leaks,
        "seconds_per_peer": timings,
        "seconds_total": time.perf_counter() - t_all,
        "table_markdown": table,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-{stamp}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
