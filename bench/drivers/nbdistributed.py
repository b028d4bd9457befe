"""nbdistributed: `%dist_init -n 2` starts 2 worker processes (plain `exec` loops, not
kernels) that talk to the notebook kernel over raw pickles on a ZMQ ROUTER socket.

Things this driver has to work around, measured as they are otherwise:

* `%dist_init` turns on "distributed mode" (every plain cell is rewritten to
  `%%distributed`), so the session turns it off to keep the bench's own cells local.
* `%dist_init` returns after a fixed 2 s sleep, before the workers (still importing torch
  and joining the gloo group) have connected; a cell sent then is dropped by the ROUTER
  socket and times out after 30 s. The session waits for readiness with the package's own
  `get_status` message before its first cell.
* `%dist_shutdown` / `%dist_reset` run `pkill -f` on broad patterns (`python.*worker`,
  `torch.*distributed`) that can kill unrelated processes on the machine, so teardown uses
  the magic's managers directly instead.
* There is no push command; W3 uses the worker protocol's internal `set_var` message.
"""

from __future__ import annotations

import re
from typing import ClassVar

from notebook_kernel import NotebookKernel
from workloads import N_RANKS

from drivers.base import KernelPeer

INIT = f"""\
%load_ext nbdistributed
%dist_init -n {N_RANKS}
%dist_mode --disable
"""

WAIT_READY = """\
import time as _bench_time
_bench_m = get_ipython().magics_manager.registry["DistributedMagic"]
_bench_deadline = _bench_time.monotonic() + 120
while True:
    try:
        _bench_m._comm_manager.send_to_all("get_status", {}, timeout=0.2)
        break
    except TimeoutError:
        if _bench_time.monotonic() > _bench_deadline:
            raise
"""

TEARDOWN = """\
_bench_m = get_ipython().magics_manager.registry.get("DistributedMagic")
if _bench_m is not None and _bench_m._comm_manager is not None:
    try:
        _bench_m._comm_manager.send_to_all("shutdown", {}, timeout=0.5)
    except Exception:
        pass
    _bench_m._comm_manager.shutdown()
if _bench_m is not None and _bench_m._process_manager is not None:
    _bench_m._process_manager.shutdown()
"""

PUSH = """\
_bench_r = _bench_m._comm_manager.send_to_all("set_var", {"name": "a", "value": a}, timeout=300)
assert all(v.get("status") == "success" for v in _bench_r.values()), _bench_r
"""


class NbdistributedDriver(KernelPeer):
    name = "nbdistributed"
    description = "nbdistributed %dist_init -n 2, %%distributed cells"
    line_prefix: ClassVar[re.Pattern[str]] = re.compile(r"^\W*Rank (?P<ranks>\d+):(?P<rest>)$")

    def cell(self, body: str) -> str:
        return "%%distributed\n" + body

    def start_session(self, nk: NotebookKernel) -> None:
        nk.run(INIT, timeout=self.cfg.cell_timeout_s)
        nk.run(WAIT_READY, timeout=self.cfg.cell_timeout_s)

    def teardown_code(self) -> str:
        return TEARDOWN

    def cold_start(self, nk: NotebookKernel) -> float:
        first = nk.run(INIT, timeout=self.cfg.cell_timeout_s)
        nk.run(WAIT_READY, timeout=self.cfg.cell_timeout_s)
        return self.allreduce_after(nk, first, self.cell(self.allreduce_body()))

    def push_code(self) -> str:
        return PUSH

    def w2_extra_na(self) -> dict[str, str]:
        return {"w2.restart_s": "no restart command (only %dist_shutdown + %dist_init)"}
