"""Widget clicks answered while the notebook kernel is busy running a cell.

ipykernel handles a comm message (a button's click) on its main thread, and a running
``%%distributed`` cell keeps that thread busy, so a button in the cell view would answer
only once the cell had ended: too late for "where is every rank now?". A kernel with
subshells (ipykernel 7, JEP 91) runs other shells on threads of their own. This module
asks the notebook kernel, over its own control channel (a ``create_subshell_request``, as
any client may send), for one subshell, and routes a chosen widget's messages there: that
widget's handlers run at once, beside the busy cell.

The routing uses the hook through which ipykernel picks a comm's subshell
(``_reply_subshell_for``). Where the kernel has no subshells or no such hook,
`route_clicks` returns False and the caller leaves the button out.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

#: seconds to wait for the kernel to create the subshell
CREATE_TIMEOUT_S = 10.0

_lock = threading.Lock()
_subshell: dict[int, str | None] = {}  # id(kernel) -> subshell id (None: not available)


def _this_kernel() -> Any:
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None)


def _create_subshell() -> str | None:
    """A new subshell of this kernel, made through its control channel; None if it cannot."""
    from ipykernel.connect import get_connection_file
    from jupyter_client.blocking.client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=get_connection_file())
    client.load_connection_file()
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        request = client.session.msg("create_subshell_request", {})
        client.control_channel.send(request)
        while True:
            reply = client.control_channel.get_msg(timeout=CREATE_TIMEOUT_S)
            if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                break
    finally:
        client.stop_channels()
    content = reply["content"]
    if content.get("status") != "ok" or not content.get("subshell_id"):
        log.info("the kernel made no subshell: %s", content)
        return None
    return str(content["subshell_id"])


def click_subshell() -> str | None:
    """This notebook kernel's subshell for clicks, made on first use; None where the kernel
    has none (ipykernel 6, a terminal IPython) or making one failed."""
    kernel = _this_kernel()
    if kernel is None or not getattr(kernel, "_supports_kernel_subshells", False):
        return None
    with _lock:
        if id(kernel) not in _subshell:
            try:
                _subshell[id(kernel)] = _create_subshell()
            except Exception as err:  # no control channel, a timeout: the button stays out
                log.warning("no subshell for the cell view's buttons: %s", err)
                _subshell[id(kernel)] = None
        return _subshell[id(kernel)]


def route_clicks(widget: Any) -> bool:
    """Have ``widget``'s messages handled on the click subshell; False where they cannot be
    (its handlers would then wait for the running cell).

    Call `click_subshell` before making the widget: the first call makes the subshell,
    and the widget must be routed before the browser can show it.
    """
    comm = getattr(widget, "comm", None)
    if comm is None or not hasattr(comm, "_reply_subshell_for"):
        return False
    subshell = click_subshell()
    if subshell is None:
        return False

    def to_click_subshell(_data: Any, _default: str | None) -> str:
        return subshell

    comm._reply_subshell_for = to_click_subshell
    return True
