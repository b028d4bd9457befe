"""Profiles: the file read with bounds, its fields checked against the magic's own options,
``--profile NAME`` filling what the cell leaves out, and every error naming the file, the
profile and the field."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.common.profiles import (
    MAX_FILE_BYTES,
    PROFILES_FILE,
    find_profile,
    options_of,
    profiles_path,
    read_profiles,
    write_profile,
)
from jupyter_dist.errors import SpecError
from jupyter_dist.notebook.magics import DistMagics
from jupyter_dist.notebook.profile_args import apply_profile, in_profile_words

PROFILES = """\
gpu-pods:
  k8s: true
  namespace: ml-team
  image: registry.example.com/team/train:1.4
  gpus: [4, 2]
  node_selector: [a=b, c=d]
  k8s-timeout: 30
ray-big:
  ray-address: head:6379
  ray-runtime-env: {pip: [einops]}
  procs: 2
two-local:
  procs: 2
  backend: gloo
"""


class _Manager:
    def __init__(self) -> None:
        self.sessions: dict[str, object] = {}


class _Plane:
    def __init__(self) -> None:
        self.manager = _Manager()

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    path = tmp_path / PROFILES_FILE
    path.write_text(PROFILES)
    return path


def _cell(line: str) -> tuple[DistMagics, Any, Any]:
    magics = DistMagics(None, _Plane())  # type: ignore[arg-type]
    args = magics._cell_args(line)
    use = apply_profile(magics.distributed.parser, args)
    return magics, args, use


def test_the_file_is_in_the_jupyter_config_folder_and_read_in_order(config: Path) -> None:
    assert profiles_path() == config
    profiles = read_profiles()
    assert list(profiles) == ["gpu-pods", "ray-big", "two-local"]
    assert profiles["gpu-pods"].launcher == "k8s" and profiles["ray-big"].launcher == "ray"
    assert profiles["two-local"].launcher == "local"
    # field names as the cell writes them, underscores read as dashes
    assert "node-selector" in profiles["gpu-pods"].settings


def test_a_profile_fills_the_options_the_cell_leaves_out_and_the_cell_overrides(
    config: Path,
) -> None:
    magics, args, _ = _cell("--profile gpu-pods --nodes 2 --namespace other")
    request = magics._shape(args, "s")
    assert request.launcher == "k8s" and request.nodes == 2 and request.gpus == (4, 2)
    assert request.k8s is not None
    assert request.k8s.namespace == "other"  # the cell's
    assert request.k8s.image == "registry.example.com/team/train:1.4"  # the profile's
    assert request.k8s.node_selector == ("a=b", "c=d") and request.k8s.timeout == 30
    # --procs in the cell replaces the profile's --gpus
    magics, args, _ = _cell("--profile gpu-pods --procs 1")
    request = magics._shape(args, "s")
    assert request.procs == (1,) and request.gpus is None
    # a mapping is JSON text for an option that takes JSON
    magics, args, _ = _cell("--profile ray-big")
    ray = magics._shape(args, "s").ray
    assert ray is not None and ray.address == "head:6379"
    assert ray.runtime_env == '{"pip": ["einops"]}'


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (
            "namspace: ml",
            "field 'namspace': no %%distributed option --namspace; did you mean namespace?",
        ),
        ("nodes: many", "field 'nodes': --nodes: 'many': expected a number of nodes, 1 to"),
        (
            "k8s: yes please",
            "field 'k8s': 'yes please'; expected true or false (--k8s is a switch)",
        ),
        ("gpus: true", "field 'gpus': true; expected a value for --gpus, not true or false"),
        ("push: x", "field 'push': --push belongs to one cell, not to a profile"),
        ("image:", "field 'image': null; expected a value"),
    ],
)
def test_a_bad_field_is_named_by_file_profile_and_field(
    config: Path, fields: str, said: str
) -> None:
    config.write_text(f"p:\n  {fields}\n")
    with pytest.raises(SpecError) as refused:
        _cell("--profile p --procs 1")
    assert str(refused.value).startswith(f"{config}: profile 'p', field ")
    assert said in str(refused.value)


def test_a_value_checked_later_names_the_profile_field_not_a_flag_never_typed(
    config: Path,
) -> None:
    config.write_text("p:\n  k8s: true\n  memory: lots\n  procs: 1\n")
    magics, args, use = _cell("--profile p")
    with pytest.raises(SpecError) as refused:
        magics._shape(args, "s")
    said = str(in_profile_words(refused.value, use))
    assert said.startswith(f"{config}: profile 'p', field 'memory': --memory 'lots'")
    # the cell's own flag is named as it is
    magics, args, use = _cell("--profile p --memory 1x")
    with pytest.raises(SpecError) as refused:
        magics._shape(args, "s")
    assert str(in_profile_words(refused.value, use)).startswith("--memory '1x'")


def test_unknown_profiles_and_files_are_named(config: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="has no profile 'gpu-pod'; did you mean gpu-pods"):
        find_profile("gpu-pod")
    with pytest.raises(SpecError, match=r"no profiles in .*none\.yaml"):
        find_profile("x", tmp_path / "none.yaml")
    config.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match=r"a list at the top; expected profiles by name"):
        read_profiles()
    config.write_text("bad name:\n  procs: 1\n")
    with pytest.raises(SpecError, match=r"profile 'bad name': expected a name of 1-64"):
        read_profiles()


def test_the_file_is_bounded_before_it_is_read(config: Path) -> None:
    config.write_text("p:\n  procs: 1\n" + "#" * MAX_FILE_BYTES)
    with pytest.raises(SpecError, match=f"bytes; expected at most {MAX_FILE_BYTES}"):
        read_profiles()
    config.unlink()
    os.mkfifo(config)  # a FIFO would block a reader that opened it plainly
    with pytest.raises(SpecError, match="not a regular file"):
        read_profiles()
    config.unlink()
    config.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [*{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}]\n"
        for a, b in zip("abcdefg", "bcdefgh", strict=True)
    ))  # fmt: skip
    with pytest.raises(SpecError, match="more than"):
        read_profiles()


def test_a_profile_is_written_atomically_private_and_beside_the_others(config: Path) -> None:
    write_profile("two-local", {"procs": 4})
    write_profile("new", {"k8s": True, "node-selector": ["a=b"]})
    profiles = read_profiles()
    assert list(profiles) == ["gpu-pods", "ray-big", "two-local", "new"]
    assert profiles["two-local"].settings == {"procs": 4}
    assert profiles["new"].settings == {"k8s": True, "node-selector": ["a=b"]}
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert [p.name for p in config.parent.iterdir()] == [PROFILES_FILE]  # no temporary left
    with pytest.raises(SpecError, match=r"profile '\.\./x': expected a name"):
        write_profile("../x", {})


def test_every_option_of_the_magic_is_a_field() -> None:
    known = options_of(DistMagics.distributed.parser)  # type: ignore[attr-defined]
    assert known["k8s"] == "switch" and known["toleration"] == "many"
    assert known["nodes"] == "value" and "profile" not in known and "push" not in known


def test_every_launcher_option_is_a_field_of_the_servers_requests_and_back() -> None:
    """A launcher's option (`launcher_options.OPTIONS`) goes into the request under its
    launcher's object, and a request's field comes back as that option: the sidebar and
    ``POST /sessions`` take profiles that use it with no table to keep."""
    from jupyter_dist.common.launcher_options import OPTIONS
    from jupyter_dist.server.profile_requests import field_of, settings_of

    for launcher, options in OPTIONS.items():
        for flag in options:
            place = field_of(flag[2:])
            assert place is not None and place[0] == launcher, (flag, place)
            body = {"launcher": launcher, launcher: {place[1]: "x"}}
            assert settings_of(body) == {launcher: True, flag[2:]: "x"}, flag
    assert field_of("ssh-config") == (None, "ssh_config") and field_of("output") is None
