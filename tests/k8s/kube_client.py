"""The HTTP client the emulated cluster's control loops use: JSON over the API, a token.

The kubelet, scheduler, Job controller and garbage collector speak to the emulated API
server only through this, as their real counterparts do through client-go.
"""

from __future__ import annotations

import datetime
from typing import Any

import aiohttp

from tests.k8s.kinds import path

__all__ = ["ApiClient", "ApiError"]


class ApiError(Exception):
    """A non-2xx answer: ``status`` and the Status object's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class ApiClient:
    """Async JSON calls against ``url`` with bearer ``token``; enter it to open a session."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ApiClient:
        self._session = aiohttp.ClientSession(self.url, headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        method: str,
        api_path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        assert self._session is not None, "enter the ApiClient first"
        async with self._session.request(
            method, api_path, json=body, params=params, headers={"Content-Type": content_type}
        ) as response:
            data = await response.json(content_type=None)
            if response.status >= 300:
                message = data.get("message") if isinstance(data, dict) else str(data)
                raise ApiError(response.status, f"{method} {api_path}: {message}")
            return data

    async def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.call("GET", path(resource, None, namespace)))[
            "items"
        ]
        return items

    async def get(self, resource: str, name: str, namespace: str | None = "default") -> Any:
        return await self.call("GET", path(resource, name, namespace))

    async def create(self, resource: str, body: dict[str, Any], namespace: str | None) -> Any:
        return await self.call("POST", path(resource, None, namespace), body)

    async def patch(
        self,
        resource: str,
        name: str,
        namespace: str | None,
        body: dict[str, Any],
        status: bool = False,
    ) -> Any:
        suffix = "/status" if status else ""
        return await self.call(
            "PATCH",
            path(resource, name, namespace) + suffix,
            body,
            content_type="application/merge-patch+json",
        )

    async def delete(self, resource: str, name: str, namespace: str | None) -> None:
        try:
            await self.call(
                "DELETE", path(resource, name, namespace), {"propagationPolicy": "Background"}
            )
        except ApiError as e:
            if e.status != 404:  # already gone is what we wanted
                raise

    async def event(
        self, pod: dict[str, Any], kind: str, reason: str, message: str, component: str
    ) -> None:
        """A v1 Event about ``pod`` (or another object: a Job) from ``component``, as the
        scheduler, kubelet and Job controller write them."""
        meta = pod["metadata"]
        now = datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.create(
            "events",
            {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": pod.get("apiVersion", "v1"),
                    "kind": pod.get("kind", "Pod"),
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "type": kind,
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": component},
                "reportingComponent": component,
            },
            meta["namespace"],
        )
