"""A stack sampler for a benchmark run (tools/h200_issue30.sh g32pipe with STACKS=1): put this folder first on
PYTHONPATH and set GDN_STACKS_DIR, and every Python process started that way writes, every 0.25 s for its first
40 s, the monotonic time and each other thread's innermost six frames to GDN_STACKS_DIR/stacks-<pid>.txt.  A thread
of its own with sys._current_frames(), not faulthandler: faulthandler's periodic dump crashed a gdn-fuzz process
that was importing (segmentation fault, this project's CPU machine).  A sample that is late says the interpreter
lock was held that long.  Processes forked from one (the isolated workers) do not sample."""

import os
import sys
import threading
import time
import traceback


def _sample(path: str, until: float) -> None:
    with open(path, "w") as f:
        while time.monotonic() < until:
            time.sleep(0.25)
            me = threading.get_ident()
            f.write(f"== {time.monotonic():.3f}\n")
            for tid, frame in sys._current_frames().items():
                if tid != me:
                    st = traceback.extract_stack(frame)[-6:]
                    f.write(f"-- {tid}: " + " | ".join(f"{os.path.basename(x.filename)}:{x.lineno}:{x.name}"
                                                     for x in st) + "\n")
            f.flush()


_DIR = os.environ.get("GDN_STACKS_DIR")
if _DIR:
    threading.Thread(target=_sample, args=(os.path.join(_DIR, f"stacks-{os.getpid()}.txt"), time.monotonic() + 40),
                     daemon=True, name="gdn-stack-sampler").start()
