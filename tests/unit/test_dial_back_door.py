"""The dial-back listener's door (``control/launchers/dial_back_door.py``) without sockets:
refusals are counted and sampled, never kept one by one, and warned of at most once a
while; each address's dials draw on an allowance of its own."""

from __future__ import annotations

import logging

import pytest

from jupyter_dist.control.launchers import dial_back_door as door
from jupyter_dist.control.launchers.dial_back_door import PeerAllowance, Refusals, peer_key


def test_thousands_of_refusals_keep_counts_a_sample_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = Refusals()
    with caplog.at_level(logging.WARNING, logger=door.__name__):
        for n in range(5000):
            refusals.add("too many", f"10.0.{n // 250}.{n % 250}:4000", "x" * 1000)
        refusals.add("no key proven within 5 s", "10.9.9.9:1")
    assert refusals.total == 5001
    assert refusals.counts == {"too many": 5000, "no key proven within 5 s": 1}
    assert len(refusals.sample) == door.SAMPLE
    assert refusals.sample[-1] == "10.9.9.9:1: no key proven within 5 s"
    assert all(len(line) < 260 for line in refusals.sample)  # details cut
    warnings = [r.getMessage() for r in caplog.records if r.name == door.__name__]
    assert len(warnings) == 1, warnings
    assert "refused a connection from 10.0.0.0:4000: too many" in warnings[0]


def test_an_address_dials_within_its_allowance_and_others_are_apart() -> None:
    allowance = PeerAllowance()
    allowance.size_for(2)
    admitted = [allowance.admit("10.0.0.1", now=100.0) for _ in range(door.PEER_PENDING)]
    assert admitted == [None] * door.PEER_PENDING
    # as many proving their keys at once as it may
    assert "more than 16 connections of its address" in str(allowance.admit("10.0.0.1", 100.0))
    for _ in range(door.PEER_PENDING):
        allowance.done("10.0.0.1")
    # its bucket: what was left of the burst, then empty until it refills
    for _ in range(door.PEER_BURST - door.PEER_PENDING):
        assert allowance.admit("10.0.0.1", 100.0) is None
        allowance.done("10.0.0.1")
    assert "dialled more than 10 times a second" in str(allowance.admit("10.0.0.1", 100.0))
    assert allowance.admit("10.0.0.2", 100.0) is None  # another address is apart
    assert allowance.admit("10.0.0.1", 100.0 + 1.5 / door.PEER_RATE) is None  # refilled


def test_a_large_session_lets_its_nodes_share_an_address() -> None:
    allowance = PeerAllowance()
    allowance.size_for(100)
    assert all(allowance.admit("10.0.0.1", 5.0) is None for _ in range(100))
    assert allowance.admit("10.0.0.1", 5.0) is not None


def test_the_addresses_remembered_are_bounded() -> None:
    allowance = PeerAllowance()
    for n in range(door.MAX_PEERS * 3):
        assert allowance.admit(f"h{n}", float(n) / 1000) is None
        allowance.done(f"h{n}")
    assert len(allowance._buckets) <= door.MAX_PEERS
    assert not allowance.pending


def test_addresses_count_by_holder() -> None:
    assert peer_key("10.1.2.3") == "10.1.2.3"
    assert peer_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert peer_key("2001:db8:1:2:aaaa::1") == peer_key("2001:db8:1:2:bbbb::9")
    assert peer_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != peer_key("2001:db8:1:2::1")
