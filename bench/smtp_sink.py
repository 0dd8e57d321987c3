"""A local SMTP sink in a process of its own, so receiving mail never shares a GIL with a benchmark.

Usage (the benchmarks start it through ``SmtpSink``)::

    .venv/bin/python bench/smtp_sink.py --port PORT [--reply-delay-ms 0] [--no-pipelining]

A minimal SMTP server on 127.0.0.1 (asyncio, see :class:`SinkProtocol`) that accepts every message and counts them per ``Message-ID`` and
per ``X-Report-User-Id``, and counts the connections it accepted (to show whether senders reuse
them). With --reply-delay-ms each write of replies goes out that much later, as from a provider
that far away; --no-pipelining leaves PIPELINING out of its EHLO reply. It prints ``ready PORT``
once it listens, then answers one line per command on stdin:
``stats`` (one JSON object), ``users`` (JSON: user id -> emails), ``reset`` (``ok``). It stops at
the end of its stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Self, cast

#: The Message-ID and user id headers, found in the message's header block by one search each.
_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(.*?)\r?$", re.IGNORECASE | re.MULTILINE)
_USER_ID = re.compile(rb"^X-Report-User-Id:[ \t]*(.*?)\r?$", re.IGNORECASE | re.MULTILINE)

_EHLO = b"250-sink.bench.test\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SIZE 10485760\r\n"
_EHLO_WITHOUT_PIPELINING = _EHLO.replace(b"250-PIPELINING\r\n", b"")


class Recorder:
    """Counts, guarded by a lock: the SMTP loop writes them, the command loop reads them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.connections = 0
            self.messages = 0
            self.by_message_id: Counter[str] = Counter()
            self.by_user: Counter[str] = Counter()

    def received(self, content: bytes) -> None:
        headers = content.split(b"\r\n\r\n", 1)[0]
        message_id, user = _MESSAGE_ID.search(headers), _USER_ID.search(headers)
        with self.lock:
            self.messages += 1
            self.by_message_id[message_id.group(1).decode().strip() if message_id else ""] += 1
            self.by_user[user.group(1).decode().strip() if user else ""] += 1

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {
                "messages": self.messages,
                "connections": self.connections,
                "message_ids": len(self.by_message_id),
                "repeated_message_ids": sum(1 for n in self.by_message_id.values() if n > 1),
                "users": len(self.by_user),
            }


class SinkProtocol(asyncio.Protocol):
    """Just enough SMTP for smtplib (EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT), with PIPELINING,
    every message accepted.

    Written on asyncio's protocol callbacks rather than aiosmtpd: the sink's CPU is the benchmark's
    CPU on a two-core machine, and aiosmtpd's per-message cost (about 2.5 ms, sampled) was larger
    than PostgreSQL's. A provider's own work is not the system's to pay for.
    """

    def __init__(self, recorder: Recorder, *, reply_delay_seconds: float = 0.0, pipelining: bool = True) -> None:
        self.recorder = recorder
        self.reply_delay_seconds = reply_delay_seconds
        self.ehlo = _EHLO if pipelining else _EHLO_WITHOUT_PIPELINING
        self.buffer = bytearray()
        self.in_data = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        with self.recorder.lock:
            self.recorder.connections += 1
        self.transport.write(b"220 sink.bench.test ESMTP\r\n")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        # The replies to what arrived together go out together, as Postfix answers a pipelined
        # envelope: one write once the input is drained, not one per command.
        replies = b"".join(self._answer_buffered())
        if self.reply_delay_seconds and replies:
            asyncio.get_running_loop().call_later(self.reply_delay_seconds, self._write, replies)
        elif replies:
            self._write(replies)

    def _write(self, replies: bytes) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(replies)
        if replies.endswith(b"221 Bye\r\n"):
            self.transport.close()

    def _answer_buffered(self) -> Iterator[bytes]:
        """The replies to each whole command and message in the buffer, in order."""
        while True:
            if self.in_data:
                end = self.buffer.find(b"\r\n.\r\n")
                if end < 0:
                    return
                self.recorder.received(bytes(self.buffer[:end]))
                del self.buffer[: end + 5]
                self.in_data = False
                yield b"250 Message accepted for delivery\r\n"
                continue
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return
            verb = bytes(self.buffer[:4]).upper()
            del self.buffer[: end + 2]
            yield self.reply(verb)
            if verb == b"QUIT":
                return

    def reply(self, verb: bytes) -> bytes:
        if verb == b"EHLO":
            return self.ehlo
        if verb == b"DATA":
            self.in_data = True
            return b"354 End data with <CR><LF>.<CR><LF>\r\n"
        if verb == b"QUIT":
            return b"221 Bye\r\n"
        if verb in (b"HELO", b"MAIL", b"RCPT", b"RSET", b"NOOP"):
            return b"250 OK\r\n"
        return b"502 Command not implemented\r\n"


def serve(port: int, *, reply_delay_seconds: float, pipelining: bool) -> None:
    recorder = Recorder()
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(
        loop.create_server(
            lambda: SinkProtocol(recorder, reply_delay_seconds=reply_delay_seconds, pipelining=pipelining),
            "127.0.0.1",
            port,
        )
    )
    threading.Thread(target=loop.run_forever, name="smtp", daemon=True).start()
    print(f"ready {port}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "stats":
            answer = json.dumps(recorder.stats())
        elif command == "users":
            with recorder.lock:
                answer = json.dumps(dict(recorder.by_user))
        elif command == "reset":
            recorder.reset()
            answer = "ok"
        else:
            answer = json.dumps({"error": f"unknown command {command!r}"})
        print(answer, flush=True)
    loop.call_soon_threadsafe(server.close)


@dataclass(frozen=True)
class Delivered:
    """What the sink received against what was expected: every user exactly one email."""

    stats: dict[str, int]
    expected: int
    missing: int
    repeated: int
    unexpected: int

    @property
    def ok(self) -> bool:
        return not (self.missing or self.repeated or self.unexpected) and self.stats["messages"] == self.expected

    def describe(self) -> str:
        s = self.stats
        verdict = "every user exactly one email" if self.ok else "NOT one email per user"
        return (
            f"{s['messages']:,} emails for {s['users']:,} users ({self.expected:,} expected): {self.missing:,} "
            f"missing, {self.repeated:,} users mailed more than once, {self.unexpected:,} unexpected, "
            f"{s['repeated_message_ids']:,} repeated Message-IDs: {verdict}"
        )


class SmtpSink:
    """The sink's process, seen from a benchmark."""

    def __init__(self, port: int | None = None, *, reply_delay_ms: float = 0.0, pipelining: bool = True) -> None:
        from support import free_port  # bench/support.py, beside this script

        port = port or free_port()
        options = ["--reply-delay-ms", str(reply_delay_ms)] + ([] if pipelining else ["--no-pipelining"])
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--port", str(port), *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        first = self._read()
        if not first.startswith("ready "):
            self.close()
            raise RuntimeError(f"the SMTP sink did not start: {first!r}")
        self.port = int(first.split()[1])
        self.url = f"smtp://127.0.0.1:{self.port}"

    def _read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the SMTP sink exited ({self.process.poll()})")
        return line.strip()

    def _ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._read()

    def stats(self) -> dict[str, int]:
        return json.loads(self._ask("stats"))

    def reset(self) -> None:
        self._ask("reset")

    def check(self, expected_users: set[int]) -> Delivered:
        """Compare what arrived with one email for each of ``expected_users``."""
        by_user = {int(k) if k.isdigit() else k: n for k, n in json.loads(self._ask("users")).items()}
        return Delivered(
            stats=self.stats(),
            expected=len(expected_users),
            missing=sum(1 for user in expected_users if user not in by_user),
            repeated=sum(1 for n in by_user.values() if n > 1),
            unexpected=sum(1 for user in by_user if user not in expected_users),
        )

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reply-delay-ms", type=float, default=0.0)
    parser.add_argument("--no-pipelining", dest="pipelining", action="store_false")
    args = parser.parse_args()
    serve(args.port, reply_delay_seconds=args.reply_delay_ms / 1000, pipelining=args.pipelining)
