"""What an SQS worker process holds stays hidden while the process lives: the receipts of the
messages its consumers received and have not settled, and a thread that extends their visibility
timeout before it runs out.

SQS has no connection or heartbeat to tell a dead worker from a slow one: a received message comes
back when its visibility timeout runs out. Extended every third of the timeout, a message a live
worker holds (prefetched, waiting for a thread, or in a long send) never comes back; a message a
worker killed with ``kill -9`` held comes back at most one timeout after it was last extended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from reports.worker import sqs

logger = logging.getLogger(__name__)


class Receipts:
    """The receipt handles of one queue's messages that a process received and has not settled,
    each with when it was last hidden (on :meth:`VisibilityKeeper`'s clock)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._hidden_at: dict[str, float] = {}

    def add(self, handle: str, now: float) -> None:
        with self._lock:
            self._hidden_at[handle] = now

    def discard(self, handles: Iterable[str]) -> None:
        with self._lock:
            for handle in handles:
                self._hidden_at.pop(handle, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._hidden_at)

    def due(self, now: float, *, every: float) -> list[str]:
        """The handles last hidden ``every`` seconds ago or longer."""
        with self._lock:
            return [handle for handle, at in self._hidden_at.items() if now - at >= every]

    def hidden(self, handles: Iterable[str], now: float) -> None:
        """``handles`` were hidden again at ``now``; one settled meanwhile stays settled."""
        with self._lock:
            for handle in handles:
                if handle in self._hidden_at:
                    self._hidden_at[handle] = now


class VisibilityKeeper:
    """Extends the visibility timeout of every watched receipt every third of the timeout, from a
    thread of its own that starts with the first :meth:`watch` (only worker processes consume).

    :param timeout_seconds: the visibility timeout each extension sets (SQS_VISIBILITY_TIMEOUT_SECONDS).
    :param clock: seconds from an arbitrary start (``time.monotonic``).
    """

    def __init__(self, client: Any, *, timeout_seconds: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.timeout_seconds = timeout_seconds
        self.every = timeout_seconds / 3
        self.clock = clock
        self._lock = threading.Lock()
        self._watched: list[Receipts] = []
        self._thread: threading.Thread | None = None
        self._failing = False

    def watch(self, receipts: Receipts) -> None:
        with self._lock:
            if receipts not in self._watched:
                self._watched.append(receipts)
            if self._thread is None:
                self._thread = threading.Thread(target=self._keep, name="sqs-visibility", daemon=True)
                self._thread.start()

    def extend_due(self) -> int:
        """One pass: hide again each receipt last hidden a third of the timeout ago; how many were."""
        with self._lock:
            watched = list(self._watched)
        extended = 0
        for receipts in watched:
            now = self.clock()
            handles = receipts.due(now, every=self.every)
            for i in range(0, len(handles), sqs.BATCH):
                extended += self._extend(receipts, handles[i : i + sqs.BATCH], now)
        return extended

    def _extend(self, receipts: Receipts, handles: list[str], now: float) -> int:
        entries = [
            {"Id": str(n), "ReceiptHandle": handle, "VisibilityTimeout": self.timeout_seconds}
            for n, handle in enumerate(handles)
        ]
        answer = self.client.change_message_visibility_batch(QueueUrl=receipts.url, Entries=entries)
        failed = {int(f["Id"]): bool(f.get("SenderFault")) for f in answer.get("Failed", [])}
        done = [handle for n, handle in enumerate(handles) if n not in failed]
        receipts.hidden(done, now)
        # A handle SQS no longer knows (the message was settled meanwhile, or came back to another
        # worker after this one stalled) cannot be extended again; the worker's ack settles it.
        receipts.discard(handle for n, handle in enumerate(handles) if failed.get(n))
        return len(done)

    def _keep(self) -> None:
        # Through the drain too, while in-flight messages finish; ends with the process.
        while True:
            time.sleep(self.every)
            try:
                self.extend_due()
            except Exception as error:
                # Never the end of the thread. The messages may then come back to another worker,
                # whose claim check makes it send nothing.
                if not self._failing:
                    logger.warning("Could not extend the visibility of held SQS messages (%s).", type(error).__name__)
                self._failing = True
                continue
            self._failing = False
