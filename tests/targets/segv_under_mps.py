"""A flush target for tests/test_mps.py: the torch reference, except that every launch in a process whose
CUDA_MPS_PIPE_DIRECTORY is set kills that process with SIGSEGV.  It stands for what a fatal GPU fault of another
MPS client does to every client of the server, whatever case each one had in flight (gdn_fuzz.engine.mps): the case
itself is innocent, and a process of its own context checks it without a fault.  The reference module is imported
once per process, so this file serves the arm of the first import only (the tests use bf16)."""

import os
import signal

from gdn_fuzz.targets.reference_ucache_flush import (IO_TORCH, RING_SLOTS, RING_TORCH, ST_TORCH,  # noqa: F401
                                                     W_RING)
from gdn_fuzz.targets.reference_ucache_flush import gated_delta_rule_mtp_ucache_flush as _reference


def gated_delta_rule_mtp_ucache_flush(*args, **kwargs):
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return _reference(*args, **kwargs)
