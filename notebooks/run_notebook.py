"""Execute a notebook headless and print what it shows, cell by cell.

    python notebooks/run_notebook.py notebooks/quickstart.ipynb [--timeout SECONDS]

For every code cell it prints the cell's source, then its text outputs (stream text and
``text/plain`` results). It stops at the first cell that raises, prints the error, and
exits with status 1. The notebook file itself is not modified.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellControlSignal, CellExecutionError, DeadKernelError

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def show_source(number: int, source: str) -> None:
    lines = source.rstrip().splitlines() or [""]
    prompt = f"In [{number}]: "
    print("\n" + prompt + lines[0])
    for line in lines[1:]:
        print(" " * len(prompt) + line)
    print("-" * 72)


def show_outputs(outputs: list[nbformat.NotebookNode]) -> None:
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            text = out.get("text", "")
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain")
            if text:
                print(text)
        elif kind == "error":
            traceback = _ANSI.sub("", "\n".join(out.get("traceback", []))).strip()
            print(traceback or f"{out.get('ename')}: {out.get('evalue')}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument(
        "--timeout", type=int, default=300, help="seconds each cell may run (default 300)"
    )
    parser.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    args = parser.parse_args(argv)

    # Prefer the kernel of the environment running this script (the project's .venv)
    # over one a user may have registered under the same name.
    os.environ.setdefault("JUPYTER_PREFER_ENV_PATH", "1")

    nb = nbformat.read(args.notebook, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=args.kernel,
        timeout=args.timeout,
        startup_timeout=120,
        resources={"metadata": {"path": str(args.notebook.resolve().parent)}},
    )
    print(f"Running {args.notebook} on kernel {args.kernel!r}")
    started = time.monotonic()
    failed = False
    number = 0
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            number += 1
            show_source(number, cell.source)
            cell_started = time.monotonic()
            try:
                client.execute_cell(cell, index)
            except (CellExecutionError, CellControlSignal, DeadKernelError, TimeoutError) as e:
                show_outputs(cell.get("outputs", []))
                if not any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
                    print(f"{type(e).__name__}: {e}")
                print(f"\nFAILED: In [{number}] ({time.monotonic() - cell_started:.1f}s)")
                failed = True
                break
            show_outputs(cell.outputs)
            print(f"({time.monotonic() - cell_started:.1f}s)")
    if failed:
        return 1
    print(f"\nOK: {args.notebook} ran in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
