"""Redis's clock for the Redis broker's heartbeats, so that one worker's wrong clock cannot make every
other worker look dead: the dispatch script reads ``TIME`` instead of the caller's timestamp
(docs/explanation/architecture.md, "Inside a worker"; docs/explanation/guarantees.md, "Clocks").
"""

from __future__ import annotations

from typing import cast

import redis
from redis.commands.core import Script

#: Milliseconds since the epoch on the Redis server's clock, as a Lua expression's statements.
_SERVER_MILLIS = 'local server_time = redis.call("TIME")\n'
_SERVER_MILLIS_VALUE = "server_time[1] * 1000 + math.floor(server_time[2] / 1000)"

#: The line of Dramatiq 2.2.1's ``dispatch.lua`` that takes the caller's timestamp.
_CALLERS_TIMESTAMP = "local timestamp = ARGV[2]\n"

# KEYS: the heartbeats. ARGV: the broker id.
_BEAT = f"""{_SERVER_MILLIS}redis.call("ZADD", KEYS[1], {_SERVER_MILLIS_VALUE}, ARGV[1])
"""

# KEYS: the heartbeats. ARGV: the heartbeat timeout, in ms. The broker ids whose heartbeat is stale.
_DEAD = f"""{_SERVER_MILLIS}return redis.call("ZRANGEBYSCORE", KEYS[1], 0, {_SERVER_MILLIS_VALUE} - tonumber(ARGV[1]))
"""


def on_server_clock(dispatch: str) -> str:
    """Dramatiq's dispatch script, its timestamp read from Redis's clock instead of the caller's."""
    if dispatch.count(_CALLERS_TIMESTAMP) != 1:
        raise RuntimeError("Dramatiq's dispatch script changed: its timestamp line is not where it was.")
    return dispatch.replace(_CALLERS_TIMESTAMP, f"{_SERVER_MILLIS}local timestamp = {_SERVER_MILLIS_VALUE}\n")


def heartbeat(client: redis.Redis) -> Script:
    """A script that stamps a broker id's heartbeat with Redis's clock: ``beat(keys=[heartbeats], args=[id])``."""
    return client.register_script(_BEAT)


def dead_workers(client: redis.Redis, heartbeats: str, *, timeout_ms: int) -> list[bytes]:
    """The broker ids whose heartbeat is older than ``timeout_ms`` on Redis's clock, as the sweep sees them."""
    return cast(list[bytes], client.register_script(_DEAD)(keys=[heartbeats], args=[timeout_ms]))
