"""A real multi-node Ray cluster on one Linux machine, for the Ray tests.

Three nodes, each a separate ``ray start`` in its own network namespace of a private
network (``tests/netns.py``, shared with the ssh cluster): the head ``head`` (no GPUs,
CPU, the dashboard on so that Ray's state API works) and two worker nodes ``worker1`` and
``worker2``, each advertising ``GPUS_PER_WORKER`` fake GPUs (``--num-gpus``) and a custom
resource named after the node (``{"worker1": 1}``), so a test can send work to one node.
Ray refuses a multi-node cluster on loopback (it maps 127.0.0.1 to the machine's
address) and traffic may only go to loopback or to namespaces the test made: hence the
namespaces, each with its own node address, ports and temp folder.

Token authentication is on, as on real clusters (Ray turns it on by default for a local
``ray.init()`` from 2.59 and for every cluster from 2.61; a 2.60 ``ray start`` still needs
it asked for). Ray's token-authentication guide: the mode comes only from the environment
(``RAY_AUTH_MODE=token``, never ``_system_config``) and must be the same on every node;
the token from ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
``~/.ray/auth_token``. Both are in the environment of every ``ray start``, so every Ray
process inherits them, and a driver must carry both too. Ray reads them once per process
(the C++ token loader caches them), so a driver gets them in its environment before it
starts, never by changing ``os.environ`` after ``import ray``. ``HOME`` points into the
cluster's folder, so no token file of the machine's user is read or written.
``RayCluster.env`` holds these variables;
``RayCluster.driver_argv`` runs a driver the way a session owner runs one: in the head's
namespace (a Ray driver needs a raylet on its own address), with that environment.

Kept small for a shared 2-core machine: no prestarted workers, 80 MiB
object stores, usage stats off, and generous start-up deadlines.

    with ray_cluster(workdir=tmp_path) as cluster:
        subprocess.run(cluster.driver_argv(["python", "-c", "import ray; ray.init()"]))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests import netns

__all__ = ["GPUS_PER_WORKER", "HOSTS", "RayCluster", "missing_requirements", "ray_cluster"]

HOSTS = ("head", "worker1", "worker2")
GPUS_PER_WORKER = 4
#: logical CPUs each node advertises: room for a few sessions' bundles, whatever the cores
CPUS_PER_NODE = 4
GCS_PORT = 6379
DASHBOARD_PORT = 8265
#: Ray's smallest object store (``ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES``) + 5 MiB
OBJECT_STORE_BYTES = 80 * 1024 * 1024
#: Every node alive and the dashboard answering, on a loaded 2-core machine (292 s seen
#: with other clusters starting beside it)
START_TIMEOUT = 480.0


@dataclasses.dataclass(frozen=True)
class RayCluster:
    """A running cluster: node ``i`` is ``network.hosts[i]`` (0 is the head).

    ``address`` is the head's GCS (``HOST:PORT``, what ``ray.init`` and ``RAY_ADDRESS``
    take); ``env`` the variables every Ray process of the cluster and every driver needs
    (authentication, usage stats, ``RAY_ADDRESS``); ``token`` the cluster's secret.
    ``start_seconds`` is how long ``ray_cluster`` took until every node was alive.
    """

    network: netns.Network
    address: str
    dashboard_url: str
    token: str
    env: Mapping[str, str]
    workdir: Path
    start_seconds: float
    #: each node's Ray temp folder is ``temp_root / host``
    temp_root: Path = Path()

    @property
    def worker_hosts(self) -> tuple[str, ...]:
        return self.network.hosts[1:]

    def driver_env(self, **overrides: str | None) -> dict[str, str]:
        """This process's environment plus ``env``; an override of None removes a variable."""
        env = {**os.environ, **self.env}
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def driver_argv(self, argv: Sequence[str], node: int = 0) -> list[str]:
        """``argv`` in node ``node``'s namespace, where a driver finds a raylet at its address."""
        return self.network.exec_argv(node, argv)

    def run_driver(
        self, code: str, *, node: int = 0, timeout: float = 180, **env: str | None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a fresh Python driver on node ``node``, capturing its output."""
        return subprocess.run(
            self.driver_argv([sys.executable, "-c", code], node),
            env=self.driver_env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def pids(self, i: int) -> list[int]:
        """Host-side pids of every live process of node ``i`` (its namespace's)."""
        return self.network.pids(i)

    def kill_node(self, i: int) -> None:
        """SIGKILL every process of node ``i`` (a machine that dies)."""
        netns.kill_netns(self.network.namespaces[i])

    def restart_node(self, i: int) -> None:
        """Node ``i`` anew after `kill_node` (its Ray processes, with a fresh temp folder),
        once a driver sees every node alive again."""
        netns.kill_netns(self.network.namespaces[i])
        host = self.network.hosts[i]
        temp_dir = self.temp_root / f"{host}{len(list(self.temp_root.glob(host + '*')))}"
        deadline = time.monotonic() + START_TIMEOUT
        _ray_start(self, i, temp_dir, deadline)
        _wait_for_nodes(self, deadline)


def missing_requirements() -> list[str]:
    """What this machine lacks to run the cluster; empty when it can."""
    problems = netns.missing_requirements()
    try:
        import ray
    except ImportError:
        problems.append("ray is not installed (pip install 'jupyter_dist[ray]')")
    else:
        del ray
    return problems


@contextlib.contextmanager
def ray_cluster(*, workdir: Path) -> Iterator[RayCluster]:
    """Start the head and two worker nodes; on exit stop them and remove every trace.

    Each node's logs are in ``workdir/<host>/`` (``ray start``'s output) and in its Ray
    temp folder (short, under the system temp folder: Ray's socket paths must fit 107
    bytes), removed on exit.
    """
    problems = missing_requirements()
    if problems:
        raise RuntimeError("cannot start a Ray test cluster: " + "; ".join(problems))
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    temp_root = Path(tempfile.mkdtemp(prefix="jdray-"))
    started = time.monotonic()
    try:
        with netns.namespace_network(HOSTS) as net:
            head = net.addresses[0]
            home = workdir / "home"
            home.mkdir(exist_ok=True)
            env = {
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": secrets.token_hex(32),
                "RAY_ADDRESS": f"{head}:{GCS_PORT}",
                "HOME": str(home),
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_enable_worker_prestart": "0",
                "RAY_prestart_worker_first_driver": "0",
            }
            cluster = RayCluster(
                network=net,
                address=env["RAY_ADDRESS"],
                dashboard_url=f"http://{head}:{DASHBOARD_PORT}",
                token=env["RAY_AUTH_TOKEN"],
                env=env,
                workdir=workdir,
                start_seconds=0.0,
                temp_root=temp_root,
            )
            try:
                deadline = started + START_TIMEOUT
                for i in range(len(HOSTS)):
                    _ray_start(cluster, i, temp_root / HOSTS[i], deadline)
                _wait_for_nodes(cluster, deadline)
                yield _replace_start(cluster, time.monotonic() - started)
            finally:
                _ray_stop(cluster)
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)


# --- start and stop ------------------------------------------------------------------------


def _ray_start(cluster: RayCluster, i: int, temp_dir: Path, deadline: float) -> None:
    """``ray start`` node ``i``: it starts the node's daemons, detached, and exits.

    ``ray start`` gives up when the raylet has not registered 30 s after it started
    (hard-coded in ``ray._private.node``), which a loaded machine can miss, while the
    raylet goes on and registers later: a failed ``ray start`` whose raylet still runs is
    waited for (``_wait_for_nodes``) like one that succeeded. A node whose raylet died
    (it gives its dashboard agent only so long to report its ports) starts again.
    """
    net = cluster.network
    host, address = net.hosts[i], net.addresses[i]
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--disable-usage-stats"]
    argv += ["--node-ip-address", address, "--temp-dir", str(temp_dir)]
    argv += ["--num-cpus", str(CPUS_PER_NODE), "--object-store-memory", str(OBJECT_STORE_BYTES)]
    if i == 0:
        argv += ["--head", "--port", str(GCS_PORT), "--num-gpus", "0"]
        argv += ["--include-dashboard", "true", "--dashboard-host", address]
        argv += ["--dashboard-port", str(DASHBOARD_PORT)]
    else:
        argv += ["--address", cluster.address, "--num-gpus", str(GPUS_PER_WORKER)]
        argv += ["--resources", json.dumps({host: 1})]
    log_path = cluster.workdir / host / "ray-start.log"
    log_path.parent.mkdir(exist_ok=True)
    while True:
        with log_path.open("ab") as log:
            try:
                result = subprocess.run(
                    net.exec_argv(i, argv),
                    env=cluster.driver_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=max(deadline - time.monotonic(), 1),
                    check=False,
                    start_new_session=True,  # a terminal's Ctrl-C does not reach the daemons
                )
                failed = f"failed ({result.returncode})" if result.returncode else ""
            except subprocess.TimeoutExpired:
                failed = "timed out"
        if not failed or _raylet_running(cluster, i):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"`ray start` of {host} ({address}) {failed} until the start-up deadline of"
                f" {START_TIMEOUT:.0f}s:\n{netns.tail(log_path)}\n--- raylet:\n"
                + _raylet_fatal(temp_dir)
            )
        netns.kill_netns(net.namespaces[i])  # what the failed start left; then again


def _raylet_fatal(temp_dir: Path) -> str:
    """The lines of the node's raylet log that say why it died ('C' for check failed)."""
    log = netns.read_text(temp_dir / "session_latest" / "logs" / "raylet.out")
    return "\n".join(line for line in log.splitlines() if " C " in line[:40]) or "(none)"


def _raylet_running(cluster: RayCluster, i: int) -> bool:
    comms = [netns.read_text(Path(f"/proc/{pid}/comm")) for pid in cluster.pids(i)]
    return "raylet" in comms


_NODES_ALIVE = """
import json, ray
ray.init(logging_level="ERROR")
nodes = [n for n in ray.nodes() if n["Alive"]]
print(json.dumps(sorted(n["NodeManagerAddress"] for n in nodes)))
"""


def _wait_for_nodes(cluster: RayCluster, deadline: float) -> None:
    """Until a driver sees every node alive (worker nodes register after ``ray start``)."""
    want = sorted(cluster.network.addresses)
    last = ""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            logs = "".join(
                f"\n--- {host}: ray start\n" + netns.tail(cluster.workdir / host / "ray-start.log")
                for host in cluster.network.hosts
            )
            raise RuntimeError(
                f"Ray test cluster not up after {START_TIMEOUT:.0f}s: want nodes {want};"
                f" last driver said:\n{last}{logs}"
            )
        try:
            result = cluster.run_driver(_NODES_ALIVE, timeout=remaining)
        except subprocess.TimeoutExpired:
            continue
        lines = result.stdout.strip().splitlines()
        if result.returncode == 0 and lines and json.loads(lines[-1]) == want:
            return
        last = (result.stdout + result.stderr)[-3000:]
        time.sleep(1)


def _ray_stop(cluster: RayCluster, grace: float = 10) -> None:
    """SIGTERM every process of each node, worker nodes first; the network's teardown
    then SIGKILLs what is left. Never ``ray stop``: it stops every Ray process on the
    machine, other clusters' too.
    """
    for i in reversed(range(len(cluster.network.hosts))):
        for pid in cluster.pids(i):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(cluster.pids(i) for i in range(len(cluster.network.hosts))):
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _replace_start(cluster: RayCluster, seconds: float) -> RayCluster:
    return dataclasses.replace(cluster, start_seconds=seconds)
