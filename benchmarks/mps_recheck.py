"""What a fault seen under MPS costs one worker: the seconds from the fault's answer to the answer of the same case
checked again in a process of the worker's own context (Worker.mps_rechecks[...]["s"]), with the spare process
adopted for it and without a spare (a new process started), issue 32.

Run 87 (H100) measured 4.2-6.1 s per such check in a new process, eight of them after one fault (one per worker).
The fault is played by a stand-in measurement that kills its process whenever the process is an MPS client (the
pipe folder set; no daemon is needed), through the real Worker.measure path.  The stand-in waits for no oracle, so
on a GPU this misses the part of a process's first real check that the spare saves (its CUDA start and the oracle's
compile): measure that with `tools/h200_issue30.sh g32fault`, whose summary prints each check again with its seconds
and whether the spare took it.

    python benchmarks/mps_recheck.py [--n 5] [--target reference] [--device cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# the worker imports the stand-in by module name (Worker.measure): it must find this directory
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)


def crash_under_mps(target, case, device) -> dict:
    """Die (SIGSEGV) when this process is an MPS client, as every client does when another one faults."""
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def _stand_in():
    import mps_recheck

    return mps_recheck.crash_under_mps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="faults per mode (a new Worker each)")
    ap.add_argument("--target", default="reference")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from gdn_fuzz.case import Case, Row
    from gdn_fuzz.engine.isolation import Worker

    case = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0), Row(-1)), seed=1)
    rows = []
    for spare in (False, True):
        secs, ready = [], []
        for _ in range(args.n):
            with tempfile.TemporaryDirectory() as d:
                w = Worker(args.target, args.device, inflight_dir=Path(d), name="r", spare=spare,
                           mps_pipe=os.path.join(d, "pipe"))
                try:
                    w.start()
                    if spare:  # the spare has started and is waiting, as it is after a campaign's first checks
                        deadline = time.monotonic() + w.start_timeout_s
                        while not w._spare._conn.poll(0.05) and time.monotonic() < deadline:
                            pass
                    w.measure(_stand_in(), case)
                    (again,) = w.mps_rechecks
                    assert again["spare"] is spare and again["found"] == [], again
                    secs.append(again["s"])
                    ready.append(w.startups[0]["ready_s"])
                finally:
                    w.close()
        rows.append(dict(spare=spare, n=args.n, recheck_s=secs, median_s=statistics.median(secs),
                         first_ready_s=statistics.median(ready)))
        print(f"spare {'adopted' if spare else 'none (a new process)'}: check again in its own context "
              f"{statistics.median(secs):.3f} s median ({', '.join(f'{x:.3f}' for x in secs)}); a worker's start "
              f"(its ready_s) {statistics.median(ready):.3f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(target=args.target, device=args.device, rows=rows), indent=1))


if __name__ == "__main__":
    main()
