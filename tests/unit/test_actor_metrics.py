"""Which histogram bucket a processing time falls in, and how an outcome is named."""

from __future__ import annotations

import pytest

from reports.worker.actor_metrics import bucket_label


@pytest.mark.parametrize(
    ("seconds", "label"),
    [
        (0.0, "0.005"),
        (0.005, "0.005"),
        (0.0051, "0.01"),
        (0.3, "0.5"),
        (1.0, "1.0"),
        (59.0, "60.0"),
        (60.5, "+Inf"),
        (3600.0, "+Inf"),
    ],
)
def test_a_duration_falls_in_the_first_bucket_whose_bound_is_not_below_it(seconds: float, label: str) -> None:
    assert bucket_label(seconds) == label
