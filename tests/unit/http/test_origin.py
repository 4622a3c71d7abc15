"""Host names against ``console.allowed_hosts``: ports, brackets, case, a trailing dot."""

from __future__ import annotations

import pytest

from fairq_server.config.console import LOOPBACK_HOSTS, split_host
from fairq_server.doors.http.origin import host_allowed


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost", True),
        ("localhost:8080", True),
        ("LocalHost.:8080", True),
        ("127.0.0.1:1", True),
        ("[::1]:8080", True),
        ("[::1]", True),
        ("localhost.evil.example:8080", False),
        ("127.0.0.2:8080", False),
        ("[::2]:8080", False),
        ("", False),
        ("localhost:", False),
        ("localhost:http", False),
        ("[::1", False),
        ("[::1]x", False),
    ],
)
def test_the_loopback_names_on_any_port(host: str, allowed: bool) -> None:
    assert host_allowed(host, LOOPBACK_HOSTS) is allowed


def test_an_entry_with_a_port_allows_that_port_only() -> None:
    entries = ("console.example:443", "[fd00::1]:8443")
    assert host_allowed("console.example:443", entries)
    assert not host_allowed("console.example:8080", entries)
    assert not host_allowed("console.example", entries)
    assert host_allowed("[FD00::1]:8443", entries)


def test_split_host() -> None:
    assert split_host("::1") == ("::1", None)  # a configured entry may omit the brackets
    assert split_host("[::1]:80") == ("::1", 80)
    assert split_host("Example.COM.:65535") == ("example.com", 65535)
    assert split_host("x:65536") is None
