"""The notebook kernel's client of the server extension's REST API and event stream.

Runs on the control-plane loop (tornado's HTTP client on asyncio). Errors come back as
the exceptions the server raised: the server names the error class in the response's
``reason``, and its message is kept word for word. The JSON it reads is typed in
`common.payloads` (as the server writes it; nothing checks it here).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from jupyter_dist import errors
from jupyter_dist.common.k8s_options import DEFAULT_QUEUE_S
from jupyter_dist.common.payloads import (
    HealRequest,
    NotebookSession,
    RecoveryReply,
    ResizeRequest,
    ServerEvent,
    SessionConnection,
    SessionRequest,
    SessionStatus,
    StacksReply,
    TurnReply,
    TurnRequest,
)
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.control.cell_queue import Sender
from jupyter_dist.server_client.discovery import ServerInfo
from jupyter_dist.text import format_ranks

log = logging.getLogger(__name__)
#: the API's path under the server's base URL (which ends with "/")
API = API_PREFIX.lstrip("/")
#: error classes the server may name, rebuilt here with the server's message
_KNOWN_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        errors.UnknownSession,
        errors.ShapeMismatchError,
        errors.LimitError,
        errors.SpecError,
        errors.NoGPUError,
        errors.AgentError,
        errors.SessionError,
        errors.DistError,
    )
}
#: called with each server-sent event's name and data
EventHandler = Callable[[str, ServerEvent], None]


class ServerError(errors.DistError):
    """The server answered with an error it did not name, or could not be reached."""


def _waits(body: Mapping[str, Any]) -> float:
    """Seconds a start of ``body`` may wait beyond its nodes' start-up: a queued Kubernetes
    session for its queue, then its pods (``--k8s-timeout``), a Ray session for room."""
    k8s: Mapping[str, Any] = body.get("k8s") or {}
    ray: Mapping[str, Any] = body.get("ray") or {}
    queued = float(k8s.get("queue_timeout") or DEFAULT_QUEUE_S) if k8s.get("queue") else 0.0
    return queued + float(k8s.get("timeout") or 0) + float(ray.get("timeout") or 0)


class ServerClient:
    """REST calls and the event stream of one Jupyter server's jupyter_dist API."""

    def __init__(
        self, server: ServerInfo, request_timeout: float = 600.0, sender: Sender | None = None
    ) -> None:
        self.server = server
        self.request_timeout = request_timeout
        #: who this client is: every request names it (``?path=...&kernel_id=...``), so the
        #: server can tell the other notebooks who interrupted or restarted a session
        self.sender = sender or Sender()
        self._http: AsyncHTTPClient | None = None

    @property
    def http(self) -> AsyncHTTPClient:
        if self._http is None:  # made on the loop that uses it
            self._http = AsyncHTTPClient(force_instance=True)
        return self._http

    def _url(self, path: str) -> str:
        who = urlencode({k: v for k, v in self.sender.to_json().items() if v})
        if who:
            path += ("&" if "?" in path else "?") + who
        return f"{self.server.url}{API}/{path}"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.server.token:
            headers["Authorization"] = f"token {self.server.token}"
        return headers

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call; returns the decoded JSON (None for 204)."""
        request = HTTPRequest(
            self._url(path),
            method=method,
            headers=self._headers(),
            body=json.dumps(body) if body is not None else ("" if method == "POST" else None),
            request_timeout=self.request_timeout,
        )
        try:
            response = await self.http.fetch(request)
        except HTTPClientError as err:
            raise _as_error(err, method, path) from None
        except OSError as err:
            raise ServerError(
                f"cannot reach the Jupyter server at {self.server.url}: {err}"
            ) from None
        if response.code == 204 or not response.body:
            return None
        return json.loads(response.body)

    # -- the API ------------------------------------------------------------------------
    async def sessions(self) -> list[SessionStatus]:
        found: list[SessionStatus] = await self.call("GET", "sessions")
        return found

    async def create(self, body: SessionRequest) -> tuple[SessionStatus, bool]:
        """Start a session, or find the running one; returns its status and whether it
        was started now. The waits the request names (a Kubernetes queue's, the pods', the
        Ray cluster's) come on top of the client's bound: the server stops a start whose
        caller hung up."""
        request = HTTPRequest(
            self._url("sessions"),
            method="POST",
            headers=self._headers(),
            body=json.dumps(body),
            request_timeout=self.request_timeout + _waits(body),
        )
        try:
            response = await self.http.fetch(request)
        except HTTPClientError as err:
            raise _as_error(err, "POST", "sessions") from None
        status: SessionStatus = json.loads(response.body)
        return status, response.code == 201

    async def notebook(self) -> NotebookSession:
        """This client's notebook as the server knows it (its path now, its file id), the
        session it goes on with and the name a new one gets; what became of the last one
        when none runs."""
        found: NotebookSession = await self.call("GET", "notebook")
        return found

    async def status(self, name: str) -> SessionStatus:
        found: SessionStatus = await self.call("GET", f"sessions/{quote(name)}")
        return found

    async def connection(self, name: str, use: bool = False) -> SessionConnection:
        """The rank kernels' key and sockets; ``use``: list this notebook as using the
        session (``%dist attach``; its cells' turns list it anyway)."""
        query = "?use=true" if use else ""
        found: SessionConnection = await self.call(
            "GET", f"sessions/{quote(name)}/connection{query}"
        )
        return found

    async def stacks(self, name: str, ranks: list[int] | None) -> dict[int, str]:
        """Signals the ranks (a POST, with the ``execute`` permission)."""
        query = f"?ranks={format_ranks(ranks)}" if ranks else ""
        found: StacksReply = await self.call("POST", f"sessions/{quote(name)}/stacks{query}")
        return {int(r): str(d) for r, d in found["stacks"].items()}

    async def restart(self, name: str) -> SessionStatus:
        found: SessionStatus = await self.call("POST", f"sessions/{quote(name)}/restart")
        return found

    async def heal(self, name: str, body: HealRequest) -> RecoveryReply:
        found: RecoveryReply = await self.call("POST", f"sessions/{quote(name)}/heal", body)
        return found

    async def free(self, name: str, ranks: list[int]) -> list[int]:
        found = await self.call("POST", f"sessions/{quote(name)}/free", {"ranks": ranks})
        return [int(r) for r in found["ranks"]]

    async def resize(self, name: str, body: ResizeRequest) -> RecoveryReply:
        found: RecoveryReply = await self.call("POST", f"sessions/{quote(name)}/resize", body)
        return found

    async def delete(self, name: str) -> None:
        await self.call("DELETE", f"sessions/{quote(name)}")

    async def interrupt(self, name: str) -> None:
        await self.call("POST", f"sessions/{quote(name)}/interrupt")

    async def take_turn(self, name: str, body: TurnRequest) -> TurnReply:
        """Ask for a turn on the ranks (or ask again); the server answers within about
        20 s: ``running``, ``waiting`` (ask again) or ``withdrawn``."""
        found: TurnReply = await self.call("POST", f"sessions/{quote(name)}/turns", body)
        return found

    async def end_turn(
        self,
        name: str,
        turn_id: str,
        errors: Mapping[int, str] | None = None,
        ran: Sequence[int] = (),
    ) -> None:
        body = {"errors": {str(r): line for r, line in (errors or {}).items()}, "ran": list(ran)}
        await self.call("POST", f"sessions/{quote(name)}/turns/{quote(turn_id)}/end", body)

    async def follow_events(self, on_event: EventHandler) -> None:
        """Read ``/events`` until the server closes it; ``on_event(type, data)`` for each."""
        parser = SSEParser(on_event)
        request = HTTPRequest(
            self._url("events"),
            headers=self._headers(),
            streaming_callback=parser.feed,
            request_timeout=0,  # the stream stays open; the server sends keep-alives
        )
        try:
            await self.http.fetch(request)
        except HTTPClientError as err:
            if err.code != 599:  # 599: the connection closed, the usual end of a stream
                raise _as_error(err, "GET", "events") from None
        except (OSError, asyncio.IncompleteReadError):
            pass

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


class SSEParser:
    """Server-sent events from chunks of bytes: ``event:`` and ``data:`` lines, blank line
    ends an event, ``:`` lines are comments (keep-alives)."""

    def __init__(self, on_event: EventHandler) -> None:
        self.on_event = on_event
        self._buffer = b""

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        while b"\n\n" in self._buffer:
            block, self._buffer = self._buffer.split(b"\n\n", 1)
            kind, data = "message", []
            for line in block.decode("utf-8", errors="replace").splitlines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
            if data:
                try:
                    payload = json.loads("\n".join(data))
                except ValueError:
                    log.warning("jupyter_dist: unreadable server event %r", data)
                    continue
                self.on_event(kind, payload)


def _as_error(err: HTTPClientError, method: str, path: str) -> Exception:
    """The exception the server raised, rebuilt from its JSON reply."""
    message, reason = "", ""
    if err.response is not None and err.response.body:
        try:
            reply = json.loads(err.response.body)
            message, reason = str(reply.get("message") or ""), str(reply.get("reason") or "")
        except ValueError:
            message = err.response.body.decode(errors="replace")[:500]
    if err.code == 403:
        return ServerError(
            f"the Jupyter server refused {method} /{API}/{path} (403): this kernel's "
            "credentials were not accepted"
        )
    cls = _KNOWN_ERRORS.get(reason)
    if cls is not None:
        return cls(message)
    if err.code == 504:
        return errors.SessionError(message or "the server timed out starting the session")
    return ServerError(f"{method} /{API}/{path}: {err.code} {message or err.message}")
