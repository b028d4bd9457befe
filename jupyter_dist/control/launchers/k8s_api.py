"""The few Kubernetes API calls a ``--k8s`` session makes, through ``kr8s``.

kr8s finds the credentials as kubectl does: ``KUBECONFIG`` (or ``~/.kube/config``, exec
plugins included) and its context, else the pod's service account in-cluster. Every
failure becomes an `AgentError` that says what was asked and why it failed; a refusal
(HTTP 403) names the verb and resource the account lacks and where the README's Role is.

`KubeClient.connect` reads the credentials first, then asks the API server its version
with kr8s's own request timeout set to `CONNECT_TIMEOUT_S`: a server that refuses the
connection or does not answer fails the start within seconds, naming its address and
where that came from (the kubeconfig and its context, ``--context``, or the pod's
in-cluster variables).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

from jupyter_dist.errors import AgentError

#: seconds one API call may take
CALL_TIMEOUT_S = 30.0
#: seconds the API server gets to answer the first request (its version)
CONNECT_TIMEOUT_S = 5.0
#: the most items one list returns (a label selector keeps them few)
LIST_LIMIT = 500
#: kind -> (API version, plural resource name)
KINDS = {
    "Pod": ("v1", "pods"),
    "Secret": ("v1", "secrets"),
    "Event": ("v1", "events"),
    "Job": ("batch/v1", "jobs"),
}
_VERBS = {"GET": "get", "POST": "create", "DELETE": "delete", "PATCH": "patch"}
#: the variable naming the API server's host in every pod
IN_CLUSTER_HOST_VAR = "KUBERNETES_SERVICE_HOST"


class KubeClient:
    """One cluster and namespace, as the notebook's credentials reach them."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        #: where the API server's address came from, in words (`server_origin`)
        self.origin = "kubeconfig"

    @classmethod
    async def connect(
        cls, kubeconfig: str | None, context: str | None, namespace: str | None
    ) -> KubeClient:
        try:
            import kr8s.asyncio
        except ImportError:
            raise AgentError(
                "--k8s needs the Kubernetes client: pip install 'jupyter_dist[k8s]'"
            ) from None
        # kr8s's factory (kr8s.asyncio.api) also asks the server, with no timeout of its
        # own: the credentials are read first here, then the server asked, bounded
        api = kr8s.asyncio.Api(bypass_factory=True, kubeconfig=kubeconfig or None, context=context)
        try:
            await asyncio.wait_for(api.auth.reauthenticate(), CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise AgentError(
                f"Kubernetes: no credentials within {CALL_TIMEOUT_S:.0f} s (an exec plugin "
                "that does not answer?)"
            ) from None
        except Exception as err:
            where = f"context {context!r}" if context else "the current context"
            raise AgentError(
                f"Kubernetes: cannot use {where} ({type(err).__name__}: {err}); expected a "
                "kubeconfig (KUBECONFIG or ~/.kube/config) or to run in a pod with a "
                "service account"
            ) from None
        client = cls(api, namespace or getattr(api, "namespace", None) or "default")
        client.origin = server_origin(api.auth, kubeconfig, context)
        await client.reach()
        return client

    async def reach(self) -> None:
        """Ask the API server its version, within `CONNECT_TIMEOUT_S`; an `AgentError`
        naming the server and where its address came from when it cannot be reached."""
        import httpx
        import kr8s

        self.api.timeout = CONNECT_TIMEOUT_S  # kr8s's own: each connect, read and write
        try:
            await asyncio.wait_for(self.api.version(), CONNECT_TIMEOUT_S * 2)
        except kr8s.ServerError:
            pass  # it answered: what it refuses, the calls that need it say
        except (asyncio.TimeoutError, kr8s.APITimeoutError, httpx.TimeoutException):
            raise AgentError(
                self._unreachable(f"no answer within {CONNECT_TIMEOUT_S:.0f} s")
            ) from None
        except (httpx.HTTPError, OSError) as err:
            raise AgentError(
                self._unreachable(f"cannot connect ({type(err).__name__}: {err})")
            ) from None
        finally:
            self.api.timeout = CALL_TIMEOUT_S

    def _unreachable(self, why: str) -> str:
        return (
            f"Kubernetes API server {self.url} ({self.origin}): {why}. Expected the "
            "cluster's API server, reachable from this machine (is the cluster up, and the "
            "kubeconfig's context the one meant? --context picks another)"
        )

    @property
    def url(self) -> str:
        return str(getattr(self.api.auth, "server", "") or "the API server")

    async def call(
        self,
        method: str,
        kind: str,
        name: str = "",
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        namespace: str | None = None,
        missing_ok: bool = False,
    ) -> dict[str, Any] | None:
        """One request on ``kind`` (named ``name``, or the collection); its JSON answer, or
        None for a missing object when ``missing_ok``."""
        import httpx
        import kr8s

        version, plural = KINDS[kind]
        ns = namespace or self.namespace
        url = f"{plural}/{name}" if name else plural
        extra: dict[str, Any] = {}
        if body is not None:
            extra["content"] = json.dumps(body)
            extra["headers"] = {
                "Content-Type": "application/merge-patch+json"
                if method == "PATCH"
                else "application/json"
            }
        if params:
            extra["params"] = dict(params)
        verb = "list" if method == "GET" and not name else _VERBS.get(method, method.lower())
        group = version.split("/")[0] if "/" in version else ""
        what = f"{verb} {plural}{'.' + group if group else ''} {name}".rstrip()

        async def request() -> dict[str, Any]:
            async with self.api.call_api(
                method, version=version, namespace=ns, url=url, **extra
            ) as response:
                return dict(response.json())

        try:
            return await asyncio.wait_for(request(), CALL_TIMEOUT_S)
        except kr8s.ServerError as err:
            code = err.response.status_code if err.response is not None else 0
            if code == 404 and missing_ok:
                return None
            message = str(err)
            if code == 403:
                raise AgentError(
                    f"Kubernetes refused to {what} in namespace {ns}: {message}. The "
                    f"notebook's account needs the verb {verb!r} on {plural!r}"
                    f"{' (API group ' + repr(group) + ')' if group else ''}: see the "
                    "README's Role for --k8s"
                ) from None
            if code == 401:
                raise AgentError(
                    f"Kubernetes did not accept the notebook's credentials at {self.url} "
                    f"({message}); check the kubeconfig's user or the service account"
                ) from None
            raise AgentError(f"Kubernetes: {what} in namespace {ns}: {message}") from None
        except (asyncio.TimeoutError, kr8s.APITimeoutError):
            raise AgentError(
                f"Kubernetes: {what}: {self.url} did not answer within {CALL_TIMEOUT_S:.0f} s"
            ) from None
        except httpx.HTTPError as err:
            raise AgentError(
                f"Kubernetes: {what}: cannot reach {self.url} ({type(err).__name__}: {err})"
            ) from None

    async def api_groups(self) -> set[str] | None:
        """The API groups the server serves (``/apis``, discovery, which every
        authenticated account may read), or None when it does not say."""
        import httpx
        import kr8s

        async def ask() -> Any:
            async with self.api.call_api("GET", version="", base="/apis") as response:
                return response.json()

        try:
            found = await asyncio.wait_for(ask(), CALL_TIMEOUT_S)
        except (kr8s.ServerError, kr8s.APITimeoutError, asyncio.TimeoutError, httpx.HTTPError):
            return None
        except ValueError:  # not JSON
            return None
        groups = found.get("groups") if isinstance(found, dict) else None
        if not isinstance(groups, list):
            return None
        return {str(g.get("name")) for g in groups if isinstance(g, dict)}

    async def items(
        self, kind: str, selector: Mapping[str, str], namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """The ``kind`` objects whose labels have every ``selector`` pair."""
        labels = ",".join(f"{k}={v}" for k, v in selector.items())
        found = await self.call(
            "GET",
            kind,
            params={"labelSelector": labels, "limit": str(LIST_LIMIT)},
            namespace=namespace,
        )
        return list((found or {}).get("items") or [])

    async def delete(
        self, kind: str, name: str, namespace: str | None = None, grace: int | None = None
    ) -> bool:
        """Delete ``name`` and, through the garbage collector, what it owns (its pods);
        False when it was already gone. ``grace``: seconds its processes get (0: at once,
        for a pod whose machine no longer answers); None: its own."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"
        }  # fmt: skip
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        done = await self.call(
            "DELETE", kind, name, body=body, namespace=namespace, missing_ok=True
        )
        return done is not None

    async def close(self) -> None:
        session = getattr(self.api, "_session", None)
        if session is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                await session.aclose()


def server_origin(auth: Any, kubeconfig: str | None, context: str | None) -> str:
    """Where kr8s took the API server's address from: a kubeconfig's context (named by
    ``--context``, or its current one) or, in a pod, Kubernetes' own variables."""
    active = str(getattr(auth, "active_context", "") or "")
    if active and getattr(auth, "_cluster", None):
        path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        chosen = "given by --context" if context else "its current context"
        return f"context {active!r} of the kubeconfig {path}, {chosen}"
    return (
        f"in-cluster: {IN_CLUSTER_HOST_VAR} and {IN_CLUSTER_HOST_VAR[:-4]}PORT of this pod, "
        "with its service account"
    )


__all__ = ["CONNECT_TIMEOUT_S", "KINDS", "KubeClient", "server_origin"]
