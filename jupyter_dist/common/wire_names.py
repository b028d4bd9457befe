"""Names on the wire, defined once: between a rank kernel and the notebook side, and
between the server extension and its clients.

These are part of the protocol: a notebook and its ranks, or a server and the kernels and
browser tabs calling it, must agree on them, so they never follow the module they are used
in when code moves.
"""

from __future__ import annotations

#: IOPub message type of a batch of scalars from ``jupyter_dist.log`` and process samples
METRICS_MSG_TYPE = "jupyter_dist_metrics"
#: execute_request metadata key: the notebook's execution count of the cell, which the rank
#: kernel takes as its own so that tracebacks say ``Cell In[N]`` as the notebook does
NOTEBOOK_COUNT_KEY = "jupyter_dist_execution_count"
#: comm target through which the notebook pushes and pulls Python objects
OBJECTS_TARGET = "jupyter_dist.objects"
#: where the server extension's REST API lives, under the server's base URL (also written
#: in ``server/rest-api.yaml``)
API_PREFIX = "/jupyter-dist/api/v1"
#: where the server extension serves the notebook kernels' per-cell rank logs, under the
#: server's base URL: ``<LOGS_ROUTE>/<folder>/<session>/cell-<n>/rank-<r>.log``
LOGS_ROUTE = "/jupyter-dist/logs"
#: the name of a notebook process's log folder, in the temporary folder, starts with this
LOGS_FOLDER_PREFIX = "jupyter_dist-logs-"
#: execute_request metadata key: the sender acknowledges this cell's IOPub messages
#: (`ACK_MSG_TYPE`), and the rank sends them at that sender's pace, not its slowest
#: subscriber's (`rank.iopub_credit`)
CREDIT_KEY = "jupyter_dist_credit"
#: control message type: ``{"cell": msg_id, "count": n}``, the sender has taken the first
#: n IOPub messages of its cell
ACK_MSG_TYPE = "jupyter_dist_ack"
#: IOPub messages of a credited cell a rank sends ahead of its sender's acknowledgement
CREDIT_WINDOW = 64
#: the sender acknowledges every this many messages of a cell
ACK_EVERY = 16
#: execute_request metadata key: the sender reads the cell's reply on IOPub, as the last
#: message of the cell (`EXECUTE_REPLY_MSG_TYPE`), and the rank sends no shell reply and
#: no busy/idle statuses for a cell that ends quickly (`rank.iopub_reply`)
IOPUB_REPLY_KEY = "jupyter_dist_iopub_reply"
#: IOPub message type of the reply to a cell that asked for it (`IOPUB_REPLY_KEY`); its
#: content is an ``execute_reply``'s
EXECUTE_REPLY_MSG_TYPE = "jupyter_dist_execute_reply"
#: execute_request metadata key: the sender reads its node relays' folded replies
#: (`FOLDED_REPLIES_MSG_TYPE`), so a relay may fold this cell's plain replies
FOLD_REPLIES_KEY = "jupyter_dist_fold_replies"
#: message type of a relay batch's entry that stands for several ranks' plain replies to
#: one cell (status ok and nothing else to say: `common.relay_batch`); its content is
#: ``{"replies": [[kernel session, execution count, group or null], ...]}``
FOLDED_REPLIES_MSG_TYPE = "jupyter_dist_execute_replies"
#: execute_request metadata key: how many ranks the cell is sent to; a rank whose process
#: group user code destroyed makes it again before a cell that all ranks run
#: (`rank.process_group`), never before one that only some run
CELL_RANKS_KEY = "jupyter_dist_cell_ranks"
#: execute_reply content key: the rank's default process group after the cell, its backend
#: (``"gloo"``), or ``""`` when it has none; the session's status reports it
GROUP_KEY = "jupyter_dist_group"
#: IOPub message type a rank sends from its SIGINT handler, the moment Python takes an
#: interrupt and raises ``KeyboardInterrupt`` in the cell: from then on the rank is
#: handling it (a traceback, the cell's ``except``/``finally``), not stuck
#: (`rank.interrupt_ack`)
INTERRUPT_ACK_MSG_TYPE = "jupyter_dist_interrupt_ack"
#: IOPub message a rank sends behind its output as it asks for input (``content``: the
#: ``prompt`` and ``password`` of the ``input_request`` it sends on stdin next): the
#: notebook side opens the prompt once both came, so the output before it is shown first
INPUT_MSG_TYPE = "jupyter_dist_input"
#: the start of the line a surviving rank prints, as it joins a new process group, with
#: the JSON list of what it had built on the old one (`rank.regroup`; read by the control
#: plane from that silent cell's output)
REBUILD_MARK = "jupyter_dist-rebuild: "
#: how an entry of that list ends when the rank rebuilt it in place on the new group
REBUILT = ", rebuilt)"
#: the ``ename`` of a rank console's input refused unrun (a collective typed there): the
#: console's to show, not an error of the rank's
REFUSED_IN_CONSOLE_ENAME = "CollectiveInConsole"
