"""Retry delays: capped exponential backoff with full jitter. Pure; the randomness is passed in."""

from __future__ import annotations

import random


def full_jitter_ms(retry: int, *, base_ms: int, cap_ms: int, rng: random.Random) -> int:
    """Delay before retry number ``retry`` (0 for the first), uniform in ``[0, min(cap, base·2^retry)]``.

    Full jitter rather than Dramatiq's factor-of-two: messages that failed at the same instant
    (a provider outage) come back spread over the whole window instead of in a cluster.
    """
    ceiling = min(cap_ms, base_ms * 2 ** min(retry, 62))
    return int(rng.uniform(0, ceiling))
