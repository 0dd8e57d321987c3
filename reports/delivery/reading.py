"""What one process last read of a fleet-wide state in Redis, trusted for a short while.

The breaker and the send rate each keep one, so that a send asks Redis a few times a second rather
than every time. Threads' answers can arrive out of order: the one whose call was sent last saw the
latest state, so an answer never replaces one asked later, and a reading is never trusted past its
call's time plus the trust (docs/explanation/failures.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _Read(Generic[T]):
    value: T
    asked_at: float


class LastReading(Generic[T]):
    """The latest answer read, trusted for ``trust_ms`` after its call was sent (0: never).

    :param clock: seconds from an arbitrary start (``time.monotonic``).
    """

    def __init__(self, trust_ms: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.trust_s = trust_ms / 1000
        self.clock = clock
        self._read: _Read[T] | None = None
        self._lock = threading.Lock()

    def fresh(self) -> T | None:
        """The answer while it is trusted, else ``None``."""
        read = self._read
        if read is None or self.clock() - read.asked_at >= self.trust_s:
            return None
        return read.value

    def remember(self, value: T, asked_at: float) -> None:
        """Keep ``value``, read by a call sent at ``asked_at`` (``clock`` seconds), unless an answer
        to a call sent later is kept already."""
        with self._lock:
            if self._read is None or asked_at >= self._read.asked_at:
                self._read = _Read(value, asked_at)
