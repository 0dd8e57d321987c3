"""Login throttling, fleet-wide in the shared Redis: failed logins are counted per user name and per
client address over a window, and past a limit a login is refused before its password is checked."""

from __future__ import annotations

from dataclasses import dataclass

import redis

#: Failed logins of one user name within the window after which its logins are refused.
MAX_FAILURES_PER_USER = 5
#: Failed logins from one address within the window after which its logins are refused: higher,
#: since several operators may share an office's address.
MAX_FAILURES_PER_ADDRESS = 20
#: How long a failure counts, in seconds, from the first failure of the count.
WINDOW_SECONDS = 900


@dataclass(frozen=True)
class LoginThrottle:
    client: redis.Redis
    namespace: str

    def refused(self, name: str, address: str) -> bool:
        """Whether a login for ``name`` from ``address`` is refused now, its password unchecked."""
        user, client = self.client.mget(self._key("user", name), self._key("address", address))
        return int(user or 0) >= MAX_FAILURES_PER_USER or int(client or 0) >= MAX_FAILURES_PER_ADDRESS

    def failed(self, name: str, address: str) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            for key in (self._key("user", name), self._key("address", address)):
                pipe.incr(key)
                # NX: the window runs from the first failure; later ones do not extend it.
                pipe.expire(key, WINDOW_SECONDS, nx=True)
            pipe.execute()

    def succeeded(self, name: str) -> None:
        """Forget the user's failures; the address's stay, so one good password cannot reset a spray."""
        self.client.delete(self._key("user", name))

    def _key(self, kind: str, value: str) -> str:
        return f"{self.namespace}:console:login_failures:{kind}:{value}"
