"""Login throttling, fleet-wide in the shared Redis: failed logins are counted per user name and per
client address over a window, and past a limit a login is refused before its password is checked.

Each login counts as failed from the moment it arrives, and is taken back from the counts if its
password was right: checked then counted, logins sent at once would all pass the check before
the first of them failed."""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

import redis
from redis.commands.core import Script

#: Failed logins of one user name within the window after which its logins are refused.
MAX_FAILURES_PER_USER = 5
#: Failed logins from one address within the window after which its logins are refused: higher,
#: since several operators may share an office's address.
MAX_FAILURES_PER_ADDRESS = 20
#: How long a failure counts, in seconds, from the first failure of the count.
WINDOW_SECONDS = 900
#: An IPv6 client is counted by its network of this size: one subscriber or host is handed a whole
#: /64, and could otherwise try as many passwords as it has addresses.
IPV6_PREFIX = 64


def counted_address(address: str) -> str:
    """What the address limit counts ``address`` as: an IPv4 address itself (mapped into IPv6 too),
    an IPv6 address by its /64, anything else as it is."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, IPV6_PREFIX), strict=False))
    return str(parsed)


@dataclass(frozen=True)
class LoginThrottle:
    client: redis.Redis
    namespace: str

    def attempt(self, name: str, address: str) -> bool:
        """Count a login for ``name`` from ``address`` as failed; ``True`` when it is refused now,
        its password unchecked."""
        with self.client.pipeline(transaction=False) as pipe:
            for key in (self._key("user", name), self._key("address", counted_address(address))):
                pipe.incr(key)
                # NX: the window runs from the first failure; later ones do not extend it.
                pipe.expire(key, WINDOW_SECONDS, nx=True)
            user, _, client, _ = pipe.execute()
        return int(user) > MAX_FAILURES_PER_USER or int(client) > MAX_FAILURES_PER_ADDRESS

    def succeeded(self, name: str, address: str) -> None:
        """Forget the user's failures, and take this login back from the address's count; the
        address's failures stay, so one good password cannot reset a spray."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(self._key("user", name))
            self._take_back(keys=[self._key("address", counted_address(address))], client=pipe)
            pipe.execute()

    @functools.cached_property
    def _take_back(self) -> Script:
        # Only from a count still there: one that expired meanwhile would come back as -1, for ever.
        return self.client.register_script(
            "if redis.call('exists', KEYS[1]) == 1 then return redis.call('decr', KEYS[1]) end return 0"
        )

    def _key(self, kind: str, value: str) -> str:
        return f"{self.namespace}:console:login_failures:{kind}:{value}"
