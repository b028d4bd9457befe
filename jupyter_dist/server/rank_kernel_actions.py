"""``POST /api/kernels/ID/interrupt`` and ``.../restart`` for the rank kernels a console
runs on (`server.rank_consoles`); every other kernel goes on to jupyter_server's own
handler, which this one extends.

jupyter_server cannot do either for a kernel it adopted and does not own: it interrupts
by signalling the kernel's process, or by a control message when the kernel spec says so,
but an adopted kernel has no process of the server's and no kernel spec of its own (the
handler failed with a TypeError, an HTTP 500 JupyterLab never shows), and it restarts by
starting a new kernel process of the kernel spec's, one that nobody stops until the server
does. Here:

* interrupt: the session interrupts that one rank (a KeyboardInterrupt in the code it
  runs, the other ranks untouched): 204.
* restart: refused, 409, saying why and what to do instead. A rank cannot restart on its
  own: its process group is the session's, so the session restarts every rank together.
  The sidebar's rank consoles ask the user and restart the session themselves
  (``labextension/src/rankConsoles.ts``), and re-attach to the new ranks.

Extension handlers come before jupyter_server's own in tornado's routing, so this route
takes the kernels' action URLs first.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from jupyter_server.services.kernels.handlers import KernelActionHandler
from tornado import web

from jupyter_dist.control.manager import SessionManager
from jupyter_dist.errors import UnknownSession
from jupyter_dist.server.rank_consoles import RankConsoles


def restart_refusal(kernel_id: str, session: str, rank: int, world_size: int | None) -> str:
    """Why a rank kernel does not restart alone, and what to do instead."""
    ranks = f"all {world_size} ranks" if world_size else "all its ranks"
    return (
        f"kernel {kernel_id} is rank {rank} of the distributed session {session!r}: a rank "
        f"cannot restart alone (its process group is the session's). Restart the session "
        f"instead, which restarts {ranks}: the Restart button of the distributed sessions "
        f"sidebar, or `%dist restart {session}` in a notebook using it"
    )


class RankKernelActionHandler(KernelActionHandler):
    """jupyter_server's kernel action handler, which knows the rank kernels."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str) -> None:
        consoles: RankConsoles | None = self.settings.get("jupyter_dist_consoles")
        found = consoles.rank_of(kernel_id) if consoles is not None else None
        if found is None:
            if consoles is not None and consoles.of_another_server(kernel_id):
                raise web.HTTPError(
                    409,
                    f"kernel {kernel_id} is a rank kernel of another Jupyter server sharing "
                    f"this server's external-kernels folder: {action} it on that server",
                )
            posted = super().post(kernel_id, action)
            if posted is not None:
                await posted
            return
        name, rank = found
        manager: SessionManager = self.settings["jupyter_dist_manager"]
        session = manager.sessions.get(name)
        if action == "restart":
            size = session.spec.world_size if session is not None else None
            self.log.info("jupyter_dist: refused to restart rank %d of %s alone", rank, name)
            raise web.HTTPError(409, restart_refusal(kernel_id, name, rank, size))
        try:
            await manager.interrupt(name, [rank])
        except UnknownSession:
            raise web.HTTPError(
                404, f"kernel {kernel_id}: its session {name!r} is gone; close this console"
            ) from None
        self.log.info("jupyter_dist: interrupted rank %d of %s from its console", rank, name)
        self.set_status(204)
        self.finish()


RANK_KERNEL_HANDLERS = [
    (
        r"/api/kernels/(?P<kernel_id>\w+-\w+-\w+-\w+-\w+)/(?P<action>restart|interrupt)",
        RankKernelActionHandler,
    ),
]
