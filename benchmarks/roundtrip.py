"""The isolated check's round trip as the campaign process sees it, alone and with a second thread drawing
Hypothesis cases beside it (rounds at once, `gdn-fuzz run --pipeline 2`), per interpreter switch interval (issue 32).

The worker runs a stand-in check that spins for --check-ms (a loop that holds the worker's CPU, as a host-bound
check does), through the real `Worker.measure` path (the in-flight file, the pipe, the answer).  What the campaign
process adds to a check is the round trip less --check-ms.  With a second thread drawing, every blocking call on
the check's path (a file write, a pipe read, a poll) gives the interpreter lock away, and the check's thread waits
up to a switch interval to get it back.

    python benchmarks/roundtrip.py [--check-ms 3] [--n 300] [--intervals 5 0.2 0.05 0.02] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# the worker imports the stand-in check by module name (Worker.measure): it must find this directory
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)


def spin(target, case, device) -> dict:
    """The stand-in check: hold the worker's CPU for GDN_FUZZ_SPIN_MS."""
    t0, ms = time.perf_counter(), float(os.environ.get("GDN_FUZZ_SPIN_MS", "3"))
    while time.perf_counter() - t0 < ms / 1e3:
        pass
    return {}


def _spin():
    """spin by this module's importable name, not __main__'s: the worker imports the stand-in check by name."""
    import roundtrip

    return roundtrip.spin


def _drawer(stop: threading.Event, counter: list) -> None:
    """Draw launch cases with Hypothesis until stop is set (what a second round does between its checks)."""
    from hypothesis import HealthCheck, given, settings

    from gdn_fuzz.strategies import cases

    @settings(max_examples=10**9, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(cases(arms=("bf16",), Ts=(4, 8), geometries=((1, 1), (16, 64)), buckets=(4, 8)))
    def draw(case):
        counter[0] += 1
        if stop.is_set():
            raise _Stop

    try:
        draw()
    except _Stop:
        pass


class _Stop(Exception):
    pass


def measure(worker, case, n: int, interval_s: float | None, drawing: bool) -> dict:
    old = sys.getswitchinterval()
    stop, drawn = threading.Event(), [0]
    th = threading.Thread(target=_drawer, args=(stop, drawn), daemon=True) if drawing else None
    try:
        if interval_s is not None:
            sys.setswitchinterval(interval_s)
        if th is not None:
            th.start()
            time.sleep(0.5)  # Hypothesis' first draws
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            worker.measure(_spin(), case)
            times.append(time.perf_counter() - t0)
    finally:
        stop.set()
        if th is not None:
            th.join()
        sys.setswitchinterval(old)
    return dict(median_ms=1e3 * statistics.median(times), p90_ms=1e3 * sorted(times)[int(0.9 * len(times))],
                drawn=drawn[0])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-ms", type=float, default=3.0, help="the stand-in check's spin in the worker")
    ap.add_argument("--n", type=int, default=300, help="round trips per row")
    ap.add_argument("--intervals", nargs="+", type=float, default=[5, 0.2, 0.05, 0.02],
                    help="switch intervals (ms) of the rows with a drawing thread")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ["GDN_FUZZ_SPIN_MS"] = str(args.check_ms)
    from gdn_fuzz.case import Case, Row
    from gdn_fuzz.engine.isolation import Worker

    case = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 13, 3), Row(-1)), seed=1)
    rows = []
    with Worker("reference", "cpu", name="rt") as w:
        w.measure(_spin(), case)  # start the worker
        rows.append(dict(drawing=False, interval_ms=1e3 * sys.getswitchinterval(),
                         **measure(w, case, args.n, None, False)))
        for ms in args.intervals:
            rows.append(dict(drawing=True, interval_ms=ms, **measure(w, case, args.n, ms / 1e3, True)))
    print(f"stand-in check {args.check_ms:g} ms in the worker, {args.n} round trips per row")
    for r in rows:
        print(f"  {'drawing beside' if r['drawing'] else 'alone':>14s}  switch interval {r['interval_ms']:6.3f} ms:  "
              f"median {r['median_ms']:6.2f} ms (the campaign's part {r['median_ms'] - args.check_ms:5.2f}), "
              f"p90 {r['p90_ms']:6.2f} ms, {r['drawn']} cases drawn meanwhile")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(check_ms=args.check_ms, n=args.n, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
