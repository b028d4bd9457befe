"""The jupyter_dist sidebar in a real JupyterLab: sessions started by notebooks and by its
own form appear live with their ranks, a late rank stands out while its cell runs, the
stacks view names the collective, the buttons act, and "use here" attaches a notebook."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests import dead_ports

from .lab import RENDER_TIMEOUT_MS, NotebookPage, OpenNotebook
from .test_dark_theme_browser import set_theme

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
SESSION = "sidebar"
HANG = (
    f"%%distributed --session {SESSION}\n"
    "import threading, time, torch, torch.distributed as dist\n"
    "if dist.get_rank() == 1:  # joins rank 0's all_reduce 25 s later, from a thread\n"
    "    threading.Timer(25, lambda: dist.all_reduce(torch.ones(1))).start()\n"
    "else:\n"
    "    dist.all_reduce(torch.ones(1))\n"
    "print('joined')"
)


def open_sidebar(nb: NotebookPage) -> None:
    from playwright.sync_api import expect

    tab = nb.page.locator('.jp-SideBar [data-id="jupyter-dist-sidebar"]')
    expect(tab).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    tab.click()
    expect(nb.page.locator("#jupyter-dist-sidebar")).to_be_visible(timeout=RENDER_TIMEOUT_MS)


#: WCAG contrast of each element's text colour against the panel's background
_CONTRAST_JS = """els => els.map(e => {
    const lum = c => { const m = c.match(/[\\d.]+/g).map(Number);
        const lin = v => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
        return 0.2126 * lin(m[0]) + 0.7152 * lin(m[1]) + 0.0722 * lin(m[2]); };
    const fg = lum(getComputedStyle(e).color);
    const bg = lum(getComputedStyle(e.closest('.jp-DistPanel')).backgroundColor);
    return (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
})"""


def show_sidebar(nb: NotebookPage) -> None:
    """Show the panel by its command (activates it; a click on the tab toggles it)."""
    from playwright.sync_api import expect

    nb.page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.commands.hasCommand("
        "'jupyter-dist:open-sidebar')",
        timeout=RENDER_TIMEOUT_MS,
    )
    nb.page.evaluate("() => window.jupyterapp.commands.execute('jupyter-dist:open-sidebar')")
    expect(nb.page.locator("#jupyter-dist-sidebar")).to_be_visible(timeout=RENDER_TIMEOUT_MS)


def new_session(nb: NotebookPage) -> None:
    sidebar = nb.page.locator("#jupyter-dist-sidebar")
    sidebar.get_by_role("button", name="Start a new session").click()


def session_card(nb: NotebookPage, name: str):  # type: ignore[no-untyped-def]
    return nb.page.locator(f'#jupyter-dist-sidebar .jp-DistSession[data-session="{name}"]')


def click_action(nb: NotebookPage, name: str, label: str) -> None:
    session_card(nb, name).locator("button.jp-DistButton", has_text=label).first.click()


def test_a_running_cell_shows_live_with_its_late_rank_and_stacks(
    open_lab_notebook: OpenNotebook,
) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook(
        "sidebar_hang",
        ["%load_ext jupyter_dist", f"%%distributed --procs 2 --session {SESSION}\nx = 1", HANG],
    )
    open_sidebar(nb)
    empty = nb.page.locator("#jupyter-dist-sidebar .jp-DistPanel-empty")
    expect(empty).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("sidebar-empty")
    nb.start_all()
    card = session_card(nb, SESSION)
    expect(card).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(card.locator(".jp-DistBadge").first).to_have_text(
        re.compile(r"^(ready|busy \d+ s)$"), timeout=RENDER_TIMEOUT_MS
    )
    card.get_by_role("button", name=f"Open session {SESSION}").click()
    late = card.locator(".jp-DistRank.jp-mod-late")
    # while the cell runs: rank 0 waits in all_reduce, rank 1 is done and idle
    expect(late).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
    assert late.get_attribute("data-rank") == "0"
    expect(card.locator('.jp-DistRank[data-rank="1"] .jp-DistBadge')).to_have_text("idle")
    expect(card.locator(".jp-DistSession-activity")).to_contain_text("running a cell from")
    # live samples while the session is open: the node's CPU and memory, each rank's
    meters = card.locator('.jp-DistNode-metrics [role="meter"]')
    expect(meters.first).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    assert meters.first.get_attribute("aria-label").startswith("CPU ")
    expect(card.locator(".jp-DistRank-usage").first).to_contain_text(
        "MiB", timeout=RENDER_TIMEOUT_MS
    )
    nb.screenshot("sidebar-late-rank")
    elapsed = late.locator(".jp-DistRank-elapsed")
    # it ticks each second (polled; a loaded machine may draw late)
    expect(elapsed, "the late rank's elapsed time does not tick").not_to_have_text(
        elapsed.inner_text(), timeout=10_000
    )
    click_action(nb, SESSION, "Stacks")
    dialog = nb.page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("rank 0: in all_reduce", timeout=RENDER_TIMEOUT_MS)
    expect(dialog).to_contain_text("rank 1: idle")
    nb.screenshot("sidebar-stacks", dialog.locator(".jp-Dialog-content"))
    dialog.get_by_role("button", name="Close").click()
    # interrupted from the panel: rank 0 waits in all_reduce, where the interrupt cannot
    # reach it, so it is freed from it (no rank replaced) and the cell says so
    click_action(nb, SESSION, "Interrupt")
    assert not nb.wait_all(), "the interrupted cell did not fail"
    expect(nb.output(2)).to_contain_text(f"session '{SESSION}' was interrupted from JupyterLab")
    expect(nb.output(2)).to_contain_text("Rank 0 was blocked in a collective")
    expect(nb.output(2)).to_contain_text("Every rank kept its variables")
    # the cell says who interrupted it; this page, where it was asked, adds no notice
    # over the cell's error (the server's notice is for the session's other users)
    nb.page.wait_for_timeout(2000)  # the notice would have come by now
    toasts = nb.page.locator(".Toastify")
    shown = toasts.first.inner_text() if toasts.count() else ""
    assert "was interrupted from" not in shown, shown
    expect(card.locator(".jp-DistRank.jp-mod-late")).to_have_count(0, timeout=RENDER_TIMEOUT_MS)
    show = card.get_by_role("button", name="show")  # the fresh ranks are idle alike
    if show.count():
        show.first.click()
    # rank 1's log in a tab of its own, following the file
    card.locator('.jp-DistRank[data-rank="1"] button', has_text="log").click()
    log = nb.page.locator("#jupyter-dist-log-sidebar-1 .jp-DistLog")  # a fresh rank's
    expect(log).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("sidebar-rank-log")

    # a console on rank 1's own kernel: code typed there runs in that rank
    card.locator('.jp-DistRank[data-rank="1"] button', has_text="console").click()
    console = nb.page.locator(".jp-CodeConsole").last
    expect(console).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    nb.run_in_console(console, "import os; print('this is rank', os.environ['RANK'])")
    expect(console.locator(".jp-CodeConsole-content")).to_contain_text(
        "this is rank 1", timeout=RENDER_TIMEOUT_MS
    )
    nb.screenshot("sidebar-rank-console")

    # every control has a name a screen reader says, and works from the keyboard
    unnamed = nb.page.locator("#jupyter-dist-sidebar button:not([aria-label])")
    assert unnamed.count() == 0, unnamed.all_inner_texts()
    toggle = card.get_by_role("button", name=f"Fold session {SESSION}")
    toggle.focus()
    nb.page.keyboard.press("Enter")
    expect(card).to_have_attribute("aria-expanded", "false")
    card.get_by_role("button", name=f"Open session {SESSION}").focus()
    nb.page.keyboard.press("Enter")
    expect(card).to_have_attribute("aria-expanded", "true")

    # the settings decide which samples show: without the node's CPU and memory, no meters
    status, _ = nb.lab.call(
        "PUT",
        "/lab/api/settings/jupyter-dist-labextension:plugin",
        {"raw": json.dumps({"metrics": ["ranks"]})},
    )
    assert status == 204, status
    nb.page.reload()
    show_sidebar(nb)
    card = session_card(nb, SESSION)
    expect(card).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    if card.get_attribute("aria-expanded") != "true":
        card.get_by_role("button", name=f"Open session {SESSION}").click()
    folded = card.locator(".jp-DistRank button", has_text="show")
    if folded.count():
        folded.click()
    expect(card.locator(".jp-DistRank-usage").first).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(card.locator('.jp-DistNode-metrics [role="meter"]')).to_have_count(0)
    nb.lab.call("PUT", "/lab/api/settings/jupyter-dist-labextension:plugin", {"raw": "{}"})
    nb.page.reload()
    show_sidebar(nb)
    card = session_card(nb, SESSION)
    expect(card).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    if card.get_attribute("aria-expanded") != "true":
        card.get_by_role("button", name=f"Open session {SESSION}").click()

    # hidden, the panel stops listening: its streams are aborted and none starts again
    aborted: list[str] = []
    started: list[str] = []
    nb.page.on(
        "requestfailed", lambda r: aborted.append(r.url) if "jupyter-dist/api" in r.url else None
    )
    nb.page.on("request", lambda r: started.append(r.url) if "jupyter-dist/api" in r.url else None)
    nb.page.locator('.jp-SideBar [data-id="filebrowser"]').click()
    nb.page.wait_for_timeout(3000)
    assert any("/events" in u for u in aborted), aborted
    assert any("/metrics" in u for u in aborted), aborted
    assert not [u for u in started if "/events" in u or "/metrics" in u], started
    open_sidebar(nb)
    set_theme(nb, "JupyterLab Dark")
    expect(nb.page.locator("#jupyterlab-splash")).to_have_count(0, timeout=RENDER_TIMEOUT_MS)
    expect(card).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    background = card.evaluate("e => getComputedStyle(e.closest('.jp-DistPanel')).backgroundColor")
    assert background not in ("rgb(255, 255, 255)", "rgba(0, 0, 0, 0)"), background
    # every badge and line of text stands out from the dark panel (WCAG contrast >= 3)
    contrasts = card.locator(
        ".jp-DistBadge, .jp-DistSession-facts, .jp-DistRank-label"
    ).evaluate_all(_CONTRAST_JS)
    assert contrasts and min(contrasts) >= 3, contrasts
    nb.screenshot("sidebar-dark")
    set_theme(nb, "JupyterLab Light")
    ours = [e for e in nb.console_errors if "jupyter-dist" in e or "DistPanel" in e]
    assert not ours, ours


def test_form_use_here_interrupt_and_shut_down(open_lab_notebook: OpenNotebook) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook(
        "sidebar_use",
        [
            "%%distributed\nimport os, time\nprint('on rank', os.environ['RANK'])",
            "%%distributed\ntime.sleep(120)",
        ],
    )
    open_sidebar(nb)
    nb.page.locator("#jupyter-dist-sidebar").get_by_role(
        "button", name="Start a new session"
    ).click()
    form = nb.page.locator(".jp-Dialog .jp-DistForm")
    form.locator('input[name="name"]').fill("formed")
    form.locator('input[name="count"]').fill("2")
    nb.page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    card = session_card(nb, "formed")
    expect(card.locator(".jp-DistBadge").first).to_have_text("ready", timeout=RENDER_TIMEOUT_MS)
    card.get_by_role("button", name="Open session formed").click()
    expect(card.locator(".jp-DistRank")).to_have_count(1)  # ranks 0-1 idle, folded
    expect(card.locator(".jp-DistRank-label")).to_have_text("ranks 0-1")
    card.locator(".jp-DistRank button", has_text="show").click()  # unfolds on demand
    expect(card.locator(".jp-DistRank")).to_have_count(2)
    nb.screenshot("sidebar-formed")

    # a bad value: the server's message, at its field, in the form that stays open
    nb.page.locator("#jupyter-dist-sidebar").get_by_role(
        "button", name="Start a new session"
    ).click()
    form.locator('input[name="name"]').fill("bad")
    form.locator('input[name="count"]').fill("0")
    nb.page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    expect(form.locator("#jp-DistForm-error-count")).to_have_text(
        "'0': expected a whole number of at least 1", timeout=RENDER_TIMEOUT_MS
    )
    nb.page.locator(".jp-Dialog").get_by_role("button", name="Cancel").click()

    click_action(nb, "formed", "Use here")
    expect(card.locator(".jp-DistSession-activity")).to_contain_text(
        "sidebar_use.ipynb", timeout=RENDER_TIMEOUT_MS
    )
    nb.start_all()
    expect(nb.output(0)).to_contain_text("on rank 1", timeout=RENDER_TIMEOUT_MS)
    expect(card.locator(".jp-DistSession-activity")).to_contain_text(
        "running a cell from", timeout=RENDER_TIMEOUT_MS
    )
    click_action(nb, "formed", "Interrupt")
    assert not nb.wait_all(), "the sleeping cell was not interrupted"
    expect(nb.output(1)).to_contain_text("interrupted from JupyterLab")

    click_action(nb, "formed", "Shut down")
    confirm = nb.page.locator(".jp-Dialog")
    expect(confirm).to_contain_text("variables in its 2 ranks are lost")
    confirm.get_by_role("button", name="Shut down").click()
    expect(card).to_have_count(0, timeout=RENDER_TIMEOUT_MS)
    expect(nb.page.locator("#jupyter-dist-sidebar .jp-DistPanel-empty")).to_be_visible()
    nb.screenshot("sidebar-after-shutdown")


def test_the_form_offers_ray_with_its_fields_checked_where_they_are_typed(
    open_lab_notebook: OpenNotebook,
) -> None:
    """Ray in the form: its fields appear (the hosts go), Count holds each launcher's
    default, a bad value is marked at its field in the form's words by the form itself or
    by the server's check (nothing starts until both passed), and what was typed stays.
    Then a start against an address where no Ray cluster answers: the form says what the
    start does while it runs, no session card offers buttons meanwhile, and the failure
    comes back under "Ray address" in words, with no card left behind."""
    from playwright.sync_api import expect

    nb = open_lab_notebook("sidebar_ray_form", ["print('nothing runs here')"])
    open_sidebar(nb)
    new_session(nb)
    dialog = nb.page.locator(".jp-Dialog")
    form = dialog.locator(".jp-DistForm")
    ray_rows = form.locator(".jp-DistForm-ray")
    count = form.locator('input[name="count"]')
    expect(ray_rows).to_have_count(6, timeout=RENDER_TIMEOUT_MS)
    for i in range(6):
        expect(ray_rows.nth(i)).to_be_hidden()  # local: no Ray fields
    # Count holds a value, each launcher's own, until one is typed in
    expect(count).to_have_value("2")
    for launcher, value in (("k8s", "1"), ("ssh", "1"), ("local", "2")):
        form.locator('select[name="launcher"]').select_option(launcher)
        expect(count).to_have_value(value)
    form.locator('select[name="launcher"]').select_option("ray")
    expect(count).to_have_value("1")
    for i in range(6):
        expect(ray_rows.nth(i)).to_be_visible()
    expect(form.locator('input[name="hosts"]')).to_be_hidden()
    expect(form.locator('select[name="rayStrategy"]')).to_have_value("STRICT_SPREAD")
    expect(form.locator('input[name="rayAddress"]')).to_have_attribute(
        "placeholder", "RAY_ADDRESS, else auto"
    )

    form.locator('input[name="name"]').fill("on-ray")
    form.locator('input[name="nodes"]').fill("2")
    count.fill("")
    dialog.get_by_role("button", name="Start").click()
    expect(form.locator("#jp-DistForm-error-count")).to_have_text(
        "expected the number of processes each node runs (1, or one per node: 4,2): Ray has "
        "no default"
    )
    count.fill("1")
    form.locator('select[name="launcher"]').select_option("local")
    expect(count).to_have_value("1")  # typed in: kept
    form.locator('select[name="launcher"]').select_option("ray")
    form.locator('select[name="rayStrategy"]').select_option("PACK")
    form.locator('input[name="rayRuntimeEnv"]').fill('["pip"]')
    dialog.get_by_role("button", name="Start").click()
    expect(form.locator("#jp-DistForm-error-rayRuntimeEnv")).to_contain_text(
        "'[\"pip\"]': not a JSON object; expected a JSON object", timeout=RENDER_TIMEOUT_MS
    )
    expect(form.locator('input[name="rayRuntimeEnv"]')).to_have_attribute("aria-invalid", "true")
    nb.screenshot("form-ray-runtime-env")

    # the server's own check: the CPUs a bundle may hold, in the form's words
    form.locator('input[name="rayRuntimeEnv"]').fill('{"env_vars": {"A": "1"}}')
    form.locator('input[name="rayCpus"]').fill("5000")
    dialog.get_by_role("button", name="Start").click()
    expect(form.locator("#jp-DistForm-error-rayCpus")).to_have_text(
        "'5000': expected 1 to 4096", timeout=RENDER_TIMEOUT_MS
    )
    expect(form.locator("#jp-DistForm-error-rayRuntimeEnv")).to_be_hidden()
    expect(form.locator('select[name="rayStrategy"]')).to_have_value("PACK")  # kept
    expect(form.locator('input[name="name"]')).to_have_value("on-ray")
    nb.screenshot("form-ray-cpus")
    # custom resources: sent as --ray-resources, the server's refusal at their field
    form.locator('input[name="rayCpus"]').fill("1")
    form.locator('input[name="rayResources"]').fill("CPU=2")
    dialog.get_by_role("button", name="Start").click()
    expect(form.locator("#jp-DistForm-error-rayResources")).to_contain_text(
        "'CPU' is set by the \"CPUs per node\" field", timeout=RENDER_TIMEOUT_MS
    )
    expect(form.locator("#jp-DistForm-error-rayCpus")).to_be_hidden()
    nb.screenshot("form-ray-resources")
    form.locator('input[name="rayResources"]').fill("")

    # a start where no Ray cluster answers: said while it runs, then under "Ray address"
    # (it takes the connection and says nothing: the start says so at its bound, 5 s)
    with dead_ports.silent_port("") as port:
        form.locator('input[name="rayCpus"]').fill("1")
        form.locator('input[name="rayAddress"]').fill(f"127.0.0.1:{port}")
        dialog.get_by_role("button", name="Start").click()
        progress = form.locator(".jp-DistForm-progress")
        expect(progress).to_have_text(
            f'Starting session on-ray: Ray cluster 127.0.0.1:{port} (given by the "Ray address" '
            "field): connecting",
            timeout=RENDER_TIMEOUT_MS,
        )
        expect(dialog.get_by_role("button", name="Start")).to_be_disabled()
        cards = nb.page.locator('#jupyter-dist-sidebar .jp-DistSession[data-session="on-ray"]')
        expect(cards.locator("button.jp-DistButton")).to_have_count(0)  # nothing to act on yet
        nb.screenshot("form-ray-starting")
        error = form.locator("#jp-DistForm-error-rayAddress")
        expect(error).to_contain_text(
            f"'127.0.0.1:{port}': no Ray cluster answered there within", timeout=RENDER_TIMEOUT_MS
        )
        expect(error).to_contain_text("Expected the GCS address of a running cluster's head")
        expect(error).not_to_contain_text("--ray-address")
        assert not re.search(r"\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] ", error.inner_text())
        expect(form.locator('input[name="rayAddress"]')).to_have_attribute("aria-invalid", "true")
        expect(progress).to_be_hidden()
        expect(dialog.get_by_role("button", name="Start")).to_be_enabled()
        expect(cards).to_have_count(0)  # the failed start left no session card
        expect(nb.page.locator("#jupyter-dist-sidebar .jp-DistPanel-empty")).to_be_visible()
        expect(count).to_have_value("1")  # what was typed stays
        nb.screenshot("form-ray-unreachable")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(nb.page.locator("#jupyter-dist-sidebar .jp-DistPanel-empty")).to_be_visible()
    # the browser's own line for the start's 502 (the failure the form showed) aside
    ours = [
        e
        for e in nb.console_errors
        if ("jupyter-dist" in e or "DistForm" in e) and "status of 502 (AgentError)" not in e
    ]
    assert not ours, ours


def test_the_form_offers_kubernetes_with_its_fields_checked_and_sent_as_the_k8s_object(
    open_lab_notebook: OpenNotebook, tmp_path: Path
) -> None:
    """Kubernetes in the form: its fields appear (the hosts and Ray's go), a bad namespace
    is marked at its field by the form, Enter in the node selectors starts a line (it does
    not press Start), and good values go to the server as the ``k8s`` object, whose check
    reads the pod template on the server and names the missing file at its field (no
    cluster needed: nothing starts until both checks passed)."""
    from playwright.sync_api import expect

    nb = open_lab_notebook("sidebar_k8s_form", ["print('nothing runs here')"])
    open_sidebar(nb)
    new_session(nb)
    dialog = nb.page.locator(".jp-Dialog")
    form = dialog.locator(".jp-DistForm")
    k8s_rows = form.locator(".jp-DistForm-k8s")
    expect(k8s_rows).to_have_count(12, timeout=RENDER_TIMEOUT_MS)
    for i in range(12):
        expect(k8s_rows.nth(i)).to_be_hidden()  # local: no Kubernetes fields
    form.locator('select[name="launcher"]').select_option("k8s")
    for i in range(12):
        expect(k8s_rows.nth(i)).to_be_visible()
    expect(form.locator('input[name="hosts"]')).to_be_hidden()
    expect(form.locator('input[name="rayAddress"]')).to_be_hidden()
    expect(form.locator(".jp-DistForm-k8s > span:first-child")).to_have_text(
        [
            "Namespace", "Context", "Image", "CPUs per pod", "Memory per pod", "Node selectors",
            "Tolerations", "Pod template", "Callback", "Timeout (s)", "Queue", "GPU resource",
        ]
    )  # fmt: skip

    form.locator('input[name="name"]').fill("on-k8s")
    form.locator('input[name="nodes"]').fill("2")
    form.locator('select[name="kind"]').select_option("gpus")
    form.locator('input[name="count"]').fill("4")
    form.locator('input[name="k8sNamespace"]').fill("ML_Team")
    form.locator('input[name="k8sMemory"]').fill("64Gi")
    dialog.get_by_role("button", name="Start").click()
    expect(form.locator("#jp-DistForm-error-k8sNamespace")).to_contain_text(
        "'ML_Team': expected a Kubernetes namespace (lower-case letters", timeout=RENDER_TIMEOUT_MS
    )
    expect(form.locator('input[name="k8sNamespace"]')).to_have_attribute("aria-invalid", "true")
    nb.screenshot("form-k8s-namespace")

    form.locator('input[name="k8sNamespace"]').fill("ml")
    expect(form.locator("#jp-DistForm-error-k8sNamespace")).to_be_hidden()
    selectors = form.locator('textarea[name="k8sNodeSelectors"]')
    selectors.click()
    selectors.type("nvidia.com/gpu.product=H100")
    selectors.press("Enter")  # a second line, not Start
    selectors.type("pool=train")
    expect(dialog).to_be_visible()
    expect(selectors).to_have_value("nvidia.com/gpu.product=H100\npool=train")
    form.locator('textarea[name="k8sTolerations"]').fill("nvidia.com/gpu:NoSchedule")
    missing = str(tmp_path / "missing-pod.yaml")
    form.locator('input[name="k8sPodTemplate"]').fill(missing)
    form.locator('input[name="k8sCallback"]').fill("10.0.3.7:7077")
    form.locator('input[name="k8sTimeout"]').fill("600")
    form.locator('input[name="k8sQueue"]').fill("team-gpus")
    form.locator('input[name="k8sGpuResource"]').fill("nvidia.com/mig-1g.10gb")
    with nb.page.expect_request(lambda r: r.method == "POST" and "validate=true" in r.url) as asked:
        dialog.get_by_role("button", name="Start").click()
    assert json.loads(asked.value.post_data or "") == {
        "name": "on-k8s",
        "launcher": "k8s",
        "nodes": 2,
        "gpus": 4,
        "k8s": {
            "namespace": "ml",
            "memory": "64Gi",
            "node_selector": ["nvidia.com/gpu.product=H100", "pool=train"],
            "tolerations": ["nvidia.com/gpu:NoSchedule"],
            "pod_template": missing,
            "callback": "10.0.3.7:7077",
            "timeout": 600,
            "queue": "team-gpus",
            "gpu_resource": "nvidia.com/mig-1g.10gb",
        },
    }
    error = form.locator("#jp-DistForm-error-k8sPodTemplate")
    expect(error).to_have_text(f"{missing!r}: No such file or directory", timeout=RENDER_TIMEOUT_MS)
    expect(form.locator('input[name="k8sPodTemplate"]')).to_have_attribute("aria-invalid", "true")
    expect(form.locator('input[name="name"]')).to_have_value("on-k8s")  # kept
    expect(selectors).to_have_value("nvidia.com/gpu.product=H100\npool=train")
    nb.screenshot("form-k8s-pod-template")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(nb.page.locator("#jupyter-dist-sidebar .jp-DistPanel-empty")).to_be_visible()
    ours = [e for e in nb.console_errors if "jupyter-dist" in e or "DistForm" in e]
    assert not ours, ours
