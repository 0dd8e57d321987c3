"""The Redis broker's heartbeats read Redis's clock: Dramatiq's dispatch script, rewritten."""

from __future__ import annotations

import pytest
from dramatiq.brokers.redis import _scripts

from reports.worker import redis_clock


def test_the_dispatch_script_takes_its_timestamp_from_redis_not_from_the_caller():
    original = _scripts["dispatch"].decode()

    rewritten = redis_clock.on_server_clock(original)

    assert "ARGV[2]" not in rewritten
    assert 'local server_time = redis.call("TIME")' in rewritten.splitlines()
    # Everything else is Dramatiq's, unchanged: the heartbeat, the sweep, the commands.
    ours = [line for line in rewritten.splitlines() if "server_time" not in line]
    assert ours == [line for line in original.splitlines() if line != "local timestamp = ARGV[2]"]


def test_a_dispatch_script_that_no_longer_reads_the_callers_timestamp_where_it_did_is_refused():
    with pytest.raises(RuntimeError, match="dispatch script changed"):
        redis_clock.on_server_clock("local stamp = ARGV[2]\n")
