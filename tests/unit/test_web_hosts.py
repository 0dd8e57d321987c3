"""The Host values the web process accepts, worked out from PUBLIC_BASE_URL."""

from __future__ import annotations

import pytest

from reports.web.guards import accepted_hosts


@pytest.mark.parametrize(
    ("public_base_url", "hosts"),
    [
        ("https://reports.example.com", ["reports.example.com"]),
        ("https://Reports.Example.com:8443/unsubscribe", ["reports.example.com"]),
        ("https://[2001:db8::1]", ["[2001:db8::1]"]),
        # On its own machine a loopback server is reached by any of its names.
        ("http://127.0.0.1:8000", ["127.0.0.1", "localhost", "[::1]"]),
        ("http://[::1]:8000", ["[::1]", "127.0.0.1", "localhost"]),
        ("http://127.0.0.2:8000", ["127.0.0.2", "127.0.0.1", "localhost", "[::1]"]),
    ],
)
def test_only_public_base_urls_host_is_accepted(public_base_url: str, hosts: list[str]) -> None:
    assert accepted_hosts(public_base_url) == hosts
