"""REST handlers of the server extension: parse the request, call the SessionManager,
return JSON. Every handler is authenticated and authorized; domain errors become HTTP
statuses in one place (`STATUS_OF`, applied by `maps_errors`). The API is described in
``rest-api.yaml``; its bodies are typed in `common.payloads`."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from http.client import responses
from typing import Any, Concatenate, ParamSpec, TypeVar

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_dist.common import stacks
from jupyter_dist.common.hosts import (
    MAX_NODES,
    HostSpec,
    check_host,
    check_node_count,
    check_python,
    check_ssh_config,
    parse_host,
    parse_hosts,
)
from jupyter_dist.common.k8s_options import K8sSpec, read_pod_template
from jupyter_dist.common.payloads import ServerEvent, SessionStatus, StacksReply
from jupyter_dist.common.ray_options import RaySpec, check_strategy
from jupyter_dist.common.spec import (
    DEFAULT_SESSION,
    ShapeRequest,
    check_session_name,
    parse_ranks,
    validate_request,
)
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.control.cell_queue import MAX_PATH_CHARS, Sender
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.errors import (
    AgentError,
    DistError,
    LimitError,
    RanksFailed,
    ShapeMismatchError,
    SpecError,
    UnknownSession,
)
from jupyter_dist.server.notebook_files import NotebookFiles
from jupyter_dist.server.notebook_kernels import check_sender, prune

AUTH_RESOURCE = "jupyter_dist"

#: most specific first: the first match decides the status
STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownSession, 404),
    (ShapeMismatchError, 409),
    (LimitError, 409),  # the sessions running now leave no room: shutting one down makes it
    (SpecError, 400),
    (asyncio.TimeoutError, 504),
    (AgentError, 502),
    (RanksFailed, 502),
    (DistError, 409),
)

#: field -> the JSON types it may have
REQUEST_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "nodes": (int,),
    "gpus": (int, list),  # one count, or one per node
    "procs": (int, list),
    "backend": (str,),
    "hosts": (str, list),  # "a,b" or [{"name": "a", "user": ..., "port": ..., "slots": ...}]
    "python": (str,),
    "ssh_config": (str,),
    "launcher": (str,),
    "ray": (dict,),  # with launcher "ray": a `RaySpecJSON` (address, strategy, cpus, ...)
    "k8s": (dict,),  # with launcher "k8s": a `K8sSpecJSON` (namespace, image, memory, ...)
    "init": (bool,),
    "framework": (str,),  # torch (default), jax or none
    "cwd": (str,),  # where the ranks run (default: the server's folder)
    "env": (dict,),  # variables the ranks get on top of the server's environment
    "notebook": (str,),  # the session is named after this notebook (its path)
    "profile": (str,),  # a profile of the server's: its fields, under the request's
}
#: ``ray`` field -> the JSON types it may have (`RaySpec` checks the values)
RAY_FIELDS: dict[str, tuple[type, ...]] = {
    "address": (str,),  # HOST:PORT or "auto"; absent or null: RAY_ADDRESS, else auto
    "strategy": (str,),
    "runtime_env": (str,),  # JSON text of an object
    "cpus": (int,),
    "gpus": (int,),  # absent or null: each node's --gpus count
    "timeout": (int, float),  # seconds to wait for room; absent or null: the start timeout
    "resources": (str,),  # --ray-resources: NAME=AMOUNT,... or JSON text of an object
}
#: ``k8s`` field -> the JSON types it may have (`K8sSpec` checks the values); absent or
#: null: the ``--k8s`` option's default
K8S_FIELDS: dict[str, tuple[type, ...]] = {
    "namespace": (str,),
    "context": (str,),  # a kubeconfig context's name
    "image": (str,),
    "cpus": (str,),  # Kubernetes quantities, as text: "8", "500m"
    "memory": (str,),  # "64Gi"
    "node_selector": (list,),  # ["key=value", ...]
    "tolerations": (list,),  # ["key[=value]:Effect", ...]
    "pod_template": (str,),  # a file on the server's machine, read before anything starts
    "callback": (str,),  # HOST:PORT the pods dial
    "timeout": (int, float),
    "deadline": (int,),
    "grace": (int, float),
    "queue": (str,),  # a Kueue LocalQueue: the Job waits suspended until it admits it
    "queue_timeout": (int, float),
    "gang_timeout": (int, float),  # seconds for every pod to be on a machine
    "priority_class": (str,),
    "scheduler": (str,),
    "gpu_resource": (str,),  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu"
}
#: the fields of a host given as an object
HOST_FIELDS = ("name", "user", "port", "slots", "python")
#: a bigger request body is refused unread: no session needs one
MAX_BODY_BYTES = 1 << 20
#: seconds the file system gets to answer whether ``cwd`` or ``ssh_config`` is there
FILE_CHECK_S = 10.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


@dataclass(frozen=True)
class CreateRequest:
    name: str
    shape: ShapeRequest
    cwd: str | None
    env: dict[str, str] | None
    notebook: str = ""


def _counts(key: str, value: Any) -> int | tuple[int, ...] | None:
    if value is None or isinstance(value, int):
        return value
    check_node_count(len(value), key)
    if not value or not all(type(v) is int for v in value):
        raise SpecError(f"{key}: {value!r} is not a count or a list of counts")
    return tuple(value)


def _hosts(value: Any) -> tuple[HostSpec, ...]:
    """``"a,alice@b:2222"`` or ``[{"name": "a"}, {"name": "b", "user": "alice", ...}]``:
    either way each field is checked as ``--hosts`` and hostfiles check it."""
    if isinstance(value, str):
        return parse_hosts(value, "hosts") if value.strip() else ()
    if not value:
        return ()
    check_node_count(len(value), "hosts")
    hosts = []
    for index, entry in enumerate(value):
        where = f"hosts[{index}]"
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: {entry!r} is not a host; expected {{'name': ...}}")
        unknown = sorted(set(entry) - set(HOST_FIELDS))
        if unknown:
            raise SpecError(
                f"{where}: unknown field {unknown[0]!r}; expected some of {list(HOST_FIELDS)}"
            )
        hosts.append(check_host(entry, where))
    found = tuple(hosts)
    seen: set[str] = set()
    for host in found:
        if str(host) in seen:
            raise SpecError(f"hosts: {str(host)!r} is listed twice; give each node once")
        seen.add(str(host))
    return found


def _env(value: dict[str, Any] | None) -> dict[str, str] | None:
    """Variables for the ranks: names as a shell takes them, string values."""
    if value is None:
        return None
    for name, val in value.items():
        if not _ENV_NAME.fullmatch(name):
            raise SpecError(
                f"env: {name[:80]!r} is not a variable name (letters, digits and '_', not "
                "starting with a digit)"
            )
        if not isinstance(val, str):
            raise SpecError(f"env: expected an object of strings; {name} is {str(val)[:80]!r}")
        if "\0" in val:
            raise SpecError(f"env: {name}: its value holds a NUL character")
    return dict(value)


def _ray(value: dict[str, Any] | None) -> RaySpec | None:
    """The ``ray`` object, each field typed, then checked as the ``--ray-*`` options are
    (the strategy in any case); every error starts with ``ray``."""
    if value is None:
        return None
    fields = dict(value)
    for key, kinds in RAY_FIELDS.items():
        got = fields.get(key)
        if got is not None and type(got) not in kinds:
            expected = " or ".join(k.__name__ for k in kinds)
            raise SpecError(f"ray.{key}: {str(got)[:80]!r} is not a {expected}")
    try:
        if "strategy" in fields:
            fields["strategy"] = check_strategy(fields["strategy"])
        return RaySpec.from_json(fields)
    except SpecError as err:
        message = str(err)
        raise SpecError(message if message.startswith("ray:") else f"ray: {message}") from None


def _k8s(value: dict[str, Any] | None) -> K8sSpec | None:
    """The ``k8s`` object, each field typed, then checked as the ``--k8s`` options are;
    every error starts with ``k8s``. The pod template is read later (`check_files`)."""
    if value is None:
        return None
    for key, kinds in K8S_FIELDS.items():
        got = value.get(key)
        if got is not None and type(got) not in kinds:
            expected = " or ".join(k.__name__ for k in kinds)
            raise SpecError(f"k8s.{key}: {str(got)[:80]!r} is not a {expected}")
    fields = {k: v for k, v in value.items() if v is not None or k not in K8S_FIELDS}
    try:
        return K8sSpec.from_json(fields)
    except SpecError as err:
        message = str(err)
        raise SpecError(message if message.startswith("k8s") else f"k8s: {message}") from None


def _notebook(value: str | None) -> str:
    if value is None:
        return ""
    if len(value) > MAX_PATH_CHARS or any(ord(c) < 32 for c in value):
        raise SpecError(
            f"notebook {value[:80]!r}: expected a notebook's path on the server, of at most "
            f"{MAX_PATH_CHARS} characters"
        )
    return value.strip("/")


def _cwd(value: str | None) -> str | None:
    if value is None:
        return None
    if "\0" in value or not os.path.isabs(value):
        raise SpecError(f"cwd {value[:200]!r}: expected an absolute path")
    return value


def without_output(status: SessionStatus) -> SessionStatus:
    """``status`` without what the ranks printed (the end of a dead rank's log), for a
    user who may not run code: reading the ranks' output needs what running code needs."""
    return {**status, "ranks": [{**r, "exit_tail": ""} for r in status["ranks"]]}


def event_without_output(event: ServerEvent) -> ServerEvent:
    """``event``, its session statuses `without_output`."""
    if event["type"] == "snapshot":
        return {**event, "sessions": [without_output(s) for s in event["sessions"]]}
    if event["type"] == "session":
        return {**event, "session": without_output(event["session"])}
    return event


def decode_json_body(raw: bytes) -> Any:
    """A request body -> its JSON value (None when empty); SpecError naming what is wrong
    when it is not UTF-8 JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(
            f"the request body is not UTF-8 text (byte {err.start} is "
            f"{raw[err.start : err.start + 1]!r}); expected a JSON object in UTF-8"
        ) from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as err:
        raise SpecError(f"the request body is not JSON ({err}); expected a JSON object") from None


def shape_from_json(body: Any) -> CreateRequest:
    """A POST body -> what to start, and where; refuses unknown or mistyped fields, and
    checks each value before anything is built from it (nothing here touches a file)."""
    if not isinstance(body, dict):
        raise SpecError("expected a JSON object with the session's name and shape")
    unknown = sorted(set(body) - set(REQUEST_FIELDS))
    if unknown:
        raise SpecError(
            f"unknown field {unknown[0][:80]!r}; expected some of {sorted(REQUEST_FIELDS)}"
        )
    for key, kinds in REQUEST_FIELDS.items():
        value = body.get(key)
        if value is not None and type(value) not in kinds:
            expected = " or ".join(k.__name__ for k in kinds)
            raise SpecError(f"{key}: {str(value)[:80]!r} is not a {expected}")
    python = body.get("python")
    shape = ShapeRequest(
        nodes=body.get("nodes"),
        gpus=_counts("gpus", body.get("gpus")),
        procs=_counts("procs", body.get("procs")),
        backend=body.get("backend"),
        init=body.get("init"),
        framework=body.get("framework"),
        hosts=_hosts(body.get("hosts")),
        python=None if python is None else check_python(python, "python"),
        ssh_config=body.get("ssh_config"),
        launcher=body.get("launcher"),
        ray=_ray(body.get("ray")),
        k8s=_k8s(body.get("k8s")),
    )
    name = check_session_name(body.get("name") or DEFAULT_SESSION)
    return CreateRequest(
        name, shape, _cwd(body.get("cwd")), _env(body.get("env")), _notebook(body.get("notebook"))
    )


async def check_files(req: CreateRequest) -> None:
    """``cwd`` is a folder, ``ssh_config`` a readable file and a k8s session's pod
    template a pod template, of this machine; asked in a thread, so that a hung file system
    holds up this request only."""
    k8s = req.shape.k8s if req.shape.launcher == "k8s" else None
    template = k8s.pod_template if k8s is not None else None

    def check() -> None:
        if req.cwd is not None and not os.path.isdir(req.cwd):
            raise SpecError(f"cwd {req.cwd!r}: no such folder on the server's machine")
        if req.shape.ssh_config is not None:
            check_ssh_config(req.shape.ssh_config, "ssh_config")
        if template is not None:
            try:
                read_pod_template(template)
            except SpecError as err:
                raise SpecError(f"k8s: {err}") from None

    if req.cwd is None and req.shape.ssh_config is None and template is None:
        return
    try:
        await asyncio.wait_for(asyncio.to_thread(check), FILE_CHECK_S)
    except asyncio.TimeoutError:
        asked = [
            f"{what} {path!r}"
            for what, path in (
                ("cwd", req.cwd),
                ("ssh_config", req.shape.ssh_config),
                ("k8s.pod_template", template),
            )
            if path is not None
        ]
        raise SpecError(
            f"{' / '.join(asked)}: the file system did not answer within {FILE_CHECK_S:.0f} s"
        ) from None


class DistHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> SessionManager:
        manager: SessionManager = self.settings["jupyter_dist_manager"]
        return manager

    def fail(self, err: BaseException) -> web.HTTPError:
        for kind, status in STATUS_OF:
            if isinstance(err, kind):
                # the reason phrase names the error, so a client can raise the same one
                return web.HTTPError(
                    status, str(err) or type(err).__name__, reason=type(err).__name__
                )
        raise err

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """As `APIHandler.write_error`, but with the message as it was written: tornado's
        ``HTTPError.log_message`` doubles every ``%`` of a message given without
        arguments (``%%distributed`` came back as ``%%%%distributed``)."""
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        if not isinstance(error, web.HTTPError) or error.reason is None:
            super().write_error(status_code, **kwargs)
            return
        self.set_header("Content-Type", "application/json")
        message = error.get_message() or responses.get(status_code, "Unknown HTTP Error")
        self.log.warning("wrote error: %r", message)
        self.finish(json.dumps({"message": message, "reason": error.reason}))

    async def sender(self) -> Sender:
        """Who sends this request: the ``path`` and ``kernel_id`` query arguments a
        notebook kernel adds (the sidebar says ``path=JupyterLab``); a kernel id must be
        one of this server's notebook kernels (`server.notebook_kernels`)."""
        sender = Sender.from_json(
            {
                "path": self.get_query_argument("path", ""),
                "kernel_id": self.get_query_argument("kernel_id", ""),
            },
            "query",
        )
        return await self.checked(sender, "query: ")

    async def checked(self, sender: Sender, where: str) -> Sender:
        """``sender``, when the kernel it names is one of this server's, with the path its
        notebook has now and its file id (`server.notebook_files`): a kernel started
        before a rename still names the old path, which a new file may have since."""
        sender = check_sender(self.kernel_manager, sender, where)
        files: NotebookFiles = self.settings["jupyter_dist_files"]
        return await files.resolve(sender, self.settings)

    async def prune(self) -> None:
        """Forget the notebook kernels that are no longer this server's."""
        await prune(self.manager, self.kernel_manager)

    async def may_execute(self) -> bool:
        """Whether this request's user may run code (what ``@authorized("execute")``
        asks), and so read what the ranks printed."""
        allowed = await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "execute", AUTH_RESOURCE)
        )
        return bool(allowed)

    async def shown(self, status: SessionStatus) -> SessionStatus:
        """``status`` as this request's user may see it."""
        return status if await self.may_execute() else without_output(status)

    def json_body(self) -> Any:
        """The request's JSON body, refused unread past `MAX_BODY_BYTES`, and refused
        (400) when it is not UTF-8 JSON."""
        size = len(self.request.body or b"")
        if size > MAX_BODY_BYTES:
            raise SpecError(f"the request body has {size} bytes; expected at most {MAX_BODY_BYTES}")
        return decode_json_body(self.request.body or b"")


H = TypeVar("H", bound=DistHandler)
P = ParamSpec("P")


def maps_errors(
    method: Callable[Concatenate[H, P], Awaitable[None]],
) -> Callable[Concatenate[H, P], Coroutine[Any, Any, None]]:
    """Turn the domain errors ``method`` raises into their HTTP status (`DistHandler.fail`);
    any other exception goes on as it is. Put it below the auth decorators."""

    @functools.wraps(method)
    async def mapped(self: H, /, *args: P.args, **kwargs: P.kwargs) -> None:
        try:
            await method(self, *args, **kwargs)
        except BaseException as err:
            raise self.fail(err) from err

    return mapped


class SessionsHandler(DistHandler):
    """``/sessions``: list them, or start one."""

    #: the start this request waits for, and whether its caller hung up on it
    _starting: asyncio.Future[Any] | None = None
    _hung_up = False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.prune()
        statuses = self.manager.status()
        if not await self.may_execute():
            statuses = [without_output(s) for s in statuses]
        self.reply(statuses)

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def post(self) -> None:
        """Starting ranks runs programs (``python``, ``env``): as for kernels, that needs
        the ``execute`` permission. With ``?validate=true`` nothing starts: the request's
        fields are checked as a start checks them at once (what needs the nodes, a start
        finds out), for the new-session form before it closes, and the answer is 200
        ``{"valid": true, "name"}`` or ``{"valid": false, "message"}``, the message
        beginning with the bad field's name."""
        validate = self.get_query_argument("validate", "false")
        if validate not in ("true", "false"):
            raise SpecError(f"validate: {validate[:40]!r} is not 'true' or 'false'")
        from jupyter_dist.server.profile_requests import with_profile

        if validate == "true":
            try:
                req = shape_from_json(await with_profile(self.json_body()))
                await check_files(req)
                validate_request(req.shape)
            except SpecError as err:
                self.reply({"valid": False, "message": str(err)})
                return
            self.reply({"valid": True, "name": req.name})
            return
        req = shape_from_json(await with_profile(self.json_body()))
        await check_files(req)
        sender = await self.sender()
        # the notebook that asks is the session's, if it starts now
        notebook = sender if sender.kernel_id else Sender(req.notebook) if req.notebook else None
        # a start whose caller hangs up (the notebook's stop button, its kernel gone) is
        # stopped and undone, as an interrupted cell's is in the kernel: a session queued
        # on Kubernetes would otherwise wait on for nobody
        self._starting = starting = asyncio.ensure_future(
            self.manager.get_or_start(
                req.name, req.shape, cwd=req.cwd, env=req.env, notebook=notebook
            )
        )
        try:
            session, started = await starting
        except asyncio.CancelledError:
            if not self._hung_up:
                raise
            self.log.info("jupyter_dist: stopped the start of %r: its caller hung up", req.name)
            return
        self.reply(session.status(), 201 if started else 200)

    def on_connection_close(self) -> None:
        """The caller hung up: the start it waits for is stopped and undone."""
        super().on_connection_close()
        if self._starting is not None and not self._starting.done():
            self._hung_up = True
            self._starting.cancel()


class SessionHandler(DistHandler):
    """``/sessions/NAME``: look at one, or shut it down."""

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self, name: str) -> None:
        self.reply(await self.shown(self.manager.get(name).status()))

    @web.authenticated
    @authorized
    @maps_errors
    async def delete(self, name: str) -> None:
        why = self.manager.tell_action(name, "shutdown", await self.sender())
        await self.manager.shutdown(name, why)
        self.set_status(204)
        self.finish()


class ConnectionHandler(DistHandler):
    """``/sessions/NAME/connection``: the key and sockets of the rank kernels.

    Whoever holds these can run code on every rank, so the handler asks for the
    ``execute`` permission, not just ``read``. With ``?use=true`` (``%dist attach``) the
    asking notebook is listed as using the session; otherwise only its turns list it (a
    notebook that only interrupted or looked at the stacks does not use it).
    """

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def get(self, name: str) -> None:
        use = self.get_query_argument("use", "false")
        if use not in ("true", "false"):
            raise SpecError(f"use: {use[:40]!r} is not 'true' or 'false'")
        sender = await self.sender()  # a made-up kernel id is refused either way
        info = self.manager.get(name).connection_info()
        if use == "true":
            self.manager.attach(name, sender)
        self.reply(info)


class StacksHandler(DistHandler):
    """``POST /sessions/NAME/stacks?ranks=0,2-3``: every rank's Python stacks, in faulthandler's
    format (works while a rank is stuck in a collective).

    A POST that needs the ``execute`` permission: it asks every rank it names, and the
    dumps show the code the ranks run."""

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def post(self, name: str) -> None:
        session = self.manager.get(name)
        text = self.get_query_argument("ranks", "")
        ranks = parse_ranks(text, session.spec.world_size) if text else None
        dumps = await session.stacks(ranks)
        reply: StacksReply = {
            "stacks": {str(r): d for r, d in dumps.items()},
            "groups": [
                {
                    "ranks": group,
                    "place": place.text,
                    "frames": [
                        f'File "{f.file}", line {f.line}, in {f.func}' for f in place.frames
                    ],
                }
                for group, place in stacks.group_places(dumps)
            ],
        }
        self.reply(reply)


class SessionActionHandler(DistHandler):
    """``/sessions/NAME/interrupt`` and ``/sessions/NAME/restart``."""

    @web.authenticated
    @authorized
    @maps_errors
    async def post(self, name: str, action: str) -> None:
        session = self.manager.get(name)
        self.manager.tell_action(name, action, await self.sender())
        if action == "interrupt":
            await session.interrupt()
            self.set_status(204)
            self.finish()
            return
        await self.manager.restart(name)
        self.reply(await self.shown(session.status()))


#: spare hosts a heal or resize request may name
MAX_SPARES = 64
#: the longest reason for a new group a heal request may give
MAX_WHY_CHARS = 2000


def _list_of(body: dict[str, Any], key: str, kind: type, limit: int) -> list[Any]:
    """``body[key]``: a list of at most ``limit`` values of ``kind`` (none: empty)."""
    value = body.get(key, [])
    if not isinstance(value, list) or not all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    ):
        raise SpecError(f"{key}: expected a list of {kind.__name__} values, got {str(value)[:80]}")
    if len(value) > limit:
        raise SpecError(f"{key}: {len(value)} values; expected at most {limit}")
    return value


def _spares(body: dict[str, Any]) -> tuple[HostSpec, ...]:
    return tuple(parse_host(h, "spares") for h in _list_of(body, "spares", str, MAX_SPARES))


class SessionRecoveryHandler(DistHandler):
    """``/sessions/NAME/heal`` and ``/sessions/NAME/resize``: replace what failed, or give
    the session another shape; every surviving rank keeps its variables.
    ``/sessions/NAME/free``: free ranks stuck in a collective (`Session.free_from_collective`)."""

    @web.authenticated
    @authorized
    @maps_errors
    async def post(self, name: str, action: str) -> None:
        session = self.manager.get(name)
        body = self.json_body() if self.request.body else {}
        if not isinstance(body, dict):
            raise SpecError(f"the body: expected a JSON object, got {type(body).__name__}")
        if action == "free":
            ranks = _list_of(body, "ranks", int, session.spec.world_size)
            session.check_ranks(ranks)
            self.reply({"ranks": await session.free_from_collective(ranks)})
            return
        spares = _spares(body)
        if action == "heal":
            ranks = _list_of(body, "ranks", int, session.spec.world_size)
            session.check_ranks(ranks)
            auto = body.get("auto")
            if auto is not None and not isinstance(auto, bool):
                raise SpecError(f"auto: expected true or false, got {str(auto)[:40]}")
            now = body.get("now", True)
            if not isinstance(now, bool):
                raise SpecError(f"now: expected true or false, got {str(now)[:40]}")
            new_group = body.get("new_group", "")
            if not isinstance(new_group, str) or len(new_group) > MAX_WHY_CHARS:
                raise SpecError(
                    f"new_group: expected words of at most {MAX_WHY_CHARS} characters, got "
                    f"{str(new_group)[:40]}"
                )
            said = await self.manager.heal(name, ranks, spares, auto, now, new_group=new_group)
        else:
            counts = _list_of(body, "counts", int, MAX_NODES)
            if not counts or any(c < 1 for c in counts):
                raise SpecError(
                    f"counts: expected a positive number of ranks for each node, got {counts}"
                )
            said = await self.manager.resize(name, counts, spares)
        self.reply({"said": said, "status": await self.shown(session.status())})


class EventsHandler(DistHandler):
    """``/events``: server-sent events, a snapshot first, then every change."""

    keepalive_s = 15.0

    closed: asyncio.Event | None = None
    full = False  # whether the user may see what the ranks printed

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self) -> None:
        """A notebook kernel names itself (``?kernel_id=...&path=...``): while its stream
        is open it is alive; when the last one closes, its requests are withdrawn. Naming
        a kernel keeps its turns alive: it needs the permission turns need (``execute``),
        and a kernel of this server."""
        sender = await self.sender()
        may_execute = await self.may_execute()
        if sender.kernel_id and not may_execute:
            raise web.HTTPError(
                403,
                f"kernel_id {sender.kernel_id[:80]!r}: naming a notebook kernel on the event "
                "stream keeps its turns on the ranks; it needs the permission to execute",
                reason="Forbidden",
            )
        await self.prune()
        self.closed = asyncio.Event()
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        queue = self.manager.subscribe()
        if sender.kernel_id:
            self.manager.client_came(sender.kernel_id)
        try:
            self.full = may_execute
            await self._send({"type": "snapshot", "sessions": self.manager.status()})
            closed = asyncio.ensure_future(self.closed.wait())
            while not self.closed.is_set():
                getting = asyncio.ensure_future(queue.get())
                await asyncio.wait(
                    (getting, closed), timeout=self.keepalive_s, return_when="FIRST_COMPLETED"
                )
                if not getting.done():
                    getting.cancel()
                    if not self.closed.is_set():
                        self.write(": keep-alive\n\n")
                        await self.flush()
                    continue
                await self._send(getting.result())
        except (StreamClosedError, asyncio.CancelledError):
            pass
        finally:
            self.manager.unsubscribe(queue)
            self.closed.set()
            if sender.kernel_id:
                await self.manager.client_left(sender.kernel_id)

    def on_connection_close(self) -> None:
        """The client hung up: stop at once, not at the next write."""
        if self.closed is not None:
            self.closed.set()

    async def _send(self, event: ServerEvent) -> None:
        if not self.full:
            event = event_without_output(event)
        self.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
        await self.flush()


_NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
HANDLERS = [
    (rf"{API_PREFIX}/events", EventsHandler),
    (rf"{API_PREFIX}/sessions", SessionsHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}", SessionHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/connection", ConnectionHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/stacks", StacksHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/(?P<action>interrupt|restart)", SessionActionHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/(?P<action>heal|resize|free)", SessionRecoveryHandler),
]
