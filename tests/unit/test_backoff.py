"""Retry delays: capped exponential backoff with full jitter, against Dramatiq's narrow jitter."""

from __future__ import annotations

import random
from collections.abc import Sequence

import dramatiq.common
import pytest

from reports.worker.backoff import full_jitter_ms

BASE_MS = 1_000
CAP_MS = 60_000
#: The issue's storm: 500 messages that failed at the same instant, all on their fourth attempt.
STORM = 500
RETRY = 3
WINDOW_MS = min(CAP_MS, BASE_MS * 2**RETRY)
BUCKETS = 10


def buckets(delays: Sequence[int], *, window_ms: int, count: int = BUCKETS) -> list[int]:
    """How many delays fall in each of ``count`` equal slices of ``[0, window_ms]`` (the top edge in the last)."""
    counts = [0] * count
    for delay in delays:
        assert 0 <= delay <= window_ms, f"{delay} ms is outside [0, {window_ms}]"
        counts[min(delay * count // window_ms, count - 1)] += 1
    return counts


def storm(seed: int, *, retry: int = RETRY, size: int = STORM) -> list[int]:
    rng = random.Random(seed)
    return [full_jitter_ms(retry, base_ms=BASE_MS, cap_ms=CAP_MS, rng=rng) for _ in range(size)]


@pytest.mark.parametrize(
    ("retry", "ceiling_ms"),
    [(0, 1_000), (1, 2_000), (2, 4_000), (3, 8_000), (5, 32_000), (6, 60_000), (7, 60_000), (20, 60_000)],
)
def test_a_delay_is_an_integer_between_zero_and_the_capped_exponential_ceiling(retry: int, ceiling_ms: int) -> None:
    rng = random.Random(retry)
    delays = [full_jitter_ms(retry, base_ms=BASE_MS, cap_ms=CAP_MS, rng=rng) for _ in range(2_000)]

    assert all(isinstance(delay, int) for delay in delays)
    assert min(delays) >= 0
    assert max(delays) <= ceiling_ms
    # Full jitter: the whole range is used, from almost nothing to almost the ceiling.
    assert min(delays) < ceiling_ms * 0.01
    assert max(delays) > ceiling_ms * 0.99


@pytest.mark.parametrize("retry", [62, 63, 100, 1_000, 10**6])
def test_the_cap_holds_for_huge_retry_numbers(retry: int) -> None:
    rng = random.Random(retry)
    delays = [full_jitter_ms(retry, base_ms=BASE_MS, cap_ms=CAP_MS, rng=rng) for _ in range(1_000)]

    assert all(0 <= delay <= CAP_MS for delay in delays)
    assert max(delays) > CAP_MS * 0.95


def test_the_same_seed_gives_the_same_delays() -> None:
    assert storm(42) == storm(42)
    assert storm(42) != storm(43)


@pytest.mark.parametrize("seed", [1, 2, 3, 2026, 31337])
def test_five_hundred_messages_failing_at_once_retry_spread_over_the_whole_window(seed: int) -> None:
    delays = storm(seed)

    counts = buckets(delays, window_ms=WINDOW_MS)
    # Uniform over the window: every tenth of it gets about a tenth of the storm (5% to 15%).
    assert all(STORM * 0.05 <= n <= STORM * 0.15 for n in counts), counts
    assert max(delays) - min(delays) > 0.9 * WINDOW_MS


def test_dramatiqs_own_backoff_leaves_the_lower_half_of_the_window_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrast the issue asks for: Dramatiq's factor-of-two jitter keeps a storm clustered."""
    rng = random.Random(7)
    monkeypatch.setattr(dramatiq.common, "uniform", rng.uniform)
    dramatiq_delays = [
        dramatiq.common.compute_backoff(RETRY, factor=BASE_MS, max_backoff=CAP_MS)[1] for _ in range(STORM)
    ]
    ours = storm(7)

    # Dramatiq: every delay in [base·2^r, base·2^(r+1)]; nothing comes back before base·2^r.
    assert min(dramatiq_delays) >= BASE_MS * 2**RETRY
    assert max(dramatiq_delays) <= BASE_MS * 2 ** (RETRY + 1)
    # On the same scale, [0, base·2^(r+1)], Dramatiq fills only the upper five tenths...
    wide = BASE_MS * 2 ** (RETRY + 1)
    dramatiq_counts = buckets(dramatiq_delays, window_ms=wide)
    assert dramatiq_counts[: BUCKETS // 2] == [0] * (BUCKETS // 2), dramatiq_counts
    # ...while full jitter brings the whole storm back within base·2^r, half of it within the first half.
    assert max(ours) <= BASE_MS * 2**RETRY
    assert sum(1 for delay in ours if delay < BASE_MS * 2**RETRY / 2) > STORM * 0.4
    # Relative to its own lowest delay, Dramatiq's storm spans at most a factor of two.
    assert max(dramatiq_delays) <= 2 * min(dramatiq_delays) + 1
