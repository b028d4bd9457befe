"""The workloads, their metrics and targets, and the code every peer runs on its ranks.

The same cell bodies run under every peer, so the numbers differ only by how each peer
gets code to its ranks and output back. Bodies use `dist.get_rank()` rather than any
peer-specific name for the rank.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

N_RANKS = 2
W1_RUNS = 50
W1_WARMUP = 5
PUSH_BYTES = 100 * 10**6  # 100 MB
N_LINES = 10_000
W5_WARMUP = 20
W5_STEPS = 200

WORKLOADS = ("W1", "W2", "W3", "W4", "W4w", "W5")

#: a flood costs the notebook kernel this much CPU per so many printed lines (cpu_per_10k)
CPU_PER_LINES = 10_000
#: W4w: the last line each rank prints in PRINT_BODY
W4W_LAST_LINE = str(N_LINES - 1)
#: W4w: what the other notebook kernel runs again and again during the flood
OTHER_KERNEL_CELL = "1+1"
#: W4w: seconds between two of those cells (so the probe itself stays light)
OTHER_KERNEL_PAUSE_S = 0.01

ALLREDUCE_MARKER = "allreduce="
ALLREDUCE_BODY = """\
import torch
import torch.distributed as dist
_t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(_t)
print(f"allreduce={_t.item()}")
"""

PRINT_BODY = f"for i in range({N_LINES}):\n    print(i)\n"
# the same, but each rank prints different numbers (rank r prints r * DISTINCT_STRIDE + i),
# so no peer can fold identical lines of different ranks into one
DISTINCT_STRIDE = 1_000_000
PRINT_DISTINCT_BODY = f"""\
import torch.distributed as dist
_base = dist.get_rank() * {DISTINCT_STRIDE}
for i in range({N_LINES}):
    print(_base + i)
"""

TRIVIAL_BODY = "x = 1\n"

# a cell run on the ranks after a push: proves the array arrived whole
PUSH_CHECK_MARKER = "pushcheck"
PUSH_CHECK_BODY = """\
import torch.distributed as dist
print(f"pushcheck rank={dist.get_rank()} nbytes={a.nbytes} last={float(a[-1])}")
"""
# the notebook-side array: float64, PUSH_BYTES bytes
PUSH_ARRAY_CODE = f"import numpy as np\na = np.arange({PUSH_BYTES // 8}, dtype=np.float64)\n"

W5_MARKER = "w5 rank="
W5_BODY = f"""\
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _DDP

torch.manual_seed(0)
_net = torch.nn.Sequential(
    torch.nn.Linear(256, 256), torch.nn.ReLU(),
    torch.nn.Linear(256, 256), torch.nn.ReLU(),
    torch.nn.Linear(256, 10),
)
_model = _DDP(_net)
_opt = torch.optim.SGD(_model.parameters(), lr=0.01)
_gen = torch.Generator().manual_seed(dist.get_rank())
_xb = torch.randn(64, 256, generator=_gen)
_yb = torch.randint(0, 10, (64,), generator=_gen)
_loss_fn = torch.nn.CrossEntropyLoss()


def _train_step():
    _opt.zero_grad(set_to_none=True)
    _loss_fn(_model(_xb), _yb).backward()
    _opt.step()


for _ in range({W5_WARMUP}):
    _train_step()
dist.barrier()
_t0 = time.perf_counter()
for _ in range({W5_STEPS}):
    _train_step()
dist.barrier()
_dt = time.perf_counter() - _t0
print(
    f"w5 rank={{dist.get_rank()}} steps_per_s={{{W5_STEPS} / _dt:.3f}} "
    f"threads={{torch.get_num_threads()}}"
)
"""

_W5_RE = re.compile(r"w5 rank=(\d+) steps_per_s=([\d.]+) threads=(\d+)")


@dataclass
class Metric:
    """One number in the table, or why there is none."""

    value: float | None = None
    unit: str = ""
    error: str | None = None
    na: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "unit": self.unit,
            "error": self.error,
            "na": self.na,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class MetricSpec:
    key: str
    workload: str
    title: str
    unit: str
    higher_is_better: bool


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("w1.median_ms", "W1", "W1 warm `x = 1` round trip, median", "ms", False),
    MetricSpec("w1.p90_ms", "W1", "W1 warm `x = 1` round trip, p90", "ms", False),
    MetricSpec("w2.cold_s", "W2", "W2 cold start to first all_reduce", "s", False),
    MetricSpec("w2.restart_s", "W2", "W2 `%dist restart` to first all_reduce", "s", False),
    MetricSpec("w3.mb_per_s", "W3", "W3 push 100 MB to each rank, MB/s per rank", "MB/s", True),
    MetricSpec("w4.seconds", "W4", "W4 10,000 lines per rank, time to all received", "s", False),
    MetricSpec("w4.lost", "W4", "W4 lines lost (of 20,000)", "lines", False),
    MetricSpec(
        "w4b.seconds", "W4", "W4b (extra) distinct lines per rank, time to all received", "s", False
    ),
    MetricSpec("w4b.lost", "W4", "W4b (extra) lines lost (of 20,000)", "lines", False),
    MetricSpec(
        "w4.cpu_per_10k",
        "W4",
        "W4 notebook kernel CPU per 10,000 lines printed (text path for jupyter_dist)",
        "cpu_s",
        False,
    ),
    MetricSpec(
        "w4w.seconds",
        "W4w",
        "W4w cell view (widget), 10,000 lines per rank, time to each rank's last line drawn",
        "s",
        False,
    ),
    MetricSpec(
        "w4w.lost", "W4w", "W4w lines missing from the rank logs (of 20,000)", "lines", False
    ),
    MetricSpec(
        "w4w.cpu_per_10k", "W4w", "W4w notebook kernel CPU per 10,000 lines printed", "cpu_s", False
    ),
    MetricSpec(
        "w4w.other_kernel_ms",
        "W4w",
        "W4w another session during the flood: a second notebook kernel (no jupyter_dist) "
        "answering `1+1`, max round trip",
        "ms",
        False,
    ),
    MetricSpec(
        "w4w.other_kernel_median_ms",
        "W4w",
        "W4w another session during the flood, median round trip",
        "ms",
        False,
    ),
    MetricSpec("w5.steps_per_s", "W5", "W5 DDP MLP steps/s", "steps/s", True),
)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """median / p90 / min / max of samples (p90 by nearest rank)."""
    ordered = sorted(samples)
    p90_index = max(0, min(len(ordered) - 1, round(0.9 * len(ordered)) - 1))
    return {
        "n": float(len(ordered)),
        "median": statistics.median(ordered),
        "p90": ordered[p90_index],
        "min": ordered[0],
        "max": ordered[-1],
    }


def parse_w5(text: str) -> dict[str, Any]:
    """steps/s of every rank found in the output; value is the mean over ranks."""
    per_rank = {int(r): float(s) for r, s, _ in _W5_RE.findall(text)}
    threads = {int(r): int(t) for r, _, t in _W5_RE.findall(text)}
    if len(per_rank) < N_RANKS:
        raise RuntimeError(f"W5: expected {N_RANKS} ranks' steps/s, got {per_rank}: {text[-300:]}")
    return {
        "value": statistics.mean(per_rank.values()),
        "per_rank": per_rank,
        "torch_threads": threads,
    }


# -- W4: counting printed lines -----------------------------------------------------------

_RANKS_RE = re.compile(r"\d+(?:-\d+)?")


def expand_ranks(spec: str) -> list[int]:
    """'0-1' -> [0, 1]; '0,2-3' -> [0, 2, 3]."""
    ranks: list[int] = []
    for part in _RANKS_RE.findall(spec):
        lo, _, hi = part.partition("-")
        ranks.extend(range(int(lo), int(hi or lo) + 1))
    return ranks


@dataclass
class LineCount:
    """How many times each printed integer arrived, weighted by the ranks a line stands for."""

    counts: Counter[int] = field(default_factory=Counter)
    prefixed: int = 0
    unprefixed: int = 0
    folded: int = 0
    other: list[str] = field(default_factory=list)

    # W4: every rank prints 0..N_LINES-1, so each integer is expected N_RANKS times;
    # W4b (distinct): rank r prints r * DISTINCT_STRIDE + i, each expected once
    distinct: bool = False

    def expected(self) -> dict[int, int]:
        if self.distinct:
            return {r * DISTINCT_STRIDE + i: 1 for r in range(N_RANKS) for i in range(N_LINES)}
        return dict.fromkeys(range(N_LINES), N_RANKS)

    def lost(self) -> int:
        return sum(max(0, want - self.counts[k]) for k, want in self.expected().items())

    def duplicated(self) -> int:
        expected = self.expected()
        return sum(max(0, c - expected.get(k, 0)) for k, c in self.counts.items())

    def detail(self) -> dict[str, Any]:
        return {
            "lost": self.lost(),
            "duplicated_or_unexpected": self.duplicated(),
            "received_weighted": sum(self.counts.values()),
            "lines_with_rank_prefix": self.prefixed,
            "lines_without_prefix": self.unprefixed,
            "folded_multi_rank_lines": self.folded,
            "unexpected_lines_sample": self.other[:5],
        }


def count_lines(texts: Iterable[str], prefix: re.Pattern[str], distinct: bool = False) -> LineCount:
    """Count integer lines in peer output.

    `prefix` matches a rank prefix at the start of a line; its group `ranks` says which
    rank(s) the line stands for (`[rank 0] 5` counts once, `[ranks 0-1] 5` twice) and group
    `rest` is what follows. Lines with no prefix count once.
    """
    out = LineCount(distinct=distinct)
    for text in texts:
        for line in text.splitlines():
            weight = 1
            m = prefix.match(line)
            if m is not None:
                weight = max(1, len(expand_ranks(m.group("ranks"))))
                rest = (m.group("rest") or "").strip()
                if not rest:
                    continue  # a header line, e.g. "[stdout:0] " or "Rank 0:"
                out.prefixed += 1
                if weight > 1:
                    out.folded += 1
            else:
                rest = line.strip()
                if not rest:
                    continue
                out.unprefixed += 1
            if rest.isdigit():
                out.counts[int(rest)] += weight
            elif len(out.other) < 20:
                out.other.append(line[:120])
    return out


def ratio_target(
    key: str,
) -> tuple[str, str, float, bool] | None:
    """(peer to compare with, its metric, factor, jupyter_dist must be <=) for a metric."""
    targets: dict[str, tuple[str, str, float, bool]] = {
        "w1.median_ms": ("ipyparallel", "w1.median_ms", 0.35, True),
        "w2.cold_s": ("torchrun", "w2.cold_s", 0.7, True),
        "w2.restart_s": ("torchrun", "w2.cold_s", 0.15, True),
        "w3.mb_per_s": ("ipyparallel", "w3.mb_per_s", 3.0, False),
        "w4.seconds": ("ipyparallel", "w4.seconds", 1.0, True),
        "w4b.seconds": ("ipyparallel", "w4b.seconds", 1.0, True),
        # the cell view under the same flood, against jupyter_dist's own text path
        "w4w.seconds": ("jupyter_dist", "w4.seconds", 1.5, True),
        "w5.steps_per_s": ("torchrun", "w5.steps_per_s", 0.98, False),
    }
    return targets.get(key)


#: metrics whose target is that nothing is lost
ZERO_LOST = ("w4.lost", "w4b.lost", "w4w.lost")


def absolute_target(key: str) -> tuple[float, bool] | None:
    """(limit, jupyter_dist must be <=) for a metric with a fixed target, in its unit."""
    targets: dict[str, tuple[float, bool]] = {
        "w4w.other_kernel_ms": (50.0, True),
    }
    return targets.get(key)
