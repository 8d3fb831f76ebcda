"""Where network namespaces cannot be made, partition runs say why instead of failing."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from baton.devkit import netns
from baton.devkit.chaos import chaos_command


def test_not_root_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.shutil, "which", lambda _name: "/usr/sbin/ip")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.unavailable() == "network namespaces need root (CAP_NET_ADMIN)"


def test_missing_iproute2_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.shutil, "which", lambda _name: None)
    assert "iproute2" in (netns.unavailable() or "")


def test_chaos_partitions_need_the_cluster() -> None:
    result = CliRunner().invoke(chaos_command, ["--partitions", "2"])
    assert result.exit_code == 2 and "--partitions needs --cluster" in result.output


def test_member_names_are_checked() -> None:
    with pytest.raises(ValueError):
        netns.Netns(["a", "a"])
    with pytest.raises(ValueError):
        netns.Netns([netns.HOST])
