"""Why a session's Job has no pod of an index yet: the FailedCreate Events its controller
writes on the Job when the API server refuses a pod (a namespace's Pod Security
admission, a quota, a webhook). The Job itself says nothing of it.

A refusal by the namespace's Pod Security admission does not pass by waiting: it fails
the start (or heal, or resize) at once, naming the namespace's policy and what the pod
violates. Any other refusal (a full quota, which may free up) is shown beside the pods'
states and waited out within the timeout. The Job's Events are read at most every
`EVENTS_S` while a pod is missing; an account that may not list Events (the README's
Role grants it) is told once, and the start waits as it did without them.
"""

from __future__ import annotations

import re
import time

from jupyter_dist.control.launchers.k8s_api import KubeClient
from jupyter_dist.errors import AgentError

#: seconds between two reads of the Job's Events
EVENTS_S = 2.0
#: the namespace label that enforces a Pod Security Standard
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
_POD_SECURITY = re.compile(
    r'violates PodSecurity "(?P<level>[^":]+)(?::[^"]*)?": (?P<what>.*)', re.S
)


class CreateRefusals:
    """The FailedCreate Events of Job ``job`` in ``namespace``; ``template`` says whether
    a pod template was merged into its pods (for the error's advice)."""

    def __init__(self, namespace: str, job: str, template: bool = False) -> None:
        self.namespace = namespace
        self.job = job
        self.template = template
        self.said = ""
        self._last = -EVENTS_S
        self._denied = False

    async def check(self, client: KubeClient) -> str:
        """The latest refusal in words (``""`` when there is none); an `AgentError` when it
        is the namespace's Pod Security admission."""
        if self._denied or time.monotonic() - self._last < EVENTS_S:
            return self.said
        self._last = time.monotonic()
        try:
            found = await client.call(
                "GET",
                "Event",
                params={"fieldSelector": f"involvedObject.name={self.job},reason=FailedCreate"},
            )
        except AgentError as err:
            if "needs the verb" not in str(err):
                raise
            self._denied = True
            self.said = (
                "why the Job's controller made no pod is in its Events, which this account "
                "may not list"
            )
            return self.said
        events = [
            e
            for e in (found or {}).get("items") or []
            if (e.get("involvedObject") or {}).get("kind") == "Job"
        ]
        if not events:
            return self.said
        latest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        message = str(latest.get("message") or "").removeprefix("Error creating: ")
        policy = _POD_SECURITY.search(message)
        if policy is not None:
            advice = (
                "the pod template makes them fail it (a privileged container, a capability, "
                "a hostPath volume, root...): remove what it names from the template"
                if self.template
                else "jupyter_dist's own pods pass the restricted standard: what it names was "
                "added to them on the way (a mutating admission webhook?)"
            )
            raise AgentError(
                f"Kubernetes: namespace {self.namespace} enforces the Pod Security Standard "
                f"{policy['level']!r} (label {ENFORCE_LABEL}), and refused job {self.job}'s "
                f"pods: {policy['what'].strip()}; {advice}"
            )
        self.said = f"FailedCreate: {message[:300]}"
        return self.said


__all__ = ["EVENTS_S", "CreateRefusals"]
