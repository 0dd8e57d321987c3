"""Redis's clock for the Redis broker's heartbeats, so that one worker's wrong clock cannot make every
other worker look dead.

Dramatiq's dispatch script takes its timestamp from the caller (``current_millis()``): it stamps
the caller's heartbeat with it, and its dead-worker sweep requeues the messages of every worker
whose heartbeat is older than that timestamp minus ``heartbeat_timeout``. A process whose clock
runs ahead by more than the timeout therefore takes back the messages live workers are running, and
copies of them run side by side. Here the script reads Redis's ``TIME`` instead, and so does the
heartbeat thread (:class:`reports.worker.lifecycle.Heartbeat`) and the backlog's count of dead
workers (:meth:`reports.worker.queues.RedisQueue.backlog`): every heartbeat is written and compared on one
clock. The timestamp the caller still passes is left unused; dead letters are stamped (and expired)
on Redis's clock too.

A script may write after ``TIME`` because Redis replicates a script's effects, not the script
(the default from Redis 5, the only way from 7).
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
