"""The new-session form and the server's profiles in a real JupyterLab: choosing a profile
fills the form (what it has no field for named under the list), a start from it sends the
profile's name and starts its session, and "Save as profile" saves what the form holds,
with what the chosen profile set beyond the form's fields."""

from __future__ import annotations

import json

import pytest
import yaml

from .lab import RENDER_TIMEOUT_MS, Lab, OpenNotebook
from .test_sidebar_browser import new_session, open_sidebar, session_card

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
PROFILES = """\
pods:
  k8s: true
  namespace: ml
  nodes: 2
  gpus: 4
  node-selector: [pool=train, gpu=h100]
  output: text
two-cpu:
  procs: 2
  framework: none
  session: from-profile
"""


def test_the_form_starts_from_a_profile_and_saves_one(
    lab: Lab, open_lab_notebook: OpenNotebook
) -> None:
    from playwright.sync_api import expect

    path = lab.root.parent / "config" / "jupyter_dist_profiles.yaml"
    path.write_text(PROFILES)
    try:
        nb = open_lab_notebook("profiles_form", ["print('nothing runs here')"])
        open_sidebar(nb)
        new_session(nb)
        dialog = nb.page.locator(".jp-Dialog")
        form = dialog.locator(".jp-DistForm")
        profile = form.locator('select[name="profile"]')
        expect(profile.locator("option")).to_have_text(
            ["(none)", "pods (k8s)", "two-cpu (local)"], timeout=RENDER_TIMEOUT_MS
        )

        # a Kubernetes profile fills the Kubernetes fields; a cell's option is named
        profile.select_option("pods")
        expect(form.locator('select[name="launcher"]')).to_have_value("k8s")
        expect(form.locator('input[name="k8sNamespace"]')).to_have_value("ml")
        expect(form.locator('textarea[name="k8sNodeSelectors"]')).to_have_value(
            "pool=train\ngpu=h100"
        )
        expect(form.locator('input[name="nodes"]')).to_have_value("2")
        expect(form.locator('select[name="kind"]')).to_have_value("gpus")
        expect(form.locator('input[name="count"]')).to_have_value("4")
        note = form.locator("#jp-DistForm-profileNote")
        expect(note).to_contain_text(f"From {path}.")
        expect(note).to_contain_text("Options of a notebook's cell, not used here: output.")
        nb.screenshot("form-profile-k8s", dialog)

        # another profile: its values, the Kubernetes ones gone; the start names it
        profile.select_option("two-cpu")
        expect(form.locator('select[name="launcher"]')).to_have_value("local")
        expect(form.locator('input[name="k8sNamespace"]')).to_have_value("")
        expect(form.locator('input[name="name"]')).to_have_value("from-profile")
        expect(form.locator('input[name="count"]')).to_have_value("2")
        expect(note).to_contain_text("Also applied, no field here: framework=none.")
        with nb.page.expect_request(
            lambda r: r.method == "POST" and r.url.split("?")[0].endswith("/sessions")
            and "validate=true" not in r.url
        ) as started:  # fmt: skip
            dialog.get_by_role("button", name="Start").click()
        assert json.loads(started.value.post_data or "") == {
            "name": "from-profile",
            "procs": 2,
            "profile": "two-cpu",
        }
        card = session_card(nb, "from-profile")
        expect(card.locator(".jp-DistBadge").first).to_have_text("ready", timeout=RENDER_TIMEOUT_MS)
        _, started_session = lab.call("GET", "/jupyter-dist/api/v1/sessions/from-profile")
        assert started_session["shape"] == "2 CPU ranks (no process group)", started_session

        # saved: the form, and what the chosen profile set beyond its fields
        new_session(nb)
        profile.select_option("two-cpu")
        form.locator('input[name="count"]').fill("1")
        form.locator('input[name="saveProfile"]').fill("one-cpu")
        form.get_by_role("button", name="Save as profile").click()
        expect(form.locator("#jp-DistForm-profileSaved")).to_have_text(
            f"Saved profile one-cpu in {path}", timeout=RENDER_TIMEOUT_MS
        )
        expect(profile).to_have_value("one-cpu")
        expect(dialog).to_be_visible()  # saving does not start anything
        nb.screenshot("form-profile-saved", dialog)
        saved = yaml.safe_load(path.read_text())
        assert saved["one-cpu"] == {"procs": 1, "framework": "none"}, saved
        assert list(saved) == ["pods", "two-cpu", "one-cpu"]
        dialog.get_by_role("button", name="Cancel").click()
        expect(dialog).to_have_count(0)
    finally:
        path.unlink(missing_ok=True)
