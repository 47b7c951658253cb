"""A materializer target for tests/test_prefix_serving.py's unvalidated-input study: the torch reference, except
that a dst past the pool kills the process with SIGSEGV (what an out-of-bounds store can do to a real one).
The reference module is imported once per process, so this file serves the arm of the first import only (the
test uses bf16)."""

import os
import signal

from gdn_fuzz.targets.reference_prefix_materialize import RING_TORCH, ST_TORCH, W_RING  # noqa: F401 (checked by the loader)
from gdn_fuzz.targets.reference_prefix_materialize import gdn_prefix_materialize as _reference


def gdn_prefix_materialize(state, src_slots, dst_slots, *args, **kwargs):
    if bool((dst_slots >= state.shape[0]).any()):
        os.kill(os.getpid(), signal.SIGSEGV)
    return _reference(state, src_slots, dst_slots, *args, **kwargs)
