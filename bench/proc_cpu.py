"""CPU time of this machine's processes, read from /proc: what a benchmark's parts spent over a run.

A process's ``utime + stime`` counts all its threads; its ``cutime + cstime`` the children it has
reaped. A process tree's time is both over every process in it, so a worker pool's master with
its worker processes (and whatever they started and reaped) is one figure, however many threads
each runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stat:
    name: str
    parent: int
    #: utime + stime, and cutime + cstime (reaped children), in seconds.
    own: float
    reaped: float


def stats() -> dict[int, Stat]:
    """Every process on the machine now, by pid (those that vanish while being read are left out)."""
    found: dict[int, Stat] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            line = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The name, in parentheses, may hold spaces and parentheses: the fields follow the last ")".
        name, rest = line[line.index("(") + 1 : line.rindex(")")], line[line.rindex(")") + 2 :].split()
        found[int(entry)] = Stat(
            name, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICKS, (int(rest[13]) + int(rest[14])) / TICKS
        )
    return found


def tree(root: int, snapshot: Mapping[int, Stat]) -> dict[int, float]:
    """CPU seconds of ``root`` and of every process below it, each with the children it reaped; by pid."""
    children: dict[int, list[int]] = {}
    for pid, stat in snapshot.items():
        children.setdefault(stat.parent, []).append(pid)
    seconds: dict[int, float] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        if pid in snapshot:
            seconds[pid] = snapshot[pid].own + snapshot[pid].reaped
            pending += children.get(pid, [])
    return seconds


def postmaster(snapshot: Mapping[int, Stat], port: int | None = None) -> int | None:
    """The main process of the PostgreSQL server listening on ``port`` on this machine; without
    ``port``, of the first server found (a ``postgres`` whose parent is not one). With another
    server on the machine (a helper's, a test's), only ``port`` tells them apart."""
    if port is not None:
        return listening_on(port)
    return next(
        (
            pid
            for pid, stat in snapshot.items()
            if stat.name == "postgres" and snapshot.get(stat.parent, Stat("", 0, 0, 0)).name != "postgres"
        ),
        None,
    )


def listening_on(port: int) -> int | None:
    """The pid of the process with a listening TCP socket on ``port`` (IPv4), if it runs here."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(entry)
        except OSError:
            continue
    return None


def database_backends(database: str) -> set[int]:
    """The pids of the PostgreSQL backends connected to ``database`` now (``postgres: … USER DATABASE …``)."""
    pids: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            words = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").split()
        except OSError:
            continue
        if words[:1] == [b"postgres:"] and database.encode() in words:
            pids.add(int(entry))
    return pids


#: Reads the CPU seconds of one part of a run, by pid, from a snapshot of :func:`stats`.
Part = Callable[[Mapping[int, Stat]], dict[int, float]]


class Meter:
    """CPU seconds each named part spent between :meth:`start` and :meth:`stop`.

    A process of a part that exited in between is lost (unless a process of the part reaped it);
    one that started in between counts from zero.
    """

    def __init__(self, parts: Mapping[str, Part]) -> None:
        self.parts = dict(parts)
        self._before: dict[str, dict[int, float]] = {}
        #: Part name -> pid -> CPU seconds spent; filled by :meth:`stop`.
        self.spent: dict[str, dict[int, float]] = {}

    def _read(self) -> dict[str, dict[int, float]]:
        snapshot = stats()
        return {name: part(snapshot) for name, part in self.parts.items()}

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> dict[str, dict[int, float]]:
        after = self._read()
        self.spent = {
            name: {pid: s - self._before[name].get(pid, 0.0) for pid, s in pids.items()} for name, pids in after.items()
        }
        return self.spent


def trees(*roots: int) -> Part:
    """A part made of the process trees under ``roots``."""
    return lambda snapshot: {pid: s for root in roots for pid, s in tree(root, snapshot).items()}


def postgres_server(port: int | None = None) -> Part:
    """The whole PostgreSQL server on ``port`` of this machine: every database's work, and its background processes."""

    def read(snapshot: Mapping[int, Stat]) -> dict[int, float]:
        root = postmaster(snapshot, port)
        return {} if root is None else tree(root, snapshot)

    return read


def postgres_database(database: str) -> Part:
    """The backends connected to ``database``: only this run's sessions (one that closed in between is lost)."""

    def read(snapshot: Mapping[int, Stat]) -> dict[int, float]:
        return {pid: snapshot[pid].own for pid in database_backends(database) if pid in snapshot}

    return read
