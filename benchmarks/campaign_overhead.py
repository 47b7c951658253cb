"""The campaign process's own seconds per example: Hypothesis' draw of a launch case and the campaign's bookkeeping,
with the check replaced by a stand-in that returns a passing verdict at once (issue 32).

A campaign's round is a Hypothesis run: each example draws a Case (strategies.cases: ~37 choices at the campaign's
default menu) and the body checks it.  With an isolated worker the check runs in another process, but the draw, the
engine's work between examples and the record line hold this process's interpreter, also with rounds at once
(--pipeline 2: both rounds' threads share one interpreter lock).  So 1 / (these seconds) bounds one process's checks
per second whatever the worker does.  The stand-in check runs in this process (no worker, no device), so the figure
is the campaign process's alone; the draw is the real strategy with the campaign's settings.

    python benchmarks/campaign_overhead.py [--seconds 10] [--pipeline 1 2] [--profile N] [--json out.json]
    python benchmarks/campaign_overhead.py --isolated [--check-ms 2.5] [--seeds 1 4] [--defer on off]

--profile N: cProfile of one more run (pipeline 1), its N most expensive functions by own time.
--isolated: the campaign's real isolated path instead (an isolated worker process, the pipe, the in-flight file, the
answer and the books), the worker's check a stand-in that holds its CPU for --check-ms and passes; one run per
(--defer, --seeds: value seeds per drawn structure) pair.  Per example the campaign process draws (1/K of a case),
sends, reads the answer and keeps the books; the worker spins.  With deferred verdicts the two overlap, so the
examples per second say which side bounds one process at that check time.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import os
import platform
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # roundtrip, the isolated stand-in check's module

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.control import current_build_context  # noqa: E402

from gdn_fuzz.engine.campaign import Campaign  # noqa: E402
from gdn_fuzz.findings import Findings  # noqa: E402
from gdn_fuzz.properties import get_property  # noqa: E402
from gdn_fuzz.strategies import cases  # noqa: E402
from gdn_fuzz.targets import get_target  # noqa: E402

# the GPU campaign's default menu (gdn-fuzz run --target production: bf16, T 4 and 8, the three default geometries,
# buckets 4 and 8, every value drawn by the draw program)
MENU = dict(arms=("bf16",), Ts=(4, 8), geometries=((1, 1), (1, 2), (16, 64)), buckets=(4, 8))


def _passing(target, case, device) -> Findings:
    """The stand-in check: a passing verdict with the metrics a real one carries (the record writes them)."""
    f = Findings([])
    f.metrics = {n: [1e-3] * case.B for n in ("y", "k", "u", "g", "fold")}
    return f


def isolated_run(seconds: float, defer: bool, seeds: int, check_ms: float) -> dict:
    """One campaign through an isolated worker whose check is benchmarks/roundtrip.py's stand-in (spin: it holds the
    worker's CPU for check_ms and passes).  Importing roundtrip puts this folder on the worker's PYTHONPATH."""
    import roundtrip  # noqa: F401 - the worker imports its spin by name

    from gdn_fuzz.engine.isolation import MEASURE

    os.environ["GDN_FUZZ_SPIN_MS"] = str(check_ms)
    prop = dataclasses.replace(get_property("launch"), name=f"{MEASURE}roundtrip:spin")
    c = Campaign(target=get_target("reference"), device="cpu", properties=[prop], isolate=True, defer=defer,
                 pipeline=1, seeds_per_example=seeds, spare_worker=False, draws="graph", **MENU)
    c._worker.start()  # the worker's process start (and a first run's forkserver) before the clock, not inside it:
    c.stats.started = time.monotonic()  # the budget's clock starts at construction otherwise (as in campaign_run)
    t0 = time.perf_counter()
    c.run(seconds=seconds)
    dt = time.perf_counter() - t0
    return dict(defer=defer, seeds_per_example=seeds, check_ms=check_ms, examples=c.stats.examples,
                structures=c.stats.structures, seconds=round(dt, 3), findings=len(c.findings),
                ms_per_example=round(c.stats.elapsed / max(c.stats.examples, 1) * 1e3, 3),
                per_30s=round(30 * c.stats.examples / c.stats.elapsed))


def campaign_run(seconds: float, pipeline: int, profile: cProfile.Profile | None = None) -> dict:
    """One in-process campaign with the stand-in check: examples, seconds, ms per example."""
    prop = dataclasses.replace(get_property("launch"), check=_passing)
    c = Campaign(target=get_target("reference"), device="cpu", properties=[prop], record_path=io.StringIO(),
                 draws="graph", pipeline=pipeline, **MENU)
    c.stats.started = time.monotonic()
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    try:
        c.run(seconds=seconds)
    finally:
        if profile is not None:
            profile.disable()
    dt = time.perf_counter() - t0
    return dict(pipeline=pipeline, examples=c.stats.examples, seconds=round(dt, 3),
                ms_per_example=round(dt / max(c.stats.examples, 1) * 1e3, 3),
                per_30s=round(30 * c.stats.examples / dt))


def bare_draws(n: int) -> dict:
    """Hypothesis alone: n examples of the same strategy in a plain @given (generate phase only), with the number
    of choices each example made."""
    choices = []

    @settings(max_examples=n, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(**MENU))
    def draw(case):
        choices.append(len(current_build_context().data.choices))

    t0 = time.perf_counter()
    draw()
    dt = time.perf_counter() - t0
    choices.sort()
    return dict(examples=len(choices), ms_per_example=round(dt / len(choices) * 1e3, 3),
                choices_mean=round(sum(choices) / len(choices), 1), choices_median=choices[len(choices) // 2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds per campaign run (default 10)")
    ap.add_argument("--pipeline", type=int, nargs="+", default=[1, 2], help="rounds at once, one run each")
    ap.add_argument("--bare", type=int, default=1000, help="examples of the plain @given draw (0: skip)")
    ap.add_argument("--profile", type=int, default=0, help="cProfile one more pipeline-1 run: print N functions")
    ap.add_argument("--isolated", action="store_true", help="through an isolated worker with a stand-in check instead")
    ap.add_argument("--check-ms", type=float, default=2.5, help="--isolated: the stand-in check's milliseconds")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 4], help="--isolated: value seeds per structure")
    ap.add_argument("--defer", choices=("on", "off"), nargs="+", default=["on", "off"],
                    help="--isolated: deferred verdicts")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    import hypothesis

    out = dict(python=platform.python_version(), hypothesis=hypothesis.__version__, machine=platform.node(),
               runs=[])
    if args.isolated:
        for d in args.defer:
            for k in args.seeds:
                r = isolated_run(args.seconds, d == "on", k, args.check_ms)
                out["runs"].append(r)
                print("isolated, stand-in check:", r, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return 0
    if args.bare:
        out["bare"] = bare_draws(args.bare)
        print("plain @given of the campaign's strategy:", out["bare"], flush=True)
    for p in args.pipeline:
        r = campaign_run(args.seconds, p)
        out["runs"].append(r)
        print("campaign, stand-in check:", r, flush=True)
    if args.profile:
        prof = cProfile.Profile()
        campaign_run(args.seconds, 1, prof)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.profile)
        print(s.getvalue())
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
