"""A collective typed in a rank's console is refused before it runs, saying why.

A console (JupyterLab's, on a rank kernel the sidebar opened) runs its code on that one
rank. A torch.distributed collective (``dist.all_reduce``, ``dist.barrier``, ...) waits
until every rank of the process group calls it; the other ranks are not running the
console's code, so the rank would wait for ever, deaf to an interrupt while it waits in
C code, and every cell of the session would queue behind it. Nothing can bring it back
but a restart of the session.

So code from any client but the notebook side (whose cells run on every rank, and carry
``CREDIT_KEY`` in their metadata) is looked at before it runs: a call of a collective
through ``torch.distributed`` (``dist.barrier()``, ``torch.distributed.broadcast(t, 0)``,
or a name imported from it) refuses the whole input, nothing of it run, with an error
naming the call and the way out. To run it anyway (the other ranks wait in the same
collective already, from their own consoles), the input's first line is `ALLOW`.

The look is by name in the code's syntax tree: a collective reached in another way (a
function defined in an earlier cell, DDP's forward) is not seen.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

#: the first line of a console input that runs its collectives anyway
ALLOW = "# jupyter_dist: allow collectives"
#: torch.distributed's functions that wait for the other ranks of the group
COLLECTIVES = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_reduce",
        "all_reduce_coalesced",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "batch_isend_irecv",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "init_process_group",
        "irecv",
        "isend",
        "monitored_barrier",
        "new_group",
        "recv",
        "recv_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "send",
        "send_object_list",
    }
)
_MODULE = "torch.distributed"


class CollectiveInConsole(Exception):
    """The error a refused console input shows (never raised: shown as its reply)."""


@dataclass(frozen=True)
class Collective:
    """One call of a collective in a console's input."""

    line: int
    call: str  # as written: ``dist.barrier``


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names the input gives torch.distributed itself, and those it imports from it."""
    modules = {_MODULE, "dist"}  # ``dist``: what every tutorial and the ranks' cells call it
    functions: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == _MODULE and alias.asname:
                    modules.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == _MODULE:
            for alias in node.names:
                if alias.name in COLLECTIVES:
                    functions.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            for alias in node.names:
                if alias.name == "distributed":
                    modules.add(alias.asname or alias.name)
    return modules, functions


def collectives_in(code: str) -> list[Collective]:
    """The collective calls in ``code``, in order; none for code that does not parse
    (IPython syntax such as magics and ``!`` lines is left for the kernel to judge)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    modules, functions = _aliases(tree)
    found: list[Collective] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name is None:
            continue
        owner, _, function = name.rpartition(".")
        if (owner in modules and function in COLLECTIVES) or (not owner and name in functions):
            found.append(Collective(node.lineno, name))
    return sorted(found, key=lambda c: c.line)


def refusal(code: str, rank: str, world_size: str) -> str | None:
    """Why ``code``, from a console on ``rank``, is not run; None when it may run."""
    if code.lstrip().startswith(ALLOW):
        return None
    found = collectives_in(code)
    if not found:
        return None
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    count = int(world_size) - 1 if world_size.isdigit() else 0
    others = {0: "the other ranks are", 1: "the other rank is"}.get(
        count, f"the other {count} ranks are"
    )
    return (
        f"line {first.line}: {first.call}(){more} is a collective: it waits until every "
        f"rank calls it, and this console runs on rank {rank} alone, so it would block "
        f"rank {rank} for good ({others} not running it), and the session's "
        f"cells behind it. Nothing ran. Run it in a %%distributed cell, which runs on "
        f"every rank; or, if the other ranks already wait in the same collective, make "
        f"{ALLOW!r} the first line to run it here anyway."
    )
