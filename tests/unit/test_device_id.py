"""A script's ``init_process_group(device_id=...)`` is answered as torch answers it when it
makes a group, whether the session's group is there or not (`check_device_id`)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from jupyter_dist.rank.process_group import check_device_id  # noqa: E402


def test_none_passes() -> None:
    check_device_id(None)


@pytest.mark.parametrize("device", [torch.device("cpu"), torch.device("cpu", 0)])
def test_a_cpu_device_is_refused_as_torch_refuses_it(device: Any) -> None:
    with pytest.raises(ValueError) as refused:
        check_device_id(device)
    said = str(refused.value)
    assert f"device_id={device!r}" in said
    assert "init_process_group device_id parameter must be an accelerator with an index" in said
    assert "leave device_id out on CPU" in said


def test_other_values_name_what_was_expected() -> None:
    with pytest.raises(TypeError, match=r"device_id='cuda:0'.*expected a torch.device or an int"):
        check_device_id("cuda:0")
    if torch.accelerator.current_accelerator() is None:
        with pytest.raises(ValueError, match="no accelerator support"):
            check_device_id(0)
        with pytest.raises(ValueError, match="accelerator is None, not 'cuda'"):
            check_device_id(torch.device("cuda", 0))
    else:
        kind = torch.accelerator.current_accelerator().type
        count = torch.accelerator.device_count()
        check_device_id(torch.device(kind, 0))
        with pytest.raises(ValueError, match="out of range"):
            check_device_id(torch.device(kind, count))
