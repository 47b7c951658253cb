"""Crash isolation: run property checks in a worker process that may die.

A kernel can kill its process (a segfault) or poison its CUDA context with a sticky error
(illegal address), after which every later launch in that process fails.  So a campaign
with isolation never launches in its own process: it sends (property, case) to a worker,
and before each send it writes the case to `<inflight dir>/<worker>.json`, so that even a
crash that takes the parent down leaves the case on disk.  When the worker dies, or reports
a CUDA error, the check returns a `crash` finding for that case, the worker is replaced
and the campaign goes on; Hypothesis then shrinks the crashing case like any other failure.

Workers are started by a forkserver that has imported torch and gdn_fuzz but never touched
CUDA, so a restart costs a fork, not a fresh interpreter (the target module and its JIT
cache are per worker, and are rebuilt after a crash).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import tempfile
import time
from pathlib import Path

from .case import Case
from .checks import Finding, Findings

_CTX = None
CUDA_FATAL = ("illegal memory access", "an illegal instruction", "unspecified launch failure",
              "misaligned address", "CUDA error", "cudaError", "CUDA_ERROR")


def _context():
    global _CTX
    if _CTX is None:
        methods = mp.get_all_start_methods()
        _CTX = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
        if "forkserver" in methods:
            _CTX.set_forkserver_preload(["torch", "hypothesis", "gdn_fuzz.checks", "gdn_fuzz.properties"])
    return _CTX


def _worker_main(conn, target_name: str, device: str) -> None:
    """Loop: receive (property, case dict), run the check, send ('ok', findings, compiles)."""
    # Ctrl-C reaches the whole process group: the parent stops the campaign and closes this
    # worker; dying here first would look like a crash of the case in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .properties import get_property
    from .targets import get_target

    target = get_target(target_name)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        prop_name, case_d = msg
        case = Case.from_dict(case_d)
        try:
            found = get_property(prop_name).check(target, case, device)
            if str(device).startswith("cuda"):
                import torch

                torch.cuda.synchronize()  # surface asynchronous kernel faults here, not in the next case
        except Exception as e:  # noqa: BLE001 - reported, and fatal ones end the worker
            text = f"{type(e).__name__}: {e}"
            fatal = any(s in text for s in CUDA_FATAL)
            conn.send(("fatal" if fatal else "error", text, 0))
            if fatal:
                os._exit(3)
            continue
        fatal_in = [f for f in found if any(s in f.message for s in CUDA_FATAL)]
        conn.send(("fatal" if fatal_in else "ok",
                   dict(findings=[f.__dict__ for f in found], metrics=getattr(found, "metrics", None)),
                   sum(target.compile_count(a) for a in {case.arm})))
        if fatal_in:
            os._exit(3)


class Worker:
    """One isolated worker for a target on a device; restarts itself after a crash."""

    def __init__(self, target_name: str, device: str, inflight_dir: Path | None = None, name: str = "w0",
                 timeout_s: float = 600.0):
        self.target_name, self.device, self.name, self.timeout_s = target_name, device, name, timeout_s
        self.inflight_dir = Path(inflight_dir) if inflight_dir else Path(tempfile.gettempdir()) / "gdn_fuzz_inflight"
        self.inflight_dir.mkdir(parents=True, exist_ok=True)
        self.restarts = 0
        self.compiles = 0
        self._proc = None
        self._conn = None

    @property
    def inflight_path(self) -> Path:
        return self.inflight_dir / f"{self.name}.json"

    def _start(self):
        ctx = _context()
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child, self.target_name, self.device), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def close(self):
        if self._proc is not None:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = None

    def _died(self, prop: str, why: str) -> list[Finding]:
        self.restarts += 1
        self._proc = None
        return [Finding("crash", "R*", f"the worker process {why} while checking property {prop!r}; "
                        f"the case was saved before the launch at {self.inflight_path}")]

    def check(self, prop: str, case: Case) -> list[Finding]:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        fd, tmp = tempfile.mkstemp(dir=self.inflight_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(dict(property=prop, target=self.target_name, case=case.to_dict()), fh)
        os.replace(tmp, self.inflight_path)  # on disk before the launch
        try:
            self._conn.send((prop, case.to_dict()))
        except (BrokenPipeError, OSError):
            return self._died(prop, "was gone")
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._conn.poll(0.05):
                try:
                    kind, payload, compiles = self._conn.recv()
                except (EOFError, OSError):
                    break
                self.compiles = max(self.compiles, compiles)
                if kind == "fatal":
                    self._proc.join(timeout=10)
                    msg = payload if isinstance(payload, str) else "; ".join(d["message"] for d in payload["findings"])
                    out = self._died(prop, f"hit a fatal CUDA error ({msg})")
                    return out
                if kind == "error":
                    return [Finding("launch", "H*", f"the check raised {payload}")]
                self.inflight_path.unlink(missing_ok=True)
                res = Findings(Finding(**d) for d in payload["findings"])
                res.metrics = payload["metrics"]
                return res
            if not self._proc.is_alive():
                break
            if time.monotonic() > deadline:
                self._proc.kill()
                self._proc.join()
                return self._died(prop, f"did not answer within {self.timeout_s:.0f}s and was killed")
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        why = (f"was killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        return self._died(prop, why)
