"""A notebook kernel driven as a frontend with an input box drives it: cells executed with
``allow_stdin``, and each ``input_request`` on the kernel's stdin channel answered from a
list of answers (or handed to the test)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

from jupyter_dist.settings import OUTPUT_VAR
from jupyter_dist.text import strip_ansi
from tests.conftest import ready_client


@dataclass
class Prompt:
    text: str
    password: bool


@dataclass
class CellRun:
    reply: dict[str, Any]
    prompts: list[Prompt]
    #: streams, tracebacks and the text of displays (status lines), in order, no colours
    text: str
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StdinFrontend:
    km: KernelManager
    kc: Any

    def run(
        self,
        code: str,
        answers: list[str] | None = None,
        allow_stdin: bool = True,
        on_prompt: Callable[[Prompt], str | None] | None = None,
        timeout: float = 180,
    ) -> CellRun:
        """Execute ``code``; each prompt takes the next of ``answers`` (or what
        ``on_prompt`` returns; None: it answers nothing)."""
        left = list(answers or ())
        prompts: list[Prompt] = []
        texts: list[str] = []
        messages: list[dict[str, Any]] = []

        def output(msg: dict[str, Any]) -> None:
            messages.append(msg)
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                texts.append(content["text"])
            elif kind == "error":
                texts.append("\n".join(content["traceback"]) + "\n")
            elif kind in ("display_data", "update_display_data"):
                texts.append(str(content.get("data", {}).get("text/plain", "")) + "\n")

        def stdin(msg: dict[str, Any]) -> None:
            prompt = Prompt(msg["content"]["prompt"], bool(msg["content"]["password"]))
            prompts.append(prompt)
            value = on_prompt(prompt) if on_prompt is not None else None
            if on_prompt is None:
                assert left, f"asked {prompt.text!r} with no answer left; asked: {prompts}"
                value = left.pop(0)
            if value is not None:
                self.kc.input(value)

        reply = self.kc.execute_interactive(
            code,
            allow_stdin=allow_stdin,
            output_hook=output,
            stdin_hook=stdin,
            timeout=timeout,
        )
        return CellRun(reply["content"], prompts, strip_ansi("".join(texts)), messages)


@contextmanager
def stdin_frontend(kernel_name: str, cwd: Path) -> Iterator[StdinFrontend]:
    """A notebook kernel with text output and the extension loaded."""
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(cwd=str(cwd), env={**os.environ, OUTPUT_VAR: "text"})
    try:
        kc = ready_client(km, timeout=60)
        frontend = StdinFrontend(km, kc)
        assert frontend.run("%load_ext jupyter_dist").reply["status"] == "ok"
        yield frontend
        kc.stop_channels()
    finally:
        if km.is_alive():
            km.shutdown_kernel(now=True)
