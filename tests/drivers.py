"""Helpers for tests that drive `gdn-fuzz run` as its own process (fleet tests)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess


@contextlib.contextmanager
def reaped(p: subprocess.Popen):
    """Yield p; if the test leaves it running (a failed assertion, a timeout), SIGKILL its process group,
    which start_new_session=True made its own, so no driver or worker outlives the test."""
    try:
        yield p
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
