"""jupyter_dist: `%load_ext jupyter_dist`, then `%%distributed --procs 2` cells on 2 rank
kernels; `%dist restart`, `%dist push`, `%dist shutdown`. Rank output arrives prefixed
`[rank N] ` (or folded `[ranks 0-1] ` when ranks print the same line)."""

from __future__ import annotations

import re
from typing import ClassVar

from notebook_kernel import NotebookKernel
from workloads import N_RANKS

from drivers.base import KernelPeer

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


class JupyterDistDriver(KernelPeer):
    name = "jupyter_dist"
    description = "jupyter_dist %%distributed --procs 2 (rank ipykernels, gloo)"
    line_prefix: ClassVar[re.Pattern[str]] = re.compile(
        r"^\[ranks? (?P<ranks>[\d,\- ]+)\] ?(?P<rest>.*)$"
    )

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
