"""An emulated Kubernetes cluster for the k8s launcher's tests, in one local process.

``api_server.py`` (kmock's emulator behind a token, RBAC denials, schema checks) and, as a
client of its HTTP API, ``kubelet.py``: Job controller and garbage collector
(``job_controller.py``), scheduler (``scheduler.py``, fake nodes) and kubelet (pods as local
processes, ``pod_runner.py``; each leaves from its own loopback pod IP, ``pod_network.c``).
``cluster.py`` starts and drives it, ``conftest.py`` holds the fixtures.

Not a cluster: no containers (images are ignored, the command runs on this machine with
this interpreter), no network beyond loopback addresses, no watches, no DNS, no isolation
between pods, no real nodes.
"""
