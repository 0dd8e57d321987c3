"""Run the commands whose output the docs show, and write each output to docs/samples/NAME.txt.

Run it through ``scripts/docs-samples`` after changing what a command prints; commit what changed.
``--check`` writes nothing and exits 1 if any sample would change (within one month: the demo
mails last month, and its seeded activity depends on the month's length).

Everything runs in a temporary folder, as a newcomer runs it: the demo on SQLite with its embedded
Redis (``reports demo``, then ``reports demo --serve``), and from a second shell with the variables
the demo prints, ``send-now``, ``trigger``, ``progress``, the dead letters (a send to a broken
address, then its replay), ``preview``, ``prune --dry-run``, ``reconcile``, ``suppress`` and the web
process's unsubscribe link. What changes from run to run is masked: the folder becomes
``/home/you/reports``, ids and times get stable stand-ins, the demo's rate becomes ``…/s``.
"""

from __future__ import annotations

import argparse
import difflib
import email
import email.policy
import email.utils
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "docs" / "samples"
REPORTS = REPO / ".venv" / "bin" / "reports"
SHOWN_HOME = "/home/you/reports"

#: Users the samples' demo seeds: few enough to run in seconds, enough for every state.
USERS = 300


class Masks:
    """What differs between two runs, replaced by stand-ins that stay the same from run to run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ids: dict[str, str] = {}
        self.times: dict[str, str] = {}
        self.month = datetime.now(UTC).strftime("%Y-%m")

    def __call__(self, text: str) -> str:
        for path in (str(self.folder), str(REPO)):
            text = text.replace(path, SHOWN_HOME)
        text = re.sub(r"/tmp/tmp[A-Za-z0-9_]+/redis\.socket", "/tmp/tmpq8x2k1zv/redis.socket", text)
        text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", self._id, text)
        text = re.sub(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?", self._time, text)
        # The demo's live rate and elapsed time: the machine's, not the docs'.
        text = re.sub(r"\s+\d+(\.\d+)?/s\s+(dead \d+) \d+:\d\d:\d\d", r"     …/s \2 0:00:01", text)
        return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"

    def _id(self, match: re.Match[str]) -> str:
        return self.ids.setdefault(match.group(0), str(uuid.uuid5(uuid.NAMESPACE_URL, f"sample-{len(self.ids)}")))

    def _time(self, match: re.Match[str]) -> str:
        # The nth distinct moment becomes 06:00:0n on the 1st: the day the scheduler runs.
        fraction = re.sub(r"\d", "0", match.group(1) or "")
        return self.times.setdefault(
            match.group(0), f"{self.month}-01{match.group(0)[10]}06:00:{len(self.times):02d}{fraction}"
        )


README = REPO / "README.md"
#: A README block kept equal to a sample: ``<!-- sample: NAME -->``, a fenced block, ``<!-- /sample -->``,
#: all indented alike.
README_BLOCK = re.compile(r"^( *)<!-- sample: ([a-z-]+) -->\n.*?^\1<!-- /sample -->$", re.DOTALL | re.MULTILINE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if a sample would change.")
    check = parser.parse_args().check
    with tempfile.TemporaryDirectory(prefix="docs-samples-") as folder:
        made = {**dict(samples(Path(folder).resolve())), "procfile": _procfile()}
    files = {SAMPLES / f"{name}.txt": text for name, text in made.items()}
    files[README] = README_BLOCK.sub(lambda m: _block(m[1], m[2], made[m[2]]), README.read_text())
    changed = [path for path, text in files.items() if _read(path) != text]
    if check:
        for path in changed:
            name = str(path.relative_to(REPO))
            sys.stdout.writelines(
                difflib.unified_diff(_read(path).splitlines(True), files[path].splitlines(True), name, "now")
            )
        return 1 if changed else 0
    SAMPLES.mkdir(exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    for stale in set(SAMPLES.glob("*.txt")) - set(files):
        stale.unlink()
    shown = ", ".join(str(path.relative_to(REPO)) for path in changed) or "none"
    print(f"{len(made)} samples in docs/samples; changed: {shown}.")
    return 0


def _block(indent: str, name: str, text: str) -> str:
    """The README block of sample ``name``, indented as its markers are (inside a list item)."""
    lines = [f"<!-- sample: {name} -->", "```text", *text.splitlines(), "```", "<!-- /sample -->"]
    return "\n".join(f"{indent}{line}" if line else line for line in lines)


def _procfile() -> str:
    """The Procfile's long-running processes, for the README's "start the processes" step."""
    lines = (REPO / "Procfile").read_text().splitlines()
    return "".join(f"{line}\n" for line in lines if line.strip() and not line.startswith("release:"))


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def samples(folder: Path) -> Iterator[tuple[str, str]]:
    mask = Masks(folder)
    env = _clean_environment()
    period = _last_month()

    def run(*args: str, extra: dict[str, str] | None = None, shown: bool = True) -> str:
        """``reports ARGS``'s output, after the command line as a shell shows it when ``shown``."""
        result = subprocess.run(
            [str(REPORTS), *args], cwd=folder, env={**env, **(extra or {})}, capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            raise SystemExit(f"reports {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        command = f"$ reports {shlex.join(args)}\n" if shown else ""
        return mask(command + result.stdout + result.stderr)

    yield "help", run("-h", shown=False)
    yield "demo", run("demo", "--users", str(USERS), shown=False)
    yield "progress", run("progress", period) + run("progress", period, "--json")
    yield "periods", run("periods")
    with _serving(folder, env) as (printed, second):
        yield "serve", mask("".join(printed))
        example = _example_user(printed)
        yield "email", mask(_monthly_email(folder, example))
        yield "send-now", run("send-now", str(example), period, extra=second)
        yield "trigger-again", run("trigger", period, extra=second)
        broken = _active_user_after(folder, example)
        yield (
            "dlq-break",
            mask(_set_email(folder, broken, "not an address")) + run("send-now", str(broken), period, extra=second),
        )
        _wait_for_dead_letter(folder)
        yield "dlq-list", run("dlq", "list", extra=second)
        yield "dlq-show", run("dlq", "show", "1", extra=second)
        yield (
            "dlq-replay",
            (
                mask(_set_email(folder, broken, f"user{broken}@example.test"))
                + run("dlq", "replay", "--all", "--dry-run", extra=second)
                + run("dlq", "replay", "--id", "1", extra=second)
            ),
        )
        link = next(line.rsplit(" ", 1)[1] for line in printed if "unsubscribe link:" in line)
        yield "unsubscribe", _unsubscribe(link.strip(), mask)
        # The list shows both entries' times to the second: in the same second they would be masked
        # alike, in the next one apart, so the sample would change from run to run.
        time.sleep(1)
        yield (
            "suppress",
            run("suppress", "add", "7", "--reason", "complained", extra=second) + run("suppress", "list", extra=second),
        )
        yield "reconcile", run("reconcile", period, extra=second)
        yield "preview", run("preview", period, "--sample", "2", "--out", "preview", extra=second)
        yield "prune-dry-run", run("prune", "--older-than-months", "1", "--dry-run", extra=second)
        stopped_at = len(printed)
    yield "serve-stop", mask("".join(printed[stopped_at:]))


def _clean_environment() -> dict[str, str]:
    """This environment without any of the settings' variables: the demo's defaults, as on a new machine."""
    sys.path.insert(0, str(REPO))
    from reports.settings import ENVIRONMENT

    env = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT.values()}
    return {**env, "COLUMNS": "80", "PYTHONUNBUFFERED": "1", "TERM": "dumb"}


def _last_month() -> str:
    from reports.periods import previous_month

    return str(previous_month(datetime.now(UTC).replace(tzinfo=None)))


@contextmanager
def _serving(folder: Path, env: dict[str, str]) -> Iterator[tuple[list[str], dict[str, str]]]:
    """``reports demo --serve`` running; yields what it printed so far and the second shell's variables.

    Stopped with Ctrl-C's signal on the way out; what it prints then is added to ``printed``.
    """
    demo = subprocess.Popen(
        [str(REPORTS), "demo", "--serve"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    printed: list[str] = []
    try:
        while not printed or not printed[-1].strip().endswith("dlq list"):
            line = demo.stdout.readline()
            if not line:
                raise SystemExit("reports demo --serve stopped early:\n" + "".join(printed))
            printed.append(line)
        second = dict(
            line.strip().removeprefix("export ").split("=", 1) for line in printed if line.strip().startswith("export ")
        )
        yield printed, {**env, **second}
    finally:
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=120)
        printed.append(rest)


def _example_user(printed: list[str]) -> int:
    return int(next(line.split()[2] for line in printed if line.split()[1:2] == ["send-now"]))


def _monthly_email(folder: Path, user_id: int) -> str:
    """The headers and the text part of ``user_id``'s monthly email, as the outbox holds it."""
    for path in sorted((folder / "var" / "outbox" / "new").iterdir()):
        message = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        monthly = re.fullmatch(rf"<report\.\d{{4}}-\d\d\.{user_id}@[^>]+>", message["Message-ID"].strip())
        if monthly:
            headers = path.read_bytes().decode().split("\r\n\r\n", 1)[0].replace("\r\n", "\n")
            # The boundary is drawn at random for every message.
            headers = re.sub(r'boundary="[^"]+"', 'boundary="=_5b0c1e2a9d3f4e6a8b7c0d1e"', headers)
            first = datetime.now(UTC).replace(day=1, hour=6, minute=0, second=3, microsecond=0)
            headers = re.sub(r"Date: .*", f"Date: {email.utils.format_datetime(first)}", headers)
            text = message.get_body(("plain",))
            assert text is not None
            return f"{headers}\n\n{text.get_content()}"
    raise SystemExit(f"No monthly email for user {user_id} in the outbox.")


def _active_user_after(folder: Path, user_id: int) -> int:
    with sqlite3.connect(folder / "var" / "reports.db") as connection:
        [found] = connection.execute("SELECT min(id) FROM users WHERE active AND id > ?", (user_id,)).fetchone()
    return int(found)


def _set_email(folder: Path, user_id: int, address: str) -> str:
    """Change a user's address, and say how a shell does the same: a line for the sample."""
    statement = f"UPDATE users SET email = '{address}' WHERE id = {user_id}"
    with sqlite3.connect(folder / "var" / "reports.db") as connection:
        connection.execute(statement)
    script = f"import sqlite3; c = sqlite3.connect('var/reports.db'); c.execute(\\\"{statement}\\\"); c.commit()"
    return f'$ python3 -c "{script}"\n'


def _wait_for_dead_letter(folder: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sqlite3.connect(folder / "var" / "reports.db") as connection:
            if connection.execute("SELECT count(*) FROM dead_letters").fetchone()[0]:
                return
        time.sleep(0.2)
    raise SystemExit("The send-now to a broken address did not become a dead letter within 30 s.")


def _unsubscribe(link: str, mask: Masks) -> str:
    """What a mailbox provider's one-click POST gets back, after the curl command that sends the same."""
    request = urllib.request.Request(link, data=b"List-Unsubscribe=One-Click", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        # The date changes; Connection answers this client's own header.
        kept = [(k, v) for k, v in response.headers.items() if k.lower() not in ("date", "connection")]
        headers = "".join(f"{k}: {v}\n" for k, v in kept)
        answer = f"HTTP/1.1 {response.status} {response.reason}\n{headers}\n{response.read().decode()}\n"
    return mask(f"$ curl -i -X POST -d List-Unsubscribe=One-Click {link}\n{answer}")


if __name__ == "__main__":
    sys.exit(main())
