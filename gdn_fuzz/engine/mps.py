"""A private NVIDIA MPS daemon per GPU for the campaign processes of one run (issue 32).

Eight campaign processes on one GPU are eight CUDA contexts, and the GPU time-slices between contexts:
each check waits for its context's turn.  Under an MPS daemon their crash-isolation workers are clients
of one server context, and their kernels run side by side.  Measured on an H100 (docs/benchmarks.md,
issue 32, eleventh part): the product command checked 15,173-16,061 launches per 30 s without MPS and
23,068-23,308 under a daemon started by hand.

`gdn-fuzz run --mps auto|on|off` (default auto, or $GDN_FUZZ_MPS).  auto starts one daemon per GPU when
`why_not` finds no reason against it; on starts it or stops the run with that reason (exit 2); off never
starts one.  The daemon is this run's own: its pipe and log folders are a private temporary folder, the
workers that should use it are told its pipe folder (CUDA_MPS_PIPE_DIRECTORY, set in the worker process
before CUDA starts), and it is stopped (`quit`, then SIGKILL of what is left) and its folder removed when
the run ends.  The GPU's settings are not touched (compute mode stays as it is).

What MPS changes for crash isolation, and how gdn_fuzz.engine.isolation.Worker keeps its findings true:
a fatal GPU fault of one client reaches every client of the server, and the server takes no new client
until every one of them has exited (NVIDIA's MPS documentation, "error containment"; it does not say which
client faulted).  So a crash or a hang seen under MPS is not taken as the case's own: the worker leaves
MPS for good, the case is checked again in a process with its own CUDA context, and that check's result
is the check's result.  Confirmations (Worker.reproduces) and their spare process never use MPS.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

MPS_ENV = "GDN_FUZZ_MPS"
MODES = ("auto", "on", "off")
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE = "/tmp/nvidia-mps"  # where a daemon started without CUDA_MPS_PIPE_DIRECTORY listens
START_TIMEOUT_S = 30.0
QUIT_TIMEOUT_S = 10.0  # `quit` waits for the server's clients; after this the daemon's processes are killed


class MpsError(RuntimeError):
    """The daemon could not be started (the message is one line naming why and the fix)."""


def parse_mps(spec) -> str:
    """--mps / $GDN_FUZZ_MPS: 'auto', 'on' or 'off'.  Raises ValueError naming the option, the value and the fix."""
    s = str(spec if spec is not None else "auto").strip().lower()
    if s not in MODES:
        raise ValueError(f"--mps={spec!r} (or ${MPS_ENV}): give auto, on or off")
    return s


def why_not(device: str, per_device: int, env=None, control: str | None = None) -> str | None:
    """Why this run's workers should not share a daemon of their own, or None.  control: the daemon's program
    (None: nvidia-cuda-mps-control looked up on PATH)."""
    env = os.environ if env is None else env
    if not str(device).startswith("cuda"):
        return f"the device is {device}, not a GPU"
    if per_device < 2:
        return "one campaign process per GPU: there is no context to share"
    if env.get(PIPE_ENV):
        return f"{PIPE_ENV} is set ({env[PIPE_ENV]}): the workers are left to that MPS daemon"
    if os.path.exists(os.path.join(DEFAULT_PIPE, "control")):
        return f"an MPS daemon already listens at {DEFAULT_PIPE}: the workers are left to it"
    if (control or shutil.which(CONTROL)) is None:
        return f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's compute utilities)"
    return None


class Daemon:
    """One private MPS control daemon (and the server it starts) for one GPU (gpu: CUDA_VISIBLE_DEVICES, None:
    the run's own).  start() and stop(); `pipe` is what a client needs (isolation.Worker(mps_pipe=...))."""

    def __init__(self, gpu: str | None = None, control: str | None = None):
        self.gpu = gpu
        self.control = control or shutil.which(CONTROL) or CONTROL
        self.root: Path | None = None
        self.stopped_by: str | None = None  # "quit", or "killed" when quit did not end every process

    @property
    def pipe(self) -> str:
        return str(self.root / "pipe")

    def _env(self) -> dict:
        env = dict(os.environ, **{PIPE_ENV: self.pipe, LOG_ENV: str(self.root / "log")})
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env

    def start(self) -> "Daemon":
        self.root = Path(tempfile.mkdtemp(prefix="gdn_fuzz_mps-"))
        (self.root / "pipe").mkdir()
        (self.root / "log").mkdir()
        try:
            got = subprocess.run([self.control, "-d"], env=self._env(), capture_output=True, text=True,
                                 timeout=START_TIMEOUT_S, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            self._remove()
            raise MpsError(f"{self.control} -d did not start an MPS daemon ({e}); run with --mps off") from None
        if got.returncode != 0:
            said = " ".join((got.stderr or got.stdout or "").split())[:300]
            self._remove()
            raise MpsError(f"{self.control} -d exited with status {got.returncode} ({said or 'no message'}); "
                           "run with --mps off")
        return self

    def pids(self) -> list[int]:
        """The daemon's processes (its control daemon and server): every process of this user whose environment
        names this daemon's pipe folder and whose program is an MPS one."""
        if self.root is None:
            return []
        want = f"{PIPE_ENV}={self.pipe}".encode()
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                argv0 = (d / "cmdline").read_bytes().split(b"\0", 1)[0]
                if b"mps" not in os.path.basename(argv0):
                    continue
                if want in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                continue
        return out

    def stop(self) -> None:
        """`quit` to the control daemon; the processes still there after QUIT_TIMEOUT_S are killed; the folder is
        removed.  Never raises."""
        if self.root is None:
            return
        try:
            subprocess.run([self.control], input="quit\n", env=self._env(), capture_output=True, text=True,
                           timeout=QUIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
        deadline = time.monotonic() + QUIT_TIMEOUT_S
        left = self.pids()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.pids()
        self.stopped_by = "killed" if left else "quit"
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self._remove()

    def _remove(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
