"""A process that must not outlive its parent asks Linux for SIGTERM when the parent dies, however
it dies (``kill -9`` included), and then stops the way SIGTERM stops it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: prctl(2)'s option: the signal a process gets when the thread that started it ends.
_PR_SET_PDEATHSIG = 1

#: Looked up once, at import: a child between fork and exec must not load a library.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def terminate_with(parent: int) -> None:
    """SIGTERM to this process when ``parent``, its parent, dies; at once if it is gone already.
    Nothing outside Linux."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    # The parent may have died before the line above: then nothing would ever send it.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
