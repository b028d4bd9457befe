"""Start an IPython kernel in a freshly forked rank process.

Rank kernels are ordinary ipykernel kernels; only a few settings differ from a notebook's
kernel: history stays in memory (many ranks must not fight over one SQLite file), and the
banner and start-up chatter are off.
"""

from __future__ import annotations

RANK_KERNEL_ARGS = (
    "--HistoryManager.hist_file=:memory:",
    "--IPKernelApp.quiet=True",
    "--IPKernelApp.no_stdout=False",
)


def run_rank_kernel(connection_file: str) -> None:
    """Initialise and run the kernel until it is shut down."""
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()  # untyped library calls below
    app.initialize(["-f", connection_file, *RANK_KERNEL_ARGS])
    app.start()
