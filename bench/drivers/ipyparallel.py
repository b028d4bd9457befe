"""ipyparallel: a Cluster of 2 engines started in the notebook kernel, cells sent with %%px.

Engines are ipykernel-based and know nothing of torch.distributed, so the session scatters
RANK and pushes MASTER_PORT, then initialises the gloo process group in a %%px cell.
In a kernel, %%px streams engine output as `display_data` + `update_display_data` messages
carrying the whole stream so far, prefixed `[stdout:N] `; W4 counts the final version.
"""

from __future__ import annotations

import re
from typing import ClassVar

from notebook_kernel import NotebookKernel
from workloads import N_RANKS

from drivers.base import KernelPeer

START_CLUSTER = f"""\
import socket as _bench_socket
import ipyparallel as ipp
_bench_cluster = ipp.Cluster(n={N_RANKS})
_bench_rc = await _bench_cluster.start_and_connect(activate=True)
with _bench_socket.socket() as _bench_s:
    _bench_s.bind(("127.0.0.1", 0))
    _bench_port = _bench_s.getsockname()[1]
_bench_rc[:].scatter("RANK", list(range({N_RANKS})), flatten=True, block=True)
_bench_rc[:].push({{"MASTER_PORT": _bench_port}}, block=True)
"""

INIT_DIST = f"""\
import os
import torch.distributed as dist
os.environ.update(
    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(MASTER_PORT), RANK=str(RANK), WORLD_SIZE="{N_RANKS}"
)
dist.init_process_group("gloo")
"""

TEARDOWN = """\
if "_bench_cluster" in globals():
    await _bench_cluster.stop_cluster()
"""


class IpyparallelDriver(KernelPeer):
    name = "ipyparallel"
    description = "ipyparallel Cluster(n=2) in the notebook kernel, %%px cells"
    line_prefix: ClassVar[re.Pattern[str]] = re.compile(
        r"^\[(?:stdout|stderr):(?P<ranks>\d+)\] ?(?P<rest>.*)$"
    )

    def cell(self, body: str) -> str:
        return "%%px\n" + body

    def start_session(self, nk: NotebookKernel) -> None:
        nk.run(START_CLUSTER, timeout=self.cfg.cell_timeout_s)
        nk.run(self.cell(INIT_DIST), timeout=self.cfg.cell_timeout_s)

    def teardown_code(self) -> str:
        return TEARDOWN

    def cold_start(self, nk: NotebookKernel) -> float:
        first = nk.run(START_CLUSTER, timeout=self.cfg.cell_timeout_s)
        return self.allreduce_after(nk, first, self.cell(INIT_DIST + self.allreduce_body()))

    def push_code(self) -> str:
        return '_bench_rc[:].push({"a": a}, block=True)\n'

    def w2_extra_na(self) -> dict[str, str]:
        return {"w2.restart_s": "no restart command measured (ipyparallel: restart_engines)"}
