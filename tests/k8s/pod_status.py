"""The pod status the emulated kubelet writes, as a kubelet words it: the pod's phase and
conditions, its init containers' statuses (done, running, waiting, failed) and its
container's; and a failed container's termination message where its
``terminationMessagePolicy`` is ``FallbackToLogsOnError`` (the end of its log)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["container_status", "fallback_message", "pod_status"]

#: what a kubelet takes of a log for a termination message: 80 lines, 2048 bytes
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048
CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def container_status(
    container: dict[str, Any], state: dict[str, Any], pid: int = 0
) -> dict[str, Any]:
    running = "running" in state
    status: dict[str, Any] = {
        "name": container.get("name", ""),
        "ready": running,
        "restartCount": 0,
        "image": container.get("image", ""),
        "state": state,
    }
    if running or "terminated" in state:
        status["started"] = running
        status["imageID"] = ""
        status["containerID"] = f"emulated://{pid}" if pid else ""
    return status


def init_statuses(
    inits: list[dict[str, Any]], done: int, current: dict[str, Any] | None, now: str
) -> list[dict[str, Any]]:
    """The first ``done`` init containers Completed, the next in state ``current`` (None:
    all are done), the rest waiting."""
    out = []
    for n, container in enumerate(inits):
        if n < done:
            state: dict[str, Any] = {
                "terminated": {
                    "exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now,
                }
            }  # fmt: skip
        elif n == done and current is not None:
            state = current
        else:
            state = {"waiting": {"reason": "PodInitializing"}}
        out.append(container_status(container, state))
    return out


def pod_status(
    phase: str,
    now: str,
    inits: list[dict[str, Any]],
    done: int,
    init_state: dict[str, Any] | None,
    main: dict[str, Any],
    main_state: dict[str, Any],
    ips: dict[str, str] | None = None,
    pid: int = 0,
) -> dict[str, Any]:
    """A whole ``status`` (lists in a merge patch are replaced whole)."""
    initialized = done >= len(inits)
    ready = "running" in main_state
    true = {"PodScheduled": True, "Initialized": initialized, "ContainersReady": ready,
            "Ready": ready}  # fmt: skip
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {"type": t, "status": "True" if true[t] else "False", "lastTransitionTime": now}
            for t in CONDITIONS
        ],
        "containerStatuses": [container_status(main, main_state, pid)],
    }
    if inits:
        status["initContainerStatuses"] = init_statuses(inits, done, init_state, now)
    if ips:
        status.update(
            podIP=ips["podIP"], podIPs=[{"ip": ips["podIP"]}], hostIP=ips["hostIP"],
            hostIPs=[{"ip": ips["hostIP"]}], startTime=now,
        )  # fmt: skip
    return status


def fallback_message(container: dict[str, Any], log_file: Path) -> str:
    """The end of the container's log where its policy asks for it, else ``""``."""
    if container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return ""
    try:
        text = log_file.read_bytes()[-FALLBACK_BYTES:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-FALLBACK_LINES:])
