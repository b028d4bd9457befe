"""Bad input at the parsers: every value is refused with a message naming it, quickly,
before anything is built from it (a range is not expanded, a file not read to its end).

The same values through the magic and a real server: tests/integration/test_bad_input.py.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.common.hosts import (
    MAX_FILE_BYTES,
    MAX_NODES,
    HostSpec,
    check_host,
    check_ssh_config,
    parse_hosts,
    read_hostfile,
)
from jupyter_dist.common.spec import (
    MAX_WORLD_SIZE,
    ShapeRequest,
    check_seconds,
    parse_counts,
    parse_ranks,
    resolve_shape,
    validate_request,
)
from jupyter_dist.errors import SpecError
from jupyter_dist.server.handlers import shape_from_json
from jupyter_dist.settings import MAX_RANKS_VAR, default_max_ranks, max_ranks_per_node

#: CPU seconds any refusal may take (the old code took seconds and gigabytes for some);
#: the CPU time of this thread, which other work on the machine does not stretch
QUICK_S = 0.5


def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the `SpecError` ``call`` raises, which it must raise quickly."""
    began = time.thread_time()
    with pytest.raises(SpecError) as err:
        call(*args, **kwargs)
    took = time.thread_time() - began
    assert took < QUICK_S, f"{took:.2f} CPU s to refuse it"
    return str(err.value)


# -- --ranks and ?ranks= -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "world", "fragment"),
    [
        ("0-30000000", 2, "rank 30000000 does not exist; the session has ranks 0-1"),
        ("0-30000000", None, f"a session has at most {MAX_WORLD_SIZE} ranks"),
        ("5", 2, "rank 5 does not exist"),
        ("9" * 5000, None, "does not exist"),  # int() of it would raise ValueError
        ("1-" + "9" * 5000, 4, "does not exist"),
        ("3-1", 4, "runs backwards"),
        ("1-x", None, "'1-x' is not a rank or a range"),
        ("-1", None, "'-1' is not a rank or a range"),
        ("", None, "'' is not a rank or a range"),
    ],
)
def test_bad_ranks_are_refused_before_any_range_is_expanded(
    text: str, world: int | None, fragment: str
) -> None:
    assert fragment in refused(parse_ranks, text, world)


def test_repeated_ranges_cost_no_more_than_one() -> None:
    text = ",".join(["0-65535"] * 20_000)  # 20 000 full ranges: merged, expanded once
    began = time.thread_time()
    assert parse_ranks(text) == tuple(range(MAX_WORLD_SIZE))
    assert time.thread_time() - began < 2.0
    assert parse_ranks("3,0-1,1-2", 4) == (0, 1, 2, 3)


# -- counts and caps -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0", "--procs 0: expected a whole number of at least 1"),
        ("-3", "--procs -3: expected a whole number of at least 1"),
        ("two", "--procs 'two': expected a whole number"),
        ("9" * 5000, "more ranks than any node runs"),  # int() of it would raise ValueError
        (",".join(["1"] * (MAX_NODES + 1)), f"at most {MAX_NODES} nodes"),
    ],
)
def test_bad_counts(text: str, fragment: str) -> None:
    assert fragment in refused(parse_counts, "--procs", text)


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (ShapeRequest(procs=10**12), f"at most {MAX_WORLD_SIZE} ranks"),
        (ShapeRequest(gpus=10**12), f"at most {MAX_WORLD_SIZE} ranks"),
        (ShapeRequest(procs=65), "--procs 65: at most 64 ranks may run on a node"),
        (ShapeRequest(nodes=10**6), f"a session takes at most {MAX_NODES} nodes"),
        (ShapeRequest(hosts=(HostSpec("a", slots=10**12),)), "at most 64 ranks"),
        (ShapeRequest(procs=(1, 10**9), hosts=(HostSpec("a"), HostSpec("b"))), "at most"),
        (ShapeRequest(procs=65, hosts=(HostSpec("a"),)), "node a"),
        (ShapeRequest(procs=1, python="--version"), "starts with '-'"),
    ],
)
def test_shapes_larger_than_a_node_runs_are_refused_before_anything_starts(
    request_: ShapeRequest, fragment: str
) -> None:
    message = refused(resolve_shape, "s", request_, 0, "here", max_ranks=64)
    assert fragment in message
    if "may run on a node" in message:
        assert MAX_RANKS_VAR in message  # says how to allow more


def test_the_cap_comes_from_the_environment_or_the_machine() -> None:
    assert default_max_ranks() == max(8, 2 * (os.cpu_count() or 1))
    assert max_ranks_per_node({}) == default_max_ranks()
    assert max_ranks_per_node({MAX_RANKS_VAR: "3"}) == 3
    for bad in ("0", "-1", "many", "9" * 5000):
        assert MAX_RANKS_VAR in refused(max_ranks_per_node, {MAX_RANKS_VAR: bad})
    spec = resolve_shape("s", ShapeRequest(procs=3), 0, "here", max_ranks=3)
    assert spec.world_size == 3


# -- hosts, users, ports, interpreters ---------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("-oProxyCommand=touch /tmp/x", "host name '-oProxyCommand=touch /tmp/x' starts with '-'"),
        ("-x", "host name '-x' starts with '-'"),
        ("-l@gpu1", "user '-l' starts with '-'"),
        ("a b@gpu1", "user 'a b' of 'a b@gpu1' is not a user name"),
        ("gpu1:0", "port 0 of 'gpu1:0' is outside 1-65535"),
        ("gpu1:99999", "port 99999 of 'gpu1:99999' is outside 1-65535"),
        ("gpu1:" + "9" * 5000, "is outside 1-65535"),
        ("gpu1:-22", "port '-22'"),
        ("[-x]", "starts with '-'"),
        (",".join(f"n{i}" for i in range(MAX_NODES + 1)), f"at most {MAX_NODES} nodes"),
    ],
)
def test_bad_hosts_are_refused(text: str, fragment: str) -> None:
    assert fragment in refused(parse_hosts, text)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"name": "a", "port": 99999}, "port 99999 of 'a' is outside 1-65535"),
        ({"name": "a", "port": 0}, "port 0 of 'a' is outside 1-65535"),
        ({"name": "a", "port": True}, "port True of 'a'"),
        ({"name": "a", "port": "22"}, "port '22' of 'a'"),
        ({"name": "a", "slots": -3}, "slots -3 of 'a': expected a whole number of at least 1"),
        ({"name": "a", "slots": 0}, "slots 0 of 'a'"),
        ({"name": "a", "user": "-oX"}, "user '-oX' starts with '-'"),
        ({"name": "a", "user": "a;b"}, "user 'a;b' of 'a' is not a user name"),
        ({"name": "a", "user": 7}, "user 7 of 'a' is not a string"),
        ({"name": "-a"}, "host name '-a' starts with '-'"),
        ({"name": "alice@a:22"}, "with its user and port as fields of their own"),
        ({"name": "a", "python": "--version"}, "python '--version' starts with '-'"),
        ({"name": "a", "python": "py\nthon"}, "without control characters"),
        ({"name": "a", "python": ""}, "is not a Python interpreter"),
        ({"user": "a"}, "is not a host"),
    ],
)
def test_host_fields_are_checked_as_the_string_form_is(
    fields: dict[str, Any], fragment: str
) -> None:
    assert fragment in refused(check_host, fields, "hosts[0]")


def test_good_host_fields_pass() -> None:
    assert check_host({"name": "[fe80::1]", "user": "bob", "port": 2222, "slots": 4}) == (
        HostSpec("fe80::1", "bob", 2222, 4)
    )
    assert check_host({"name": "gpu1", "python": "/opt/py/bin/python"}).python == (
        "/opt/py/bin/python"
    )


# -- hostfiles and ssh configs --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("gpu1 python=--version\n", "python '--version' starts with '-'"),
        ("gpu1 python=-c\n", "starts with '-'"),
        ("-oProxyCommand=x slots=2\n", "starts with '-'"),
        ("-l@gpu1\n", "user '-l' starts with '-'"),
        ("gpu1:0\n", "port 0 of 'gpu1:0'"),
        ("gpu1 slots=\u00b2\n", "expected slots=N"),  # isdigit() but not int()
        ("gpu1 slots=" + "9" * 5000 + "\n", "expected slots=N"),
        ("gpu1 slots=-3\n", "expected slots=N"),
        ("".join(f"n{i}\n" for i in range(MAX_NODES + 1)), f"at most {MAX_NODES} nodes"),
    ],
)
def test_bad_hostfile_lines(tmp_path: Path, content: str, fragment: str) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(content)
    assert fragment in refused(read_hostfile, hostfile)


def test_files_that_are_not_small_regular_files_are_not_read(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"gpu1\n" * (MAX_FILE_BYTES // 5 + 1))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    for read in (read_hostfile, check_ssh_config):
        assert "not a regular file" in refused(read, "/dev/zero")  # would never end
        assert "not a regular file" in refused(read, str(fifo))
        assert "not a regular file" in refused(read, str(tmp_path))
        assert f"expected at most {MAX_FILE_BYTES} bytes" in refused(read, str(big))
        assert "cannot read it" in refused(read, str(tmp_path / "missing"))
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    assert "not UTF-8" in refused(read_hostfile, tmp_path / "binary")


def test_a_pod_template_that_is_not_a_small_regular_file_is_not_read(tmp_path: Path) -> None:
    from jupyter_dist.common.k8s_options import MAX_TEMPLATE_BYTES, read_pod_template

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        assert f"--pod-template {path!r}: not a regular file" in refused(read_pod_template, path)
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (MAX_TEMPLATE_BYTES // 10 + 1))
    assert "expected at most 262144 bytes (256 KiB) of a pod template" in refused(
        read_pod_template, str(big)
    )
    missing = str(tmp_path / "missing.yaml")
    assert refused(read_pod_template, missing).endswith("No such file or directory")
    pod = tmp_path / "pod.yaml"
    pod.write_text("kind: Pod\nspec:\n  serviceAccountName: trainer\n")
    assert read_pod_template(str(pod)) == {
        "metadata": {},
        "spec": {"serviceAccountName": "trainer"},
    }


# -- seconds ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -1.0])
def test_timeouts_must_be_finite_and_positive(value: float) -> None:
    assert "expected a finite positive number of seconds" in refused(
        check_seconds, "--timeout", value
    )
    assert check_seconds("--timeout", 0.5) == 0.5


# -- REST bodies (parsing only; through a server: test_rest_input.py) ------------------------------
@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"hosts": [{"name": "a", "port": 99999}], "procs": 1}, "port 99999 of 'a'"),
        ({"hosts": [{"name": "a", "port": 0}], "procs": 1}, "port 0 of 'a'"),
        ({"hosts": [{"name": "a", "slots": -3}]}, "slots -3 of 'a'"),
        ({"hosts": [{"name": "a", "user": "-oX"}], "procs": 1}, "user '-oX' starts with '-'"),
        ({"hosts": [{"name": "a", "slot": 2}]}, "hosts[0]: unknown field 'slot'"),
        ({"hosts": [{"name": "a"}, {"name": "a"}]}, "'a' is listed twice"),
        ({"hosts": ["a"]}, "hosts[0]: 'a' is not a host"),
        ({"hosts": [{"name": "a"}] * (MAX_NODES + 1)}, f"at most {MAX_NODES} nodes"),
        ({"hosts": "a,-b"}, "host name '-b' starts with '-'"),
        ({"procs": [1] * (MAX_NODES + 1)}, f"at most {MAX_NODES} nodes"),
        ({"python": "--version"}, "python '--version' starts with '-'"),
        ({"env": {"A=B": "x"}}, "env: 'A=B' is not a variable name"),
        ({"env": {"": "x"}}, "env: '' is not a variable name"),
        ({"env": {"A": "x\0y"}}, "env: A: its value holds a NUL character"),
        ({"cwd": "relative/dir"}, "cwd 'relative/dir': expected an absolute path"),
        ({"name": "-x"}, "--session '-x'"),
        ({"ray": "head:6379"}, "ray: 'head:6379' is not a dict"),
        ({"ray": {"cpu": 2}}, "ray: unknown field 'cpu'; expected address, cpus, gpus"),
        ({"ray": {"cpus": "2"}}, "ray.cpus: '2' is not a int"),
        ({"ray": {"cpus": 0}}, "ray: --ray-cpus 0: expected 1 to 4096"),
        ({"ray": {"gpus": True}}, "ray.gpus: 'True' is not a int"),
        ({"ray": {"strategy": "diagonal"}}, "ray: --ray-strategy 'diagonal': expected one of"),
        ({"ray": {"address": "ray://head:10001"}}, "ray: --ray-address 'ray://head:10001'"),
        ({"ray": {"address": "head"}}, "ray: --ray-address 'head': expected HOST:PORT"),
        ({"ray": {"runtime_env": "{pip"}}, "ray: --ray-runtime-env '{pip': not JSON"),
        ({"ray": {"runtime_env": {"pip": []}}}, "ray.runtime_env: \"{'pip': []}\" is not a str"),
        ({"k8s": "gpu-team"}, "k8s: 'gpu-team' is not a dict"),
        ({"k8s": {"namespce": "a"}}, "k8s: unknown field 'namespce'; expected callback, context"),
        ({"k8s": {"namespace": "GPU_Team"}}, "k8s: --namespace 'GPU_Team': expected a Kubernetes"),
        ({"k8s": {"namespace": 7}}, "k8s.namespace: '7' is not a str"),
        ({"k8s": {"cpus": 8}}, "k8s.cpus: '8' is not a str"),
        ({"k8s": {"memory": "64GB"}}, "k8s: --memory '64GB': expected a Kubernetes quantity"),
        ({"k8s": {"cpus": "0"}}, "k8s: --cpus '0': expected 0.001 (1m) to 4096"),
        ({"k8s": {"cpus": "5000"}}, "k8s: --cpus '5000': expected 0.001 (1m) to 4096"),
        (
            {"k8s": {"cpus": "9" * 5000}},
            "k8s: --cpus '999999999999999999999999'... (5000 characters): expected a Kubernetes"
            " quantity, 0.001 (1m) to 4096",
        ),
        ({"k8s": {"cpus": "0.0001"}}, "k8s: --cpus '0.0001': expected 0.001 (1m) to 4096"),
        ({"k8s": {"memory": "100Ei"}}, "k8s: --memory '100Ei': expected 1Mi to 64Ti"),
        ({"k8s": {"image": "my image"}}, "k8s: --image 'my image': expected an image reference"),
        ({"k8s": {"node_selector": "a=b"}}, "k8s.node_selector: 'a=b' is not a list"),
        ({"k8s": {"node_selector": [1]}}, "k8s.node_selector: '[1]': expected a list of strings"),
        ({"k8s": {"node_selector": ["gpu"]}}, "k8s: --node-selector 'gpu': expected key=value"),
        ({"k8s": {"tolerations": ["gpu:Never"]}}, "k8s: --toleration 'gpu:Never': expected key"),
        ({"k8s": {"callback": "10.0.0.1"}}, "k8s: --k8s-callback '10.0.0.1': expected HOST:PORT"),
        ({"k8s": {"timeout": 0}}, "k8s: --k8s-timeout 0: expected seconds, more than 0"),
        ({"k8s": {"timeout": "5m"}}, "k8s.timeout: '5m' is not a int or float"),
        ({"k8s": {"deadline": 30}}, "k8s: --k8s-deadline 30: expected whole seconds, 60 to"),
        ({"k8s": {"deadline": 3600.5}}, "k8s.deadline: '3600.5' is not a int"),
        ({"k8s": {"pod_template": " "}}, "k8s: --pod-template ' ': expected a file's path"),
    ],
)
def test_bad_bodies_are_refused_at_parsing(body: dict[str, Any], fragment: str) -> None:
    assert fragment in refused(shape_from_json, body)


def test_a_k8s_body_gives_the_spec_the_flags_give_and_null_means_the_default() -> None:
    from jupyter_dist.common.k8s_options import DEFAULT_DEADLINE_S, DEFAULT_GRACE_S, K8sSpec

    body = {
        "launcher": "k8s",
        "nodes": 2,
        "gpus": 4,
        "k8s": {
            "namespace": "ml",
            "memory": "64Gi",
            "cpus": "500m",
            "node_selector": ["nvidia.com/gpu.product=H100"],
            "tolerations": ["nvidia.com/gpu:NoSchedule"],
            "callback": "10.0.3.7:7077",
            "timeout": 600,
            "deadline": None,
            "grace": None,
        },
    }
    shape = shape_from_json(body).shape
    assert shape.k8s == K8sSpec(
        namespace="ml",
        memory="64Gi",
        cpus="500m",
        node_selector=("nvidia.com/gpu.product=H100",),
        tolerations=("nvidia.com/gpu:NoSchedule",),
        callback="10.0.3.7:7077",
        timeout=600,
    )
    assert (shape.k8s.deadline, shape.k8s.grace) == (DEFAULT_DEADLINE_S, DEFAULT_GRACE_S)
    validate_request(shape)
    # the k8s object without launcher k8s, or beside hosts, is refused before anything starts
    lone = shape_from_json({"procs": 1, "k8s": {"namespace": "ml"}}).shape
    assert "k8s options without --k8s" in refused(validate_request, lone)
    hosts = shape_from_json({**body, "hosts": "a,b"}).shape
    assert "--k8s and --hosts/--hostfile: give one" in refused(validate_request, hosts)
    ray = shape_from_json({**body, "launcher": "ray"}).shape
    assert "--ray and --k8s options: give one cluster manager" in refused(validate_request, ray)


def test_a_framework_in_a_body_is_checked_like_the_magics() -> None:
    assert shape_from_json({"framework": "jax"}).shape.framework == "jax"
    assert "framework: '7' is not a str" in refused(shape_from_json, {"framework": 7})
    shape = shape_from_json({"framework": "tensorflow"}).shape
    message = refused(validate_request, shape)
    assert "--framework 'tensorflow': expected one of torch, jax, none" in message


def test_huge_counts_in_a_body_pass_parsing_and_stop_at_the_shape() -> None:
    """Parsing keeps what the body says; `validate_request` (before any agent) refuses it."""
    shape = shape_from_json({"procs": 10**12}).shape
    assert f"at most {MAX_WORLD_SIZE} ranks" in refused(validate_request, shape)
    shape = shape_from_json({"nodes": 10**12}).shape
    assert f"at most {MAX_NODES} nodes" in refused(validate_request, shape)


def test_a_node_list_never_reaches_scontrol_as_an_option() -> None:
    from jupyter_dist.common.cluster_env import expand_nodelist

    assert "node list '-h[1-2]' starts with '-'" in refused(expand_nodelist, "-h[1-2]")
