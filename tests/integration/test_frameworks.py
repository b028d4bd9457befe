"""``--framework``: what each rank is given before the first cell, with real ranks.

* ``jax``: ``jax.distributed.initialize()`` with no arguments joins the session's ranks
  (process count, id, coordinator) and a cross-process ``psum`` runs on CPU; a second
  no-argument call, as re-running the cell makes, is harmless; there is no torch group.
* ``none``: no torch process group, the rest of the session as usual.
* CPU sessions set ``ACCELERATE_USE_CPU``: ``Accelerator()`` sees every rank and
  ``prepare()`` wraps a model in DDP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_dist.errors import RanksFailed
from tests.conftest import CellOutput, started_session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jax_session(shell: Any) -> Iterator[str]:
    pytest.importorskip("jax")
    yield from started_session(shell, "jaxfw", "--procs 2 --framework jax")


@pytest.fixture(scope="module")
def torch_session(shell: Any) -> Iterator[str]:
    yield from started_session(shell, "torchfw", "--procs 2")


@pytest.fixture(scope="module")
def bare_session(shell: Any) -> Iterator[str]:
    yield from started_session(shell, "nofw", "--procs 2 --framework none")


def cell(run: Any, name: str, body: str) -> CellOutput:
    out: CellOutput = run(f"%%distributed --session {name} --timeout 300\n{body}")
    return out


PSUM = """\
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('i',))
local = np.array([float(jax.process_index() + 1)])
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('i')), local)
total = jax.shard_map(lambda v: jax.lax.psum(v, 'i'), mesh=mesh, in_specs=P('i'),
                      out_specs=P())(x)
print('psum', float(total.addressable_data(0)[0]))
"""


def test_jax_initialize_without_arguments_joins_the_ranks(run: Any, jax_session: str) -> None:
    out = cell(
        run,
        jax_session,
        "import os, jax, torch.distributed as dist\n"
        "jax.distributed.initialize()\n"
        "print('jax', jax.process_count(), jax.device_count(), 'torch group', "
        "dist.is_initialized())\n"
        "print('me', jax.process_index() == int(os.environ['RANK']))\n"
        "print('coordinator', os.environ['JAX_COORDINATOR_ADDRESS'].split(':')[0])",
    )
    assert out.ok, out.stdout + out.stderr
    assert "[ranks 0-1] jax 2 2 torch group False" in out.stdout, out.stdout
    assert "[ranks 0-1] me True" in out.stdout, out.stdout
    # the coordinator listens beside torch's store, on the session's MASTER_ADDR
    master = cell(run, jax_session, "import os; print('master', os.environ['MASTER_ADDR'])")
    addr = master.stdout.split("master ", 1)[1].split()[0]
    assert f"coordinator {addr}" in out.stdout, out.stdout


def test_a_cross_process_psum_on_cpu(run: Any, jax_session: str) -> None:
    out = cell(run, jax_session, "import jax\njax.distributed.initialize()\n" + PSUM)
    assert out.ok, out.stdout + out.stderr
    assert "[ranks 0-1] psum 3.0" in out.stdout, out.stdout  # 1 + 2, on both ranks


def test_initialize_again_as_a_rerun_cell_does_and_other_arguments_refused(
    run: Any, jax_session: str
) -> None:
    again = cell(run, jax_session, "import jax\njax.distributed.initialize()\nprint('again')")
    assert again.ok, again.stdout + again.stderr
    assert "[ranks 0-1] again" in again.stdout
    other = cell(run, jax_session, "import jax\njax.distributed.initialize(num_processes=5)")
    assert isinstance(other.error, RanksFailed)  # JAX's own refusal: not what is there
    failure = other.error.failures[0]
    assert failure.ename == "RuntimeError" and "initialize" in str(failure.evalue), failure


def test_after_a_restart_the_fresh_ranks_initialise_again(
    shell: Any, run: Any, jax_session: str
) -> None:
    shell.run_line_magic("dist", f"restart --session {jax_session}")
    out = cell(run, jax_session, "import jax\njax.distributed.initialize()\n" + PSUM)
    assert out.ok, out.stdout + out.stderr
    assert "[ranks 0-1] psum 3.0" in out.stdout, out.stdout


def test_framework_none_has_no_process_group(run: Any, bare_session: str) -> None:
    out = cell(
        run,
        bare_session,
        "import os, torch.distributed as dist\n"
        "print('group', dist.is_initialized(), os.environ['JUPYTER_DIST_FRAMEWORK'], "
        "os.environ['WORLD_SIZE'])",
    )
    assert out.ok, out.stdout + out.stderr
    assert "[ranks 0-1] group False none 2" in out.stdout, out.stdout
    # a script's own group still meets the session's store
    made = cell(
        run,
        bare_session,
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())",
    )
    assert made.ok, made.stdout + made.stderr
    assert "[ranks 0-1] sum 2.0" in made.stdout


def test_accelerate_sees_every_cpu_rank_and_wraps_ddp(run: Any, torch_session: str) -> None:
    pytest.importorskip("accelerate")
    out = cell(
        run,
        torch_session,
        "import os, torch\n"
        "from accelerate import Accelerator\n"
        "acc = Accelerator()\n"
        "model = acc.prepare(torch.nn.Linear(4, 2))\n"
        "print('accelerate', os.environ['ACCELERATE_USE_CPU'], acc.num_processes, "
        "acc.process_index == int(os.environ['RANK']), type(model).__name__)",
    )
    assert out.ok, out.stdout + out.stderr
    assert "[ranks 0-1] accelerate 1 2 True DistributedDataParallel" in out.stdout, out.stdout
