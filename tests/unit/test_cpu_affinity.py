"""WORKER_CPU_AFFINITY: which worker process keeps to which CPU, and the values the setting takes."""

from __future__ import annotations

import pytest

from reports.errors import ConfigurationError
from reports.settings import Settings
from reports.worker.cpu_affinity import cpu_for, process_number


@pytest.mark.parametrize(
    ("name", "number"),
    [("Process-1", 1), ("Process-2", 2), ("Process-12", 12), ("Process-1:3", 3), ("Process-2:1:7", 7)],
)
def test_a_worker_process_is_numbered_by_the_name_multiprocessing_gave_it(name: str, number: int) -> None:
    assert process_number(name) == number


@pytest.mark.parametrize("name", ["MainProcess", "Process-", "Process-x", "Process-1:", "bulk-1", "SpawnProcess"])
def test_a_process_with_a_name_of_its_own_has_no_number(name: str) -> None:
    assert process_number(name) is None


def test_worker_processes_take_the_allowed_cpus_in_turn() -> None:
    allowed = {5, 2, 9}
    assert [cpu_for(number, allowed) for number in range(1, 8)] == [2, 5, 9, 2, 5, 9, 2]


def test_every_worker_process_keeps_to_the_one_cpu_a_process_may_use() -> None:
    assert [cpu_for(number, {3}) for number in (1, 2, 3)] == [3, 3, 3]


def test_the_kernel_places_the_workers_unless_told_otherwise() -> None:
    assert Settings.from_env({}).worker_cpu_affinity == "none"
    assert Settings.from_env({"WORKER_CPU_AFFINITY": "auto"}).worker_cpu_affinity == "auto"


@pytest.mark.parametrize("value", ["Auto", "1", "0-1", "yes", " auto"])
def test_an_affinity_the_workers_cannot_keep_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"WORKER_CPU_AFFINITY": value})
    assert str(refused.value) == f"WORKER_CPU_AFFINITY must be one of none, auto, got {value!r}."
