"""Helpers of the cluster tests: a replica's credit, and what it holds besides."""

from __future__ import annotations

from fairq_server.app import FairqServer
from fairq_server.cluster.credit import Credit
from fairq_server.cluster.launcher import ClusterLauncher


def credit_of(server: FairqServer) -> Credit:
    """The credit of an in-process replica (its cluster launcher's)."""
    launcher = server.core.dispatcher.attempts._launcher
    assert isinstance(launcher, ClusterLauncher)
    return launcher.credit


def requests_held(server: FairqServer) -> int:
    """Members a replica holds in the shared gate for requests (its idle credit left out)."""
    node = server.core.cluster
    assert node is not None
    credit = credit_of(server)
    return sum(len(members) - credit.idle(b) for b, members in node._held.items())
