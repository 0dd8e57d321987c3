"""A circuit breaker for the mail provider, shared by every worker on every machine through Redis.

closed ──(N provider failures within the window)──► open ──(cool-down ends)──► half-open
  ▲                                                   ▲                            │
  └──────────────── the probe succeeds ───────────────┴──── the probe fails ───────┘

While open, no send touches the provider. In half-open exactly one caller, the probe, is let
through; the others wait as if open. Transitions happen in Lua scripts, so concurrent workers
agree on the state. Times are milliseconds passed in by the caller.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

logger = logging.getLogger(__name__)


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


#: Numeric form for metrics: closed 0, half-open 1, open 2.
STATE_VALUES = {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}


def mail_breaker_name(namespace: str) -> str:
    """The Redis name of the mail provider's breaker, shared by every process of a deployment."""
    return f"{namespace}:breaker:mail"


def state_of(client: redis.Redis, name: str) -> State:
    """The breaker's state as Redis holds it (an open breaker past its cool-down still reads open)."""
    raw = cast(bytes | None, client.hget(f"{name}:state", "state"))
    return State(raw.decode()) if raw else State.CLOSED

# KEYS: state hash. ARGV: now, probe lease. Returns {allowed (0/1), wait ms, state, changed (0/1)}.
_ALLOW = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local now = tonumber(ARGV[1])
if state == 'closed' then return {1, 0, state, 0} end
local until_ms = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if now < until_ms then return {0, until_ms - now, state, 0} end
redis.call('HSET', KEYS[1], 'state', 'half_open', 'until', now + tonumber(ARGV[2]))
return {1, 0, 'half_open', state == 'open' and 1 or 0}
"""

# KEYS: state hash, failure zset. ARGV: now, window, threshold, cool-down, member.
# Returns {state after, changed (0/1)}.
_FAILURE = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local now = tonumber(ARGV[1])
-- A late failure from a send let through before the breaker opened: the cool-down stands.
if state == 'open' then return {state, 0} end
if state == 'closed' then
  redis.call('ZADD', KEYS[2], now, ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
  if redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[3]) then return {state, 0} end
end
redis.call('HSET', KEYS[1], 'state', 'open', 'until', now + tonumber(ARGV[4]))
redis.call('DEL', KEYS[2])
return {'open', 1}
"""

# KEYS: state hash, failure zset. Returns the state before.
_SUCCESS = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state ~= 'closed' then redis.call('DEL', KEYS[1], KEYS[2]) end
return state
"""


@dataclass(frozen=True)
class Permit:
    allowed: bool
    #: When not allowed: how long until the breaker may let a call through, in milliseconds.
    wait_ms: int
    #: True when this caller is the half-open probe.
    probe: bool


class CircuitBreaker:
    def __init__(
        self,
        client: redis.Redis,
        *,
        name: str,
        failure_threshold: int,
        window_ms: int,
        cooldown_ms: int,
        probe_timeout_ms: int,
        on_change: Callable[[State, State], None] | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.failure_threshold = failure_threshold
        self.window_ms = window_ms
        self.cooldown_ms = cooldown_ms
        self.probe_timeout_ms = probe_timeout_ms
        self._on_change = on_change
        self._state_key = f"{name}:state"
        self._failures_key = f"{name}:failures"
        self._allow = client.register_script(_ALLOW)
        self._failure = client.register_script(_FAILURE)
        self._success = client.register_script(_SUCCESS)

    def state(self) -> State:
        return state_of(self.client, self.name)

    def allow(self, now_ms: int) -> Permit:
        allowed, wait_ms, state, changed = self._allow(keys=[self._state_key], args=[now_ms, self.probe_timeout_ms])
        if changed:
            self._log(State.OPEN, State.HALF_OPEN)
        return Permit(allowed=bool(allowed), wait_ms=int(wait_ms), probe=bool(allowed) and state == b"half_open")

    def record_failure(self, now_ms: int, *, token: str) -> State:
        """Count a provider failure; returns the state after (``OPEN`` means: do not retry now)."""
        before = self.state()
        state, changed = self._failure(
            keys=[self._state_key, self._failures_key],
            args=[now_ms, self.window_ms, self.failure_threshold, self.cooldown_ms, token],
        )
        after = State(state.decode())
        if changed:
            self._log(before, after)
        return after

    def record_success(self) -> None:
        before = State(self._success(keys=[self._state_key, self._failures_key]).decode())
        if before is not State.CLOSED:
            self._log(before, State.CLOSED)

    def _log(self, before: State, after: State) -> None:
        logger.warning("Circuit breaker %s: %s -> %s.", self.name, before, after,
                       extra={"breaker": self.name, "from_state": str(before), "to_state": str(after)})
        if self._on_change is not None:
            self._on_change(before, after)
