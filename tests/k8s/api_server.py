"""An emulated Kubernetes API server on 127.0.0.1, with a kubelet in the same process.

    python -m tests.k8s.api_server --port 0 --kubeconfig OUT [--deny create:jobs ...]
        [--nodes 2 --node-gpus 0 --node-cpus 4 --node-memory 16Gi] [--workdir DIR]
        [--node-resource 1:nvidia.com/mig-1g.10gb=7 ...] [--no-kueue]

What it plays: the API server's REST surface for the kinds in ``kinds.py``: discovery (so
kr8s finds kinds), create / get / list / patch / delete of namespaced and cluster-scoped
objects (kmock's ``KubernetesEmulator`` stores them), metadata the server owns (``uid``,
``creationTimestamp``, ``resourceVersion``, ``generateName``), Secret ``stringData``,
label and field selectors on lists, bearer-token authentication (401 without the token),
RBAC denials of chosen verbs (403 with the API server's Status and wording), schema
checks of what the notebook's user creates (422 Invalid naming the field), the
PodSecurity admission of the ``restricted`` level for every pod created in a namespace
labelled ``pod-security.kubernetes.io/enforce: restricted`` (403 naming each violation,
``pod_security.py``; the Job controller's pods too, which it reports as a FailedCreate
Event on the Job; namespaces are served for their labels alone: create, get, list, merge
patch and delete, outside RBAC, as kmock cannot route them), pod logs
(``pods/NAME/log``, the files the kubelet writes) and TokenReview (kr8s' whoami). It
writes a kubeconfig whose user is ``system:serviceaccount:default:notebook``, then prints
``READY <url>`` on stdout.

The kubelet, scheduler, Job controller, queue controller (playing Kueue, whose API group
``kueue.x-k8s.io`` discovery then lists; ``--no-kueue``: a cluster without it) and garbage
collector (``kubelet.py``) run in this process as a second client of this HTTP API with
their own token, which no ``--deny`` touches: they never read the emulator's memory.

What it does not play: watches (kmock's deliver nothing: poll), admission beyond the
schema and PodSecurity's restricted level (no defaulting, no semantic checks but a Job's
immutable template and its completions, which change only with parallelism), schema
checks of patches, resourceVersion conflicts, finalizers beyond what kmock does, strategic
merge patches (a patch is a JSON merge patch: lists are replaced), TLS, real containers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import itertools
import json
import logging
import re
import secrets
import signal
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering  # kmock's request type; not re-exported as a module

from tests.k8s.kinds import KINDS, Kind, matches_field_selector, matches_label_selector
from tests.k8s.pod_security import ENFORCE_LABEL, forbidden_message, violations

__all__ = ["NOTEBOOK_USER", "EmulatedApiServer", "main", "parse_deny", "write_kubeconfig"]

log = logging.getLogger("k8s.api")

#: who the kubeconfig's token authenticates as
NOTEBOOK_USER = "system:serviceaccount:default:notebook"
#: the Kubernetes version the server reports and whose schema it checks objects against
SCHEMA_VERSION = "1.33"
VERBS = ("create", "get", "list", "watch", "patch", "update", "delete", "deletecollection")
#: kmock keeps every request it served; past this many the oldest are dropped
_KEEP_REQUESTS = 500
#: a namespace's path, which kmock reads as the prefix of a namespaced one
_NAMESPACE_PATH = re.compile(r"/api/v1/namespaces(?:/(?P<name>[^/]+))?")


def now_iso() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    return body


def deny_arg(spec: str) -> tuple[str, str]:
    """``parse_deny`` for argparse, which shows an ArgumentTypeError's message as is."""
    try:
        return parse_deny(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def parse_deny(spec: str) -> tuple[str, str]:
    """``create:jobs`` -> ``("create", "jobs")``; the resource may name a subresource
    (``patch:pods/status``). A bad verb or resource raises ValueError naming it."""
    verb, sep, resource = spec.partition(":")
    if not sep or verb not in VERBS or resource.split("/")[0] not in KINDS:
        raise ValueError(
            f"--deny {spec!r}: expected VERB:RESOURCE with VERB one of {', '.join(VERBS)}"
            f" and RESOURCE one of {', '.join(sorted(KINDS))} (optionally /SUBRESOURCE)"
        )
    return verb, resource


def node_resource_arg(spec: str) -> tuple[int, str, int]:
    """``1:nvidia.com/mig-1g.10gb=7`` -> node 1 offers 7 of that extended resource."""
    node, colon, rest = spec.partition(":")
    name, eq, count = rest.rpartition("=")
    if not (colon and eq and node.isdigit() and "/" in name and count.isdigit()):
        raise argparse.ArgumentTypeError(
            f"--node-resource {spec!r}: expected NODE:DOMAIN/NAME=COUNT, e.g. "
            "1:nvidia.com/mig-1g.10gb=7"
        )
    return int(node), name, int(count)


def verb_of(request: rendering.Request) -> str:
    """The RBAC verb of a request, as the API server's authorizer names it."""
    method = str(request.method.value if request.method else "").upper()
    named = request.name is not None
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if named else "list"
    if method == "POST":
        return "create"
    if method == "PATCH":
        return "patch"
    if method == "PUT":
        return "update"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return method.lower()


def forbidden(kind: Kind, verb: str, request: rendering.Request) -> dict[str, Any]:
    """The 403 Status the API server answers for an RBAC denial, worded as it words it."""
    resource = f"{kind.plural}/{request.subresource}" if request.subresource else kind.plural
    subject = f'{kind.qualified} "{request.name}"' if request.name else kind.qualified
    where = (
        f'in the namespace "{request.namespace}"'
        if kind.namespaced and request.namespace
        else "at the cluster scope"
    )
    message = (
        f'{subject} is forbidden: User "{NOTEBOOK_USER}" cannot {verb} resource'
        f' "{resource}" in API group "{kind.group}" {where}'
    )
    details: dict[str, Any] = {"group": kind.group, "kind": kind.plural}
    if request.name:
        details["name"] = request.name
    return status_body(403, "Forbidden", message, details)


def _check_job_patch(name: str, patch: Mapping[str, Any]) -> None:
    """What the API server refuses of a patch to a Job's spec: its pod template, and
    completions changed without parallelism to the same value (an Indexed Job's are
    mutable only in tandem, Kubernetes' elastic Indexed Job)."""
    spec = patch.get("spec") or {}
    problem = ""
    if "template" in spec:
        problem = "spec.template: Invalid value: ...: field is immutable"
    elif "completions" in spec and spec.get("parallelism") != spec["completions"]:
        problem = (
            f"spec.completions: Invalid value: {spec['completions']}: can only be modified "
            "in tandem with spec.parallelism"
        )
    if problem:
        raise kmock.KubernetesError(
            status=422, reason="Invalid", message=f'Job.batch "{name}" is invalid: {problem}'
        )


def _random_suffix(length: int = 5) -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generated names
    return "".join(secrets.choice(alphabet) for _ in range(length))


@attrs.define(kw_only=True)
class EmulatedApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with authentication, RBAC denials, server-owned metadata, Secret
    ``stringData``, selectors on lists and pod logs."""

    user_token: str
    kubelet_token: str
    denied: frozenset[tuple[str, str]] = frozenset()
    pod_log_dir: Path | None = None
    #: whether Kueue runs: its API group is listed by discovery (its objects are not kept)
    kueue: bool = True
    #: the namespaces created, by name (kmock cannot route them)
    namespaces: dict[str, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kr8s asks for "/version/" (the real API server ignores a trailing slash)
        self.fallback["get /version/"] << self._serve_server_version
        self.fallback["get /api/"] << self._serve_api
        self.fallback["get /apis/"] << self._serve_apis
        for k in KINDS.values():
            self.resources[k.key] = kmock.ResourceInfo(
                namespaced=k.namespaced,
                kind=k.kind,
                singular=k.kind.lower(),
                verbs=set(VERBS),
                shortnames=set(k.short_names),
                subresources=set(k.subresources),
            )
        if self.kueue:
            self.resources["kueue.x-k8s.io/v1beta1/workloads"] = kmock.ResourceInfo(
                namespaced=True, kind="Workload", singular="workload", verbs={"get", "list"}
            )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        self._forget_old_requests()
        auth = request.headers.get("Authorization", "")
        if auth not in (f"Bearer {self.user_token}", f"Bearer {self.kubelet_token}"):
            log.info("401 %s %s: no valid bearer token", verb_of(request), request.url.path)
            return aiohttp.web.json_response(
                status_body(401, "Unauthorized", "Unauthorized"), status=401
            )
        if request.url.path.rstrip("/").endswith("/tokenreviews") and isinstance(
            request.data, dict
        ):
            return self._token_review(request.data)
        kind = KINDS.get(request.resource.plural or "") if request.resource else None
        if kind is not None:
            verb = verb_of(request)
            resource = (
                f"{kind.plural}/{request.subresource}" if request.subresource else kind.plural
            )
            is_user = auth == f"Bearer {self.user_token}"
            if is_user and (verb, resource) in self.denied:
                body = forbidden(kind, verb, request)
                log.info("403 %s", body["message"])
                return aiohttp.web.json_response(body, status=403)
            if kind.plural == "pods" and request.subresource == "log":
                return self._pod_log(request)
            if isinstance(request.data, dict):
                if verb == "create" and request.subresource is None:
                    if is_user:
                        _validate(kind, request.data)
                    self._fill_metadata(kind, request)
                    if kind.plural == "pods":
                        self._admit_pod(request.namespace or "default", request.data)
                elif verb == "patch" and request.subresource is None:
                    if is_user and kind.plural == "jobs":
                        _check_job_patch(request.name or "", request.data)
                    request.data.setdefault("metadata", {})["resourceVersion"] = str(
                        next(self._versions)
                    )
                if kind.plural == "secrets":
                    _string_data_to_data(request.data)
            if verb == "delete" and kind.plural == "jobs":
                policy = (
                    (request.data or {}).get("propagationPolicy")
                    if isinstance(request.data, dict)
                    else None
                )
                policy = policy or request.params.get("propagationPolicy")
                if policy in (None, "Orphan"):
                    log.warning(
                        "job %s deleted with propagationPolicy %s: a real cluster would orphan"
                        " its pods (this one collects them anyway)",
                        request.name,
                        policy,
                    )
            if verb in ("create", "patch", "update", "delete"):
                name = request.name
                if name is None and isinstance(request.data, dict):
                    name = request.data.get("metadata", {}).get("name")
                where = f"{request.namespace}/" if request.namespace else ""
                log.info("%s %s %s%s", verb, resource, where, name)
        return await super()._handle(request)

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        # kmock says 1.26 (k3s), which kr8s warns it does not support
        major, minor = SCHEMA_VERSION.split(".")
        return {
            "major": major,
            "minor": minor,
            "gitVersion": f"v{SCHEMA_VERSION}.0",
            "platform": "linux/amd64",
        }

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        listing = await super()._serve_list(request)
        assert isinstance(listing, dict)
        items = listing["items"]
        labels = request.params.get("labelSelector")
        fields = request.params.get("fieldSelector")
        try:
            if labels:
                items = [
                    i
                    for i in items
                    if matches_label_selector(i.get("metadata", {}).get("labels") or {}, labels)
                ]
            if fields:
                items = [i for i in items if matches_field_selector(i, fields)]
        except ValueError as e:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(e)) from e
        kind = KINDS.get(request.resource.plural or "") if request.resource else None
        listing["items"] = items
        if kind is not None:
            listing["kind"] = f"{kind.kind}List"
            listing["apiVersion"] = kind.api_version
        listing["metadata"] = {"resourceVersion": str(next(self._versions))}
        return listing

    def _fill_metadata(self, kind: Kind, request: rendering.Request) -> None:
        data: dict[str, Any] = request.data
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + _random_suffix()
        if not meta.get("name"):
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f"{kind.kind} is invalid: metadata.name: Required value: name or"
                " generateName is required",
            )
        if kind.namespaced:
            meta["namespace"] = request.namespace or meta.get("namespace") or "default"
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        meta["resourceVersion"] = str(next(self._versions))
        meta.setdefault("generation", 1)
        data.setdefault("apiVersion", kind.api_version)
        data.setdefault("kind", kind.kind)

    def _admit_pod(self, namespace: str, pod: dict[str, Any]) -> None:
        """PodSecurity admission: a namespace labelled to enforce ``restricted`` refuses a
        pod that violates it (403 Forbidden, naming each violation)."""
        labels = (self.namespaces.get(namespace) or {}).get("metadata", {}).get("labels") or {}
        if labels.get(ENFORCE_LABEL) != "restricted":
            return
        found = violations(pod.get("spec") or {})
        if found:
            message = forbidden_message(pod, found)
            log.info("403 %s", message)
            raise kmock.KubernetesError(status=403, reason="Forbidden", message=message)

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        namespace_path = _NAMESPACE_PATH.fullmatch(raw.path.rstrip("/"))
        if namespace_path is None:
            return await super().__call__(raw)
        auth = raw.headers.get("Authorization", "")
        if auth not in (f"Bearer {self.user_token}", f"Bearer {self.kubelet_token}"):
            return aiohttp.web.json_response(
                status_body(401, "Unauthorized", "Unauthorized"), status=401
            )
        body = await raw.json() if raw.can_read_body else {}
        return self._namespace(raw.method.upper(), namespace_path["name"], body or {})

    def _namespace(
        self, method: str, name: str | None, body: dict[str, Any]
    ) -> aiohttp.web.Response:
        """``/api/v1/namespaces[/NAME]``: create, get, list, merge-patch (labels), delete."""
        if name is None and method == "GET":
            items = [self.namespaces[n] for n in sorted(self.namespaces)]
            return aiohttp.web.json_response(
                {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {}, "items": items}
            )
        if name is None and method == "POST":
            name = str((body.get("metadata") or {}).get("name") or "")
            if name in self.namespaces or not name:
                status = status_body(409, "AlreadyExists", f'namespaces "{name}" already exists')
                return aiohttp.web.json_response(status, status=409)
            meta = {**(body.get("metadata") or {}), "uid": str(uuid.uuid4())}
            meta["creationTimestamp"] = now_iso()
            self.namespaces[name] = {
                "apiVersion": "v1", "kind": "Namespace", "metadata": meta,
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"},
            }  # fmt: skip
            log.info("create namespaces %s %s", name, meta.get("labels") or {})
            return aiohttp.web.json_response(self.namespaces[name], status=201)
        found = self.namespaces.get(name or "")
        if found is None:
            status = status_body(404, "NotFound", f'namespaces "{name}" not found')
            return aiohttp.web.json_response(status, status=404)
        if method == "PATCH":
            for key in ("labels", "annotations"):
                patch = (body.get("metadata") or {}).get(key)
                if isinstance(patch, dict):
                    mine = found["metadata"].setdefault(key, {})
                    mine.update(patch)
                    for gone in [k for k, v in patch.items() if v is None]:
                        del mine[gone]
            log.info("patch namespaces %s", name)
        elif method == "DELETE":
            del self.namespaces[name or ""]
            log.info("delete namespaces %s", name)
        return aiohttp.web.json_response(found)

    def _token_review(self, review: dict[str, Any]) -> aiohttp.web.StreamResponse:
        """``authentication.k8s.io/v1`` TokenReview (what ``kr8s``' whoami asks)."""
        token = review.get("spec", {}).get("token")
        users = {self.user_token: NOTEBOOK_USER, self.kubelet_token: "system:node:emulated"}
        status: dict[str, Any] = {"authenticated": token in users}
        if token in users:
            status["user"] = {"username": users[token], "groups": ["system:authenticated"]}
        return aiohttp.web.json_response({**review, "status": status}, status=201)

    def _pod_log(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        file = (
            self.pod_log_dir or Path("/nonexistent")
        ) / f"{request.namespace}_{request.name}.log"
        if not file.exists():
            body = status_body(
                404,
                "NotFound",
                f'pods "{request.name}" not found or its container has not started',
            )
            return aiohttp.web.json_response(body, status=404)
        text = file.read_text(errors="replace")
        tail = request.params.get("tailLines")
        if tail is not None:
            text = "".join(text.splitlines(keepends=True)[-int(tail) :])
        return aiohttp.web.Response(text=text, content_type="text/plain")

    def _forget_old_requests(self) -> None:
        """kmock records every request for assertions; a long-lived server polled by its
        kubelet would grow without bound, so keep only the latest ones."""
        if len(self._requests) > 2 * _KEEP_REQUESTS:
            del self._requests[:-_KEEP_REQUESTS]
            for payload in self._payloads:
                kept = getattr(payload, "_requests", None)
                if isinstance(kept, list):
                    del kept[:-_KEEP_REQUESTS]


def _validate(kind: Kind, obj: dict[str, Any]) -> None:
    """Check a created object against the Kubernetes OpenAPI schema of ``SCHEMA_VERSION``
    (kubernetes-validate). Stricter than the API server, which by default drops unknown
    fields with a warning: here they are refused, so a misspelt field shows."""
    import kubernetes_validate

    body = {"apiVersion": kind.api_version, "kind": kind.kind, **obj}
    try:
        kubernetes_validate.validate(body, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path).lstrip(".")
        name = obj.get("metadata", {}).get("name") or obj.get("metadata", {}).get("generateName")
        raise kmock.KubernetesError(
            status=422,
            reason="Invalid",
            message=f'{kind.kind}.{kind.group or "core"} "{name}" is invalid: {where or "<root>"}:'
            f" {e.message.splitlines()[0]} (checked against the {SCHEMA_VERSION} schema)",
            details={"name": name, "group": kind.group, "kind": kind.kind},
        ) from None


def _string_data_to_data(secret: dict[str, Any]) -> None:
    """The API server folds a Secret's ``stringData`` into base64 ``data`` on write."""
    string_data = secret.pop("stringData", None)
    if string_data:
        data = secret.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def write_kubeconfig(out: Path, url: str, token: str, namespace: str = "default") -> None:
    """A kubeconfig (JSON is YAML) with one cluster, one token user, one current context."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulated", "cluster": {"server": url}}],
        "users": [{"name": "notebook", "user": {"token": token}}],
        "contexts": [
            {
                "name": "emulated",
                "context": {"cluster": "emulated", "user": "notebook", "namespace": namespace},
            }
        ],
        "current-context": "emulated",
        "preferences": {},
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2))
    tmp.chmod(0o600)
    tmp.replace(out)


async def serve(args: argparse.Namespace) -> None:
    from tests.k8s.kubelet import Kubelet, NodeShape

    workdir = Path(args.workdir or Path(args.kubeconfig).parent / "k8s-cluster")
    workdir.mkdir(parents=True, exist_ok=True)
    user_token = args.token or secrets.token_urlsafe(24)
    server = EmulatedApiServer(
        user_token=user_token,
        kubelet_token=secrets.token_urlsafe(24),
        denied=frozenset(args.deny),
        pod_log_dir=workdir / "logs",
        kueue=not args.no_kueue,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server, kmock.Server(server, host="127.0.0.1", port=args.port) as http:
        url = f"http://127.0.0.1:{http.port}"
        kubelet = Kubelet(
            url=url,
            token=server.kubelet_token,
            nodes=[
                NodeShape(
                    f"node-{i}",
                    args.node_cpus,
                    args.node_memory,
                    args.node_gpus,
                    tuple((n, c) for node, n, c in args.node_resource if node == i),
                )
                for i in range(args.nodes)
            ],
            workdir=workdir,
            api_port=http.port,
            kueue=not args.no_kueue,
        )
        write_kubeconfig(Path(args.kubeconfig), url, user_token)
        log.info(
            "API server on %s, kubeconfig %s, denied %s", url, args.kubeconfig, sorted(args.deny)
        )
        async with kubelet:
            print(f"READY {url}", flush=True)
            await stop.wait()
            log.info("stopping: terminating every pod process")
    log.info("stopped")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.k8s.api_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument("--token", default=None, help="the user's bearer token (random if unset)")
    parser.add_argument(
        "--deny", type=deny_arg, action="append", default=[], metavar="VERB:RESOURCE"
    )
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--node-gpus", type=int, default=0)
    parser.add_argument("--node-cpus", type=int, default=4)
    parser.add_argument("--node-memory", default="16Gi")
    parser.add_argument(
        "--node-resource",
        type=node_resource_arg,
        action="append",
        default=[],
        metavar="NODE:NAME=COUNT",
        help="an extended resource node NODE offers (repeatable)",
    )
    parser.add_argument("--no-kueue", action="store_true", help="no Kueue in this cluster")
    parser.add_argument("--workdir", default=None, help="pod logs, volumes and pods.json")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error(f"--nodes {args.nodes}: expected at least 1")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
