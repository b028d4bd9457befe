"""A real JupyterLab in headless Chromium, for tests that assert on what notebooks render.

`start_lab` runs ``jupyter lab`` as a subprocess with token auth on and folders of its own
for config, data, runtime, user settings, workspaces and IPython, so nothing of the user's
is read; the environment's labextensions (``sys.prefix``/share/jupyter/labextensions) are
still found. Nothing reaches the network: the news feed and the update check are off on the
server and in the settings, the extension manager is read-only, and Chromium resolves no
host name. `launch_chromium` starts the system's Chromium through Playwright.
`open_notebook` loads a notebook in a fresh workspace and returns a `NotebookPage`, which
runs every cell, waits until they have finished, takes screenshots and keeps the page's
console errors.

    lab = start_lab(tmp_path)
    write_notebook(lab.root / "demo.ipynb", ["print('hi')"], kernel_name)
    with sync_playwright() as pw:
        nb = open_notebook(launch_chromium(pw).new_page(), lab, "demo.ipynb")
        assert nb.run_all()
        nb.screenshot("demo")
    stop_lab(lab)
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nbformat
import psutil

import jupyter_dist
from jupyter_dist.common.ports import free_port

if TYPE_CHECKING:
    from playwright.sync_api import (
        Browser,
        ConsoleMessage,
        Locator,
        Page,
        Playwright,
        Request,
    )

__all__ = [
    "OUTPUT_DIR",
    "Lab",
    "NotebookPage",
    "OpenNotebook",
    "chromium_executable",
    "launch_chromium",
    "missing_requirements",
    "open_notebook",
    "start_lab",
    "stop_lab",
    "write_notebook",
]

#: Screenshots land here (git ignores everything in it).
OUTPUT_DIR = Path(__file__).parent / "output"
#: JupyterLab's first load in Chromium takes 10-30 s on a busy 2-core machine.
LOAD_TIMEOUT_S = 180.0
#: Running a notebook's cells, ranks' start-up included.
RUN_TIMEOUT_S = 240.0
#: the first render of a widget or of a cell's output may lag behind the kernel's reply
RENDER_TIMEOUT_MS = 60_000
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "/usr/bin/chromium")
DIST_API = "/jupyter-dist/api/v1"
#: REST calls to the lab go straight to it, whatever proxy the environment names
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: User settings (``<settings dir>/<plugin>.jupyterlab-settings``) for a quiet, whole page.
USER_SETTINGS: dict[str, dict[str, Any]] = {
    # no "Would you like to get notified about official Jupyter news?" toast over the
    # notebook (news_url=None does not stop it), and no news or update requests
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    # every cell in the DOM, not only the ones scrolled into view
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    # the notebook file stays as the test wrote it
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    # widget state is NOT saved with notebooks: JupyterLab's default, what a new user has
}


def chromium_executable() -> str | None:
    """The system's Chromium (Debian's ``chromium`` package), or None."""
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def missing_requirements() -> list[str]:
    """What this machine lacks to run the browser tests; empty when it can."""
    problems = []
    if importlib.util.find_spec("playwright") is None:
        problems.append("the Python package playwright is not installed")
    if importlib.util.find_spec("jupyterlab") is None:
        problems.append("the Python package jupyterlab is not installed")
    if chromium_executable() is None:
        problems.append("no chromium on PATH (Debian package chromium; see .ci/setup-browser)")
    return problems


@dataclass
class Lab:
    """A running ``jupyter lab``: its address, token, notebook folder and process."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A REST call with the token; returns the status and the decoded JSON reply."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"token {self.token}")
        try:
            with _DIRECT.open(request, timeout=60) as reply:
                raw = reply.read()
                return reply.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw) if raw else None
            except ValueError:
                return err.code, raw.decode(errors="replace")

    def page_url(self, path: str, **query: str) -> str:
        """The browser address of ``path`` (``/lab/tree/a.ipynb``), token included."""
        params = urllib.parse.urlencode({**query, "token": self.token})
        return f"{self.url}{path}?{params}"

    def descendants(self) -> list[psutil.Process]:
        """Every live process under the server: kernels, agents, ranks."""
        found = []
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.process.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
        return found

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def shutdown_kernels(self, timeout: float = 60) -> list[psutil.Process]:
        """Stop every jupyter_dist session and every kernel, as a user closing everything
        would; returns the processes still alive under the server after ``timeout``."""
        status, sessions = self.call("GET", f"{DIST_API}/sessions")
        if status == 200:
            for session in sessions:
                self.call("DELETE", f"{DIST_API}/sessions/{session['name']}")
        for session in self.call("GET", "/api/sessions")[1] or []:
            self.call("DELETE", f"/api/sessions/{session['id']}")
        for kernel in self.call("GET", "/api/kernels")[1] or []:
            self.call("DELETE", f"/api/kernels/{kernel['id']}")
        _gone, alive = psutil.wait_procs(self.descendants(), timeout=timeout)
        return list(alive)


def _write_settings(settings_dir: Path) -> None:
    for plugin, values in USER_SETTINGS.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2))


def _server_url(runtime_dir: Path, pid: int) -> str | None:
    """The server's address from its ``jpserver-PID.json`` (right even if it had to take
    another port than the one asked for)."""
    info = runtime_dir / f"jpserver-{pid}.json"
    try:
        url = str(json.loads(info.read_text())["url"])
    except (OSError, ValueError, KeyError):
        return None
    return url.rstrip("/")


def _link_labextension(data_dir: Path) -> None:
    """Put the sidebar built in the checkout under test first on JupyterLab's list: the
    user's data folder comes before the environment's, whose link may name another
    checkout (``jupyter labextension develop`` links one)."""
    built = Path(jupyter_dist.__file__).parent / "labextension"
    if not (built / "package.json").is_file():
        return  # not built here: the environment's copy is what there is
    name = json.loads((built / "package.json").read_text())["name"]
    link = data_dir / "labextensions" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(built, target_is_directory=True)


def start_lab(workdir: Path, args: Sequence[str] = (), timeout: float = LOAD_TIMEOUT_S) -> Lab:
    """Start ``jupyter lab`` with everything under ``workdir``; notebooks go in
    ``workdir/notebooks``. Returns once ``/api/status`` answers."""
    dirs = {
        name: workdir / name
        for name in ("notebooks", "config", "data", "runtime", "settings", "workspaces", "ipython")
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    _write_settings(dirs["settings"])
    _link_labextension(dirs["data"])
    env = {
        **os.environ,
        # the user's config, data (kernelspecs, labextensions), settings and workspaces are
        # not read; the environment's (under sys.prefix) still are
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
        "IPYTHONDIR": str(dirs["ipython"]),
        # in a virtual environment jupyter_core looks in the environment's folders first,
        # where the labextension may be another checkout's build: ours (linked into the
        # data folder above) comes first
        "JUPYTER_PREFER_ENV_PATH": "0",
        # a rank blocked in a collective is judged stuck 3 s after an interrupt it does
        # not take (10 s by default): the stop tests wait less
        "JUPYTER_DIST_INTERRUPT_ACK_S": "3",
    }
    for var in ("JUPYTER_DIST_SERVER", "JUPYTERLAB_DIR", "JUPYTER_TOKEN"):
        env.pop(var, None)
    token = secrets.token_hex(16)
    log_path = workdir / "lab.log"
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
        f"--port={free_port()}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={dirs['notebooks']}",
        f"--LabApp.user_settings_dir={dirs['settings']}",
        f"--LabApp.workspaces_dir={dirs['workspaces']}",
        # what JupyterLab could fetch from the internet: the news feed, the latest
        # version on PyPI, and PyPI's extension listings in the extension manager
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        # window.jupyterapp: run commands and read kernel state as Galata does
        "--LabApp.expose_app_in_browser=True",
        *(["--allow-root"] if os.geteuid() == 0 else []),
        *args,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=dirs["notebooks"]
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        url = _server_url(dirs["runtime"], process.pid)
        if url is not None:
            lab = Lab(url, token, dirs["notebooks"], process, log_path)
            with contextlib.suppress(OSError):
                if lab.call("GET", "/api/status")[0] == 200:
                    return lab
        time.sleep(0.2)
    stop_lab(Lab("", token, dirs["notebooks"], process, log_path), timeout=10)
    raise RuntimeError(f"jupyter lab did not start in {timeout:.0f} s:\n{log_path.read_text()}")


def stop_lab(lab: Lab, timeout: float = 60) -> list[psutil.Process]:
    """Stop the server (it stops its kernels and sessions); kill whatever it left behind
    and return those processes, so a caller can fail on the leak."""
    below = lab.descendants()
    if lab.process.poll() is None:
        lab.process.send_signal(signal.SIGTERM)
    try:
        lab.process.wait(timeout)
    except subprocess.TimeoutExpired:
        lab.process.kill()
        lab.process.wait()
    _gone, alive = psutil.wait_procs(below, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return list(alive)


def write_notebook(path: Path, cells: Sequence[str], kernel_name: str) -> Path:
    """A notebook of code cells that JupyterLab opens with the kernelspec ``kernel_name``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": kernel_name}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    return path


def launch_chromium(playwright: Playwright, args: Sequence[str] = ()) -> Browser:
    """Headless system Chromium, without its sandbox (``--no-sandbox``: root and most
    containers cannot have it); no host name resolves, so pages reach only the lab."""
    executable = chromium_executable()
    if executable is None:
        raise RuntimeError("no chromium on PATH (Debian package chromium)")
    return playwright.chromium.launch(
        executable_path=executable,
        headless=True,
        chromium_sandbox=False,
        args=["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", *args],
    )


# The notebook panel showing PATH, from JupyterLab's shell.
_PANEL_JS = """
function panelOf(path) {
    const app = window.jupyterapp;
    if (!app || !app.shell) return null;
    for (const widget of app.shell.widgets('main')) {
        if (widget.context && widget.context.path === path) return widget;
    }
    return null;
}
"""

# Truthy once the notebook is open and its kernel idle; a dialog (no such kernel, a
# failed load) comes back as {dialog: its text}.
_READY_JS = f"""(path) => {{
    {_PANEL_JS}
    const dialog = document.querySelector('.jp-Dialog');
    if (dialog) return {{dialog: dialog.innerText}};
    const panel = panelOf(path);
    if (!panel || !panel.context.isReady) return false;
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    if (!kernel || kernel.status !== 'idle' || kernel.connectionStatus !== 'connected') {{
        return false;
    }}
    return {{id: panel.id, kernel: kernel.name}};
}}"""

# `notebook:run-all-cells` returns NotebookActions.runAll's promise: true when every
# cell ran without error, false when one failed (and the rest were not run).
_RUN_ALL_JS = f"""(path) => {{
    {_PANEL_JS}
    const app = window.jupyterapp;
    const panel = panelOf(path);
    app.shell.activateById(panel.id);
    const run = window.__browserTestRun = {{done: false, ok: null, error: null}};
    app.commands.execute('notebook:run-all-cells').then(
        (ok) => {{ run.ok = ok; run.done = true; }},
        (err) => {{ run.error = String(err); run.done = true; }},
    );
}}"""

# Runs cell ``index`` alone (`notebook:run-cell`: the selected cell, no advance); its
# promise settles as run-all's does, so `wait_all` waits for it.
_RUN_CELL_JS = f"""([path, index]) => {{
    {_PANEL_JS}
    const app = window.jupyterapp;
    const panel = panelOf(path);
    app.shell.activateById(panel.id);
    panel.content.activeCellIndex = index;
    panel.content.deselectAll();
    const run = window.__browserTestRun = {{done: false, ok: null, error: null}};
    app.commands.execute('notebook:run-cell').then(
        (ok) => {{ run.ok = ok; run.done = true; }},
        (err) => {{ run.error = String(err); run.done = true; }},
    );
}}"""

_SAVE_JS = f"""(path) => {{
    {_PANEL_JS}
    const panel = panelOf(path);
    window.__browserTestSaved = false;
    panel.context.save().then(() => {{ window.__browserTestSaved = true; }});
}}"""

_SAVED_JS = """() => window.__browserTestSaved === true"""

# True once the console panel holding ``el`` has a connected kernel that is idle: keys
# sent to a console before its kernel is there run nothing (the prompt keeps them)
_CONSOLE_IDLE_JS = """(el) => {
    for (const w of window.jupyterapp.shell.widgets('main')) {
        if (!w.node.contains(el) || !w.sessionContext) continue;
        const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
        return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
    }
    return false;
}"""

_RUN_DONE_JS = f"""(path) => {{
    {_PANEL_JS}
    const run = window.__browserTestRun;
    if (!run || !run.done) return false;
    const panel = panelOf(path);
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    if (!kernel || kernel.status !== 'idle') return false;
    for (const prompt of panel.node.querySelectorAll('.jp-InputPrompt')) {{
        if (prompt.textContent.includes('*')) return false;
    }}
    return {{ok: run.ok, error: run.error}};
}}"""


@dataclass
class NotebookPage:
    """A notebook open in JupyterLab in one browser page."""

    page: Page
    lab: Lab
    path: str
    panel_id: str = ""
    #: console errors and uncaught exceptions of the page, in order
    console_errors: list[str] = field(default_factory=list)
    #: requests the page tried to send anywhere but the lab
    external_requests: list[str] = field(default_factory=list)

    @property
    def panel(self) -> Locator:
        return self.page.locator(f'[id="{self.panel_id}"]')

    def cell(self, index: int) -> Locator:
        return self.panel.locator(".jp-Notebook .jp-Cell").nth(index)

    def output(self, index: int) -> Locator:
        """Cell ``index``'s output area."""
        return self.cell(index).locator(".jp-Cell-outputArea")

    def run_all(self, timeout: float = RUN_TIMEOUT_S) -> bool:
        """Run every cell (Run > Run All Cells) and wait until all have finished and the
        kernel is idle. True when no cell failed."""
        self.start_all()
        return self.wait_all(timeout)

    def start_all(self) -> None:
        """Start running every cell; `wait_all` waits for them."""
        self.page.evaluate(_RUN_ALL_JS, self.path)

    def run_cell(self, index: int, timeout: float = RUN_TIMEOUT_S) -> bool:
        """Run cell ``index`` alone and wait until it has finished; True when it did not
        fail."""
        self.page.evaluate(_RUN_CELL_JS, [self.path, index])
        return self.wait_all(timeout)

    def wait_all(self, timeout: float = RUN_TIMEOUT_S) -> bool:
        """Wait until the cells `start_all` started have finished; True when none failed."""
        handle = self.page.wait_for_function(
            _RUN_DONE_JS, arg=self.path, timeout=timeout * 1000, polling=250
        )
        result = handle.json_value()
        if result["error"]:
            raise RuntimeError(f"run all cells failed in the page: {result['error']}")
        return bool(result["ok"])

    def run_in_console(self, console: Locator, code: str, timeout: float = 60) -> None:
        """Type ``code`` into the prompt of ``console`` (a ``.jp-CodeConsole``) and run it
        with Shift+Enter, as a person does once the console's kernel is idle. Returns once
        the prompt has taken the code (it is then in the console's cells)."""
        from playwright.sync_api import expect

        prompt = console.locator(".jp-CodeConsole-promptCell .cm-content")
        expect(prompt).to_be_visible(timeout=timeout * 1000)
        self.page.wait_for_function(
            _CONSOLE_IDLE_JS, arg=console.element_handle(), timeout=timeout * 1000, polling=250
        )
        prompt.click()
        expect(prompt).to_be_focused(timeout=timeout * 1000)  # keys typed before are lost
        self.page.keyboard.type(code)
        expect(prompt).to_have_text(code, timeout=timeout * 1000)
        self.page.keyboard.press("Shift+Enter")
        expect(prompt).not_to_have_text(code, timeout=timeout * 1000)

    def keep_console_error(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            where = msg.location
            self.console_errors.append(f"{msg.text} ({where['url']}:{where['lineNumber']})")

    def keep_external_request(self, request: Request) -> None:
        if not request.url.startswith((self.lab.url + "/", "data:", "blob:")):
            self.external_requests.append(request.url)

    def save(self, timeout: float = 60) -> None:
        """Save the notebook (File > Save) and wait until it is written."""
        self.page.evaluate(_SAVE_JS, self.path)
        self.page.wait_for_function(_SAVED_JS, arg=self.path, timeout=timeout * 1000, polling=250)

    def screenshot(self, name: str, target: Locator | None = None) -> Path:
        """Save the page (or one element of it) to ``OUTPUT_DIR/name.png``."""
        OUTPUT_DIR.mkdir(exist_ok=True)
        path = OUTPUT_DIR / f"{name}.png"
        if target is None:
            self.page.screenshot(path=str(path))
        else:
            target.scroll_into_view_if_needed()
            target.screenshot(path=str(path))
        return path


def open_notebook(page: Page, lab: Lab, path: str, timeout: float = LOAD_TIMEOUT_S) -> NotebookPage:
    """Open ``path`` (relative to ``lab.root``) in a fresh workspace and wait until its
    kernel is idle."""
    nb = NotebookPage(page, lab, path)
    page.on("console", nb.keep_console_error)
    page.on("pageerror", lambda err: nb.console_errors.append(f"uncaught: {err}"))
    page.on("request", nb.keep_external_request)
    # ?reset: start from an empty workspace, not the layout an earlier test left
    page.goto(
        lab.page_url(f"/lab/tree/{urllib.parse.quote(path)}", reset=""), timeout=timeout * 1000
    )
    handle = page.wait_for_function(_READY_JS, arg=path, timeout=timeout * 1000, polling=250)
    ready = handle.json_value()
    if "dialog" in ready:
        raise RuntimeError(f"JupyterLab opened a dialog on {path}: {ready['dialog']!r}")
    nb.panel_id = ready["id"]
    return nb


#: the ``open_lab_notebook`` fixture: ``(name, cell sources) -> NotebookPage``
#: open_lab_notebook(name, cells): write name.ipynb with these cells (None: keep the file
#: that is there) and open it
OpenNotebook = Callable[[str, Sequence[str] | None], NotebookPage]
