"""The consumers' side of :mod:`reports.worker.held`: each message a consumer hands out is held
until it is settled, on either broker.

A broker that holds messages has a ``held`` (:class:`reports.worker.held.HeldMessages`) and the
middleware :class:`StartedMessages`; its consumers call :func:`hold` when they hand a message out
and :func:`release` when it is acked, nacked or requeued.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware

from reports.worker.held import DELAY_SUFFIX, HeldMessages

#: The attribute of a handed-out message that holds its :class:`reports.worker.held.Held`.
_HELD = "_reports_held"


def hold(held: HeldMessages, owner: object, queue: str, message: MessageProxy) -> None:
    """Record that ``owner`` handed ``message`` out from ``queue``; a message held already stays as it is.

    A delay queue's messages are only held until due: they do not count as waiting.
    """
    if getattr(message, _HELD, None) is None:
        timestamp_ms = int(message.message_timestamp)
        setattr(message, _HELD, held.hold(owner, queue, timestamp_ms, waiting=not queue.endswith(DELAY_SUFFIX)))


def release(held: HeldMessages, message: MessageProxy) -> None:
    """The message is settled; releasing it twice, or one never held, is harmless."""
    entry = getattr(message, _HELD, None)
    if entry is not None:
        held.release(entry)


class StartedMessages(Middleware):
    """Marks a held message as no longer waiting once a worker thread takes it."""

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        entry = getattr(message, _HELD, None)
        held: Any = getattr(broker, "held", None)
        if entry is not None and isinstance(held, HeldMessages):
            held.start(entry)
