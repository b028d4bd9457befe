"""REST handlers of the server extension: parse the request, call the SessionManager,
return JSON. Every handler is authenticated and authorized; domain errors become HTTP
statuses in one place (`STATUS_OF`). The API is described in ``rest-api.yaml``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_dist.errors import (
    AgentError,
    DistError,
    RanksFailed,
    ShapeMismatchError,
    SpecError,
    UnknownSession,
)
from jupyter_dist.hosts import parse_hosts
from jupyter_dist.manager import SessionManager
from jupyter_dist.spec import DEFAULT_SESSION, ShapeRequest, check_session_name

API_PREFIX = "/jupyter-dist/api/v1"
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

REQUEST_FIELDS = {
    "name": str,
    "nodes": int,
    "gpus": int,
    "procs": int,
    "backend": str,
    "hosts": str,
    "python": str,
    "ssh_config": str,
    "init": bool,
}


def shape_from_json(body: Any) -> tuple[str, ShapeRequest]:
    """A POST body -> (session name, shape request); refuses unknown or mistyped fields."""
    if not isinstance(body, dict):
        raise SpecError("expected a JSON object with the session's name and shape")
    unknown = sorted(set(body) - set(REQUEST_FIELDS))
    if unknown:
        raise SpecError(f"unknown field {unknown[0]!r}; expected some of {sorted(REQUEST_FIELDS)}")
    for key, kind in REQUEST_FIELDS.items():
        value = body.get(key)
        if value is not None and (type(value) is not kind):
            raise SpecError(f"{key}: {value!r} is not a {kind.__name__}")
    name = check_session_name(body.get("name") or DEFAULT_SESSION)
    hosts = parse_hosts(body["hosts"]) if body.get("hosts") else ()
    return name, ShapeRequest(
        nodes=body.get("nodes"),
        gpus=body.get("gpus"),
        procs=body.get("procs"),
        backend=body.get("backend"),
        init=body.get("init"),
        hosts=hosts,
        python=body.get("python"),
        ssh_config=body.get("ssh_config"),
    )


class DistHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> SessionManager:
        manager: SessionManager = self.settings["jupyter_dist_manager"]
        return manager

    def fail(self, err: BaseException) -> web.HTTPError:
        for kind, status in STATUS_OF:
            if isinstance(err, kind):
                return web.HTTPError(status, str(err) or type(err).__name__)
        raise err

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))


class SessionsHandler(DistHandler):
    """``/sessions``: list them, or start one."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(self.manager.status())

    @web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            name, request = shape_from_json(self.get_json_body())
            session, started = await self.manager.get_or_start(name, request)
        except BaseException as err:
            raise self.fail(err) from err
        self.reply(session.status(), 201 if started else 200)


class SessionHandler(DistHandler):
    """``/sessions/NAME``: look at one, or shut it down."""

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        try:
            self.reply(self.manager.get(name).status())
        except BaseException as err:
            raise self.fail(err) from err

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        try:
            await self.manager.shutdown(name)
        except BaseException as err:
            raise self.fail(err) from err
        self.set_status(204)
        self.finish()


class ConnectionHandler(DistHandler):
    """``/sessions/NAME/connection``: the key and sockets of the rank kernels.

    Whoever holds these can run code on every rank, so the handler asks for the
    ``execute`` permission, not just ``read``.
    """

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    async def get(self, name: str) -> None:
        try:
            self.reply(self.manager.get(name).connection_info())
        except BaseException as err:
            raise self.fail(err) from err


class SessionActionHandler(DistHandler):
    """``/sessions/NAME/interrupt`` and ``/sessions/NAME/restart``."""

    @web.authenticated
    @authorized
    async def post(self, name: str, action: str) -> None:
        try:
            session = self.manager.get(name)
            if action == "interrupt":
                await session.interrupt()
                self.set_status(204)
                self.finish()
                return
            await session.restart()
        except BaseException as err:
            raise self.fail(err) from err
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

    async def _send(self, event: dict[str, Any]) -> None:
        self.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
        await self.flush()


_NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
HANDLERS = [
    (rf"{API_PREFIX}/events", EventsHandler),
    (rf"{API_PREFIX}/sessions", SessionsHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}", SessionHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/connection", ConnectionHandler),
    (rf"{API_PREFIX}/sessions/{_NAME}/(?P<action>interrupt|restart)", SessionActionHandler),
]
