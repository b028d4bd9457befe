"""What a rank's console refuses to run: collectives, found by name in the syntax tree."""

from __future__ import annotations

from jupyter_dist.rank.console_guard import ALLOW, collectives_in, refusal


def test_collectives_are_found_however_torch_distributed_is_named() -> None:
    code = "\n".join(
        [
            "import torch.distributed as tdist",
            "from torch.distributed import all_reduce as ar",
            "from torch import distributed",
            "x = 1",
            "dist.barrier()",
            "tdist.broadcast(t, src=0)",
            "ar(t)",
            "distributed.all_gather(out, t)",
            "torch.distributed.send(t, 1)",
        ]
    )
    assert [(c.line, c.call) for c in collectives_in(code)] == [
        (5, "dist.barrier"),
        (6, "tdist.broadcast"),
        (7, "ar"),
        (8, "distributed.all_gather"),
        (9, "torch.distributed.send"),
    ]


def test_other_code_and_code_that_does_not_parse_pass() -> None:
    for code in (
        "dist.get_rank(); dist.get_world_size()",
        "import time; time.sleep(1)",
        "model.barrier()",  # not torch.distributed's
        "%timeit dist.barrier()",  # IPython's syntax: left to the kernel
        "def f(:",
    ):
        assert collectives_in(code) == [] and refusal(code, "1", "2") is None, code


def test_the_refusal_names_the_call_the_rank_and_the_way_out() -> None:
    why = refusal("t = 1\ndist.all_reduce(t)\ndist.barrier()", "1", "4")
    assert why is not None
    assert why.startswith("line 2: dist.all_reduce() (and 1 more) is a collective")
    assert "rank 1 alone" in why and "the other 3 ranks are not" in why
    assert "%%distributed" in why and ALLOW in why
    assert refusal(f"{ALLOW}\ndist.barrier()", "1", "4") is None


def test_the_refusals_name_is_the_one_the_control_plane_knows() -> None:
    from jupyter_dist.common.wire_names import REFUSED_IN_CONSOLE_ENAME
    from jupyter_dist.rank.console_guard import CollectiveInConsole

    assert CollectiveInConsole.__name__ == REFUSED_IN_CONSOLE_ENAME
