"""Time one report's render, v1 against v2, in CPU microseconds.

Usage: python bench/render.py [--renders 10000] [--categories 6]

Renders the same synthetic summary (``--categories`` categories, the seed's six by default)
``--renders`` times per version after one warm-up render that builds the version's templates
(for v2 that is when its CSS is inlined, about 10 ms once per process), and prints the median,
p95 and max of each render's process CPU time, and v2 once more with 40 categories (the most its
category table shows). The per-report CPU target is 3 ms for the whole report; the render is one part of it. The
latest figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import support  # noqa: F401  (bench/support.py: this checkout's code first on sys.path)

from reports.content.activity import CategoryTotal, Summary
from reports.content.render import render
from reports.periods import Period
from reports.settings import DEFAULT_TEMPLATES_DIR


def summary(categories: int) -> Summary:
    totals = tuple(CategoryTotal(f"category {i}", i + 1, 10_000 + 7_919 * i) for i in range(categories))
    return Summary(
        period=Period(2026, 10),
        count=sum(c.count for c in totals),
        total_cents=sum(c.total_cents for c in totals),
        by_category=totals,
        previous_total_cents=150_000,
    )


def measure(version: str, report: Summary, renders: int) -> list[float]:
    render(DEFAULT_TEMPLATES_DIR, version, name="Ada Lovelace", summary=report)
    samples = []
    for _ in range(renders):
        start = time.process_time_ns()
        render(DEFAULT_TEMPLATES_DIR, version, name="Ada Lovelace", summary=report)
        samples.append((time.process_time_ns() - start) / 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=10_000)
    parser.add_argument("--categories", type=int, default=6)
    args = parser.parse_args()
    for version, categories in (("v1", args.categories), ("v2", args.categories), ("v2", 40)):
        samples = sorted(measure(version, summary(categories), args.renders))
        p95 = samples[int(len(samples) * 0.95)]
        print(
            f"{version} with {categories:>2} categories: median {statistics.median(samples):7.1f} µs, "
            f"p95 {p95:7.1f} µs, max {samples[-1]:8.1f} µs over {len(samples):,} renders"
        )


if __name__ == "__main__":
    main()
