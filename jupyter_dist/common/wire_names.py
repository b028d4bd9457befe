"""Names on the wire between a rank kernel and the notebook side, defined once.

These are part of the protocol: a notebook and its ranks must agree on them, so they never
follow the module they are used in when code moves.
"""

from __future__ import annotations

#: IOPub message type of a batch of scalars from ``jupyter_dist.log`` and process samples
METRICS_MSG_TYPE = "jupyter_dist_metrics"
#: comm target through which the notebook pushes and pulls Python objects
OBJECTS_TARGET = "jupyter_dist.objects"
