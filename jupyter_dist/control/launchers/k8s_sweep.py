"""What a dead owner's ``--k8s`` sessions left on a cluster, found by label and deleted.

Every Job and Secret a session makes carries ``app.kubernetes.io/managed-by=jupyter-dist``
and its owner's host and pid (`k8s_manifests.session_labels`). A later server runs

    python -m jupyter_dist.control.launchers.k8s_sweep --owner USER@HOST/PID \
        --namespace NS [--context C]

for each dead owner its records name (`server.cluster_sweep`): it deletes that owner's Jobs
(their pods with them) and Secrets, nothing else, and prints one JSON line
``{"event": "swept", "removed": [...]}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from jupyter_dist.control.launchers import k8s_manifests as manifests
from jupyter_dist.control.launchers.k8s_api import KubeClient
from jupyter_dist.errors import AgentError


def owner_selector(owner: str) -> dict[str, str]:
    """The labels everything ``owner`` (``user@host/pid``) made carries."""
    who, _, pid = owner.rpartition("/")
    host = who.rpartition("@")[2]
    if not pid.isdigit() or not host:
        raise ValueError(f"owner {owner!r}: expected USER@HOST/PID")
    return {
        manifests.MANAGED_BY: manifests.MANAGER,
        manifests.OWNER_HOST_LABEL: manifests.label_value(host) or "host",
        manifests.OWNER_PID_LABEL: pid,
    }


async def sweep(client: KubeClient, owner: str) -> list[str]:
    """Delete ``owner``'s Jobs and Secrets in the client's namespace; their names."""
    selector = owner_selector(owner)
    removed: list[str] = []
    for kind in ("Job", "Secret"):
        for item in await client.items(kind, selector):
            meta = item.get("metadata") or {}
            if (meta.get("annotations") or {}).get(manifests.OWNER_ANNOTATION) not in (
                None,
                owner,
            ):
                continue  # another user's process of the same host and pid
            name = str(meta.get("name"))
            if await client.delete(kind, name):
                removed.append(f"{kind.lower()}/{name}")
    return removed


async def _main(args: argparse.Namespace) -> int:
    try:
        owner_selector(args.owner)
        client = await KubeClient.connect(args.kubeconfig, args.context, args.namespace)
        try:
            removed = await sweep(client, args.owner)
        finally:
            await client.close()
    except (AgentError, ValueError) as err:
        print(f"k8s sweep: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"event": "swept", "removed": removed}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_dist.control.launchers.k8s_sweep",
        description="Delete the Jobs and Secrets a dead owner's --k8s sessions left.",
    )
    parser.add_argument("--owner", required=True, help="USER@HOST/PID of the dead owner")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--context", default=None)
    parser.add_argument("--kubeconfig", default=None)
    return asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
