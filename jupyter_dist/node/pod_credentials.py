"""``python -m jupyter_dist.node.pod_credentials SECRET_FILE --node N --to FILE``: the init
container of a Kubernetes session's pod, which hands the pod's node its own credentials
and no other node's.

``SECRET_FILE`` is the session's Secret as mounted in this container alone: every node's
credentials, a JSON list. Node ``N`` (the pod's completion index) has one entry there;
it is written to ``FILE`` (in a memory-backed emptyDir that the node's container mounts),
mode 0600, a new file each run. The node process reads it and removes it before it runs
anything (``jupyter_dist.node.dial_back --remove-credentials``). Nothing here prints a key:
an error names the node and the nodes the Secret has.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

#: the largest Secret the API server keeps is 1 MiB
MAX_SECRET_BYTES = 1024 * 1024


def pick(text: str, node: int) -> str:
    """Node ``node``'s entry of the Secret's list, as JSON; ValueError naming what is
    wrong, never a key."""
    try:
        every = json.loads(text)
    except ValueError:
        raise ValueError("the Secret's credentials are not JSON") from None
    if not isinstance(every, list):
        raise ValueError("the Secret's credentials: expected a list of the nodes'")
    mine = [e for e in every if isinstance(e, dict) and e.get("node") == node]
    if len(mine) != 1:
        nodes = sorted(str(e.get("node")) for e in every if isinstance(e, dict))
        raise ValueError(
            f"node {node}: {len(mine)} entries for it in the Secret (it has nodes "
            f"{', '.join(nodes) or 'none'}); expected one"
        )
    return json.dumps(mine[0])


def hand_over(source: str, node: int, target: str) -> None:
    """Node ``node``'s credentials from ``source`` into a new file ``target``, mode 0600."""
    with open(source, "rb") as f:  # a Secret volume's file is a link into its latest data
        raw = f.read(MAX_SECRET_BYTES + 1)
    if len(raw) > MAX_SECRET_BYTES:
        raise ValueError(f"{source}: larger than a Secret ({MAX_SECRET_BYTES} bytes)")
    text = pick(raw.decode("utf-8", "replace"), node)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)  # a run before this one's, not taken
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_dist.node.pod_credentials",
        description="Hand a Kubernetes pod's node its own credentials out of the Secret.",
    )
    parser.add_argument("source", help="the Secret's credentials file (every node's)")
    parser.add_argument("--node", required=True, help="this pod's completion index")
    parser.add_argument("--to", required=True, help="the file the node's container reads")
    args = parser.parse_args(argv)
    try:
        if not (args.node.isascii() and args.node.isdigit()):
            raise ValueError(
                f"--node {args.node[:40]!r}: expected the pod's completion index (0, 1, ...)"
            )
        hand_over(args.source, int(args.node), args.to)
    except (OSError, ValueError) as err:
        print(f"pod-credentials: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
