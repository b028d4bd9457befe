"""REST handlers of the server extension: parse the request, call the SessionManager,
return JSON. Every handler is authenticated and authorized; domain errors become HTTP
statuses in one place (`STATUS_OF`, applied by `maps_errors`). The API is described in
``rest-api.yaml``; its bodies are typed in `common.payloads`."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_dist.common.hosts import HostSpec, parse_host, parse_hosts
from jupyter_dist.common.payloads import ServerEvent, StacksReply
from jupyter_dist.common.spec import DEFAULT_SESSION, ShapeRequest, check_session_name, parse_ranks
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.errors import (
    AgentError,
    DistError,
    RanksFailed,
    ShapeMismatchError,
    SpecError,
    UnknownSession,
)

AUTH_RESOURCE = "jupyter_dist"

#: most specific first: the first match decides the status
STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownSession, 404),
    (ShapeMismatchError, 409),
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
    "init": (bool,),
    "cwd": (str,),  # where the ranks run (default: the server's folder)
    "env": (dict,),  # the ranks' environment (default: the server's)
}


@dataclass(frozen=True)
class CreateRequest:
    name: str
    shape: ShapeRequest
    cwd: str | None
    env: dict[str, str] | None


def _counts(key: str, value: Any) -> int | tuple[int, ...] | None:
    if value is None or isinstance(value, int):
        return value
    if not value or not all(type(v) is int for v in value):
        raise SpecError(f"{key}: {value!r} is not a count or a list of counts")
    return tuple(value)


def _hosts(value: Any) -> tuple[HostSpec, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        return parse_hosts(value)
    hosts = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise SpecError(f"hosts: {entry!r} is not a host; expected {{'name': ...}}")
        host = parse_host(entry["name"], "hosts")
        extra = {k: entry.get(k) for k in ("user", "port", "slots", "python")}
        for key, val in extra.items():
            if val is not None and type(val) is not (str if key in ("user", "python") else int):
                raise SpecError(f"hosts: {key} {val!r} of {entry['name']!r} has the wrong type")
        hosts.append(
            HostSpec(host.name, extra["user"], extra["port"], extra["slots"], extra["python"])
        )
    return tuple(hosts)


def shape_from_json(body: Any) -> CreateRequest:
    """A POST body -> what to start, and where; refuses unknown or mistyped fields."""
    if not isinstance(body, dict):
        raise SpecError("expected a JSON object with the session's name and shape")
    unknown = sorted(set(body) - set(REQUEST_FIELDS))
    if unknown:
        raise SpecError(f"unknown field {unknown[0]!r}; expected some of {sorted(REQUEST_FIELDS)}")
    for key, kinds in REQUEST_FIELDS.items():
        value = body.get(key)
        if value is not None and type(value) not in kinds:
            expected = " or ".join(k.__name__ for k in kinds)
            raise SpecError(f"{key}: {value!r} is not a {expected}")
    env = body.get("env")
    if env is not None and not all(isinstance(v, str) for v in env.values()):
        raise SpecError("env: expected an object of strings")
    shape = ShapeRequest(
        nodes=body.get("nodes"),
        gpus=_counts("gpus", body.get("gpus")),
        procs=_counts("procs", body.get("procs")),
        backend=body.get("backend"),
        init=body.get("init"),
        hosts=_hosts(body.get("hosts")),
        python=body.get("python"),
        ssh_config=body.get("ssh_config"),
        launcher=body.get("launcher"),
    )
    name = check_session_name(body.get("name") or DEFAULT_SESSION)
    return CreateRequest(name, shape, body.get("cwd"), env)


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

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(self.manager.status())

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def post(self) -> None:
        """Starting ranks runs programs (``python``, ``env``): as for kernels, that needs
        the ``execute`` permission."""
        req = shape_from_json(self.get_json_body())
        session, started = await self.manager.get_or_start(
            req.name, req.shape, cwd=req.cwd, env=req.env
        )
        self.reply(session.status(), 201 if started else 200)


class SessionHandler(DistHandler):
    """``/sessions/NAME``: look at one, or shut it down."""

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self, name: str) -> None:
        self.reply(self.manager.get(name).status())

    @web.authenticated
    @authorized
    @maps_errors
    async def delete(self, name: str) -> None:
        await self.manager.shutdown(name)
        self.set_status(204)
        self.finish()


class ConnectionHandler(DistHandler):
    """``/sessions/NAME/connection``: the key and sockets of the rank kernels.

    Whoever holds these can run code on every rank, so the handler asks for the
    ``execute`` permission, not just ``read``.
    """

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def get(self, name: str) -> None:
        self.reply(self.manager.get(name).connection_info())


class StacksHandler(DistHandler):
    """``/sessions/NAME/stacks?ranks=0,2-3``: every rank's Python stacks, as dumped by
    faulthandler (works while a rank is stuck in a collective)."""

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self, name: str) -> None:
        session = self.manager.get(name)
        text = self.get_query_argument("ranks", "")
        ranks = parse_ranks(text, session.spec.world_size) if text else None
        dumps = await session.stacks(ranks)
        reply: StacksReply = {"stacks": {str(r): d for r, d in dumps.items()}}
        self.reply(reply)


class SessionActionHandler(DistHandler):
    """``/sessions/NAME/interrupt`` and ``/sessions/NAME/restart``."""

    @web.authenticated
    @authorized
    @maps_errors
    async def post(self, name: str, action: str) -> None:
        session = self.manager.get(name)
        if action == "interrupt":
            await session.interrupt()
            self.set_status(204)
            self.finish()
            return
        await self.manager.restart(name)
        self.reply(session.status())


class EventsHandler(DistHandler):
    """``/events``: server-sent events, a snapshot first, then every change."""

    keepalive_s = 15.0

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        queue = self.manager.subscribe()
        try:
            await self._send({"type": "snapshot", "sessions": self.manager.status()})
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), self.keepalive_s)
                except asyncio.TimeoutError:
                    self.write(": keep-alive\n\n")
                    await self.flush()
                    continue
                await self._send(event)
        except (StreamClosedError, asyncio.CancelledError):
            pass
        finally:
            self.manager.unsubscribe(queue)

    async def _send(self, event: ServerEvent) -> None:
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
]
