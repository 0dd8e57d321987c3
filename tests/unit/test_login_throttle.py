"""What the console's login limit counts a client's address as."""

from __future__ import annotations

import pytest

from reports.console.throttle import counted_address


@pytest.mark.parametrize(
    ("address", "counted"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),
        ("2001:DB8:1:2::1", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("unknown", "unknown"),
    ],
)
def test_an_ipv4_address_counts_alone_and_an_ipv6_one_by_its_64(address: str, counted: str) -> None:
    assert counted_address(address) == counted
