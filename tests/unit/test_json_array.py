"""The listings' JSON, printed a thousand rows at a time: the same bytes as one ``json.dumps``."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from reports.cli.app import echo_json_array


@pytest.mark.parametrize("count", [0, 1, 999, 1000, 2501])
def test_a_json_array_printed_in_pieces_is_what_json_dumps_prints(count: int) -> None:
    rows = [{"id": n, "reason": "550 \u00e9", "replayed_at": None} for n in range(count)]

    @click.command()
    def listing() -> None:
        assert echo_json_array(iter(rows)) == count

    result = CliRunner().invoke(listing)
    assert result.exit_code == 0, result.output
    assert result.output == json.dumps(rows) + "\n"
