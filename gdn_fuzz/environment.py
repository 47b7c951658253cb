"""What a process reads from its environment: a validated choice from an environment variable, and the version
of an installed distribution.  Standard library only, so that `gdn-fuzz --version` and the modules that read
their switches at import stay light."""

from __future__ import annotations

import os
from importlib import metadata


def choice(var: str, choices: tuple, meaning: str, default: str | None = None) -> str:
    """The value of environment variable `var`, lower-cased, one of `choices` (unset or empty: `default`, else the
    first).  Any other value raises ValueError naming the variable, its value, the choices and `meaning` (what each
    does)."""
    val = os.environ.get(var, "").strip().lower() or (choices[0] if default is None else default)
    if val not in choices:
        raise ValueError(f"{var}={os.environ[var]!r} is not a legal choice; use one of {', '.join(choices)} "
                         f"({meaning})")
    return val


def count_or_auto(spec, option: str, var: str, what: str, hi: int | None = None, example: int = 2) -> int | None:
    """A command-line count that may be 'auto' (--processes, --pipeline): None for 'auto' (or None), else the whole
    number N, 1 <= N (<= hi).  ValueError otherwise, one line naming the option, the value (and that it came from
    $var, when it did) and the fix (`example`: the number the fix shows); `what` says what the number counts."""
    if spec is None:
        return None
    s = str(spec).strip()
    if s == "auto":
        return None
    env = f" (from ${var})" if s and os.environ.get(var, "").strip() == s else ""
    try:
        n = int(s)
    except ValueError:
        n = 0
    if n < 1 or (hi is not None and n > hi):
        within = f"in [1, {hi}]" if hi is not None else ">= 1"
        raise ValueError(f"{option}={s}{env}: give {what}: a whole number {within} (e.g. {option} {example}) or auto")
    return n


def dist_version(dist: str, missing: str | None = "not installed") -> str | None:
    """The installed version of distribution `dist` (its metadata; nothing is imported), or `missing`."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return missing


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, all) jiffies of every core since boot, from /proc/stat (None off Linux)."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
    return sum(f[:8]) - idle, sum(f[:8])


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def free_cores(window_s: float = 0.3) -> tuple[int, float] | None:
    """(the cores this process may run on, how many of them other processes kept busy over `window_s`), read from
    /proc/stat twice, less this process's own CPU time; None where /proc/stat is not there."""
    import time

    a, t0, own0 = _cpu_jiffies(), time.monotonic(), os.times()
    if a is None:
        return None
    time.sleep(window_s)
    b, t1, own1 = _cpu_jiffies(), time.monotonic(), os.times()
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = (b[0] - a[0]) / hz - ((own1.user - own0.user) + (own1.system - own0.system))
    cores = usable_cores()
    total_cores = os.cpu_count() or cores
    busy_cores = max(0.0, busy / max(t1 - t0, 1e-3)) * cores / total_cores  # others' share on our cores
    return cores, busy_cores


def default_torch_threads(measure=free_cores) -> tuple[int, str] | None:
    """torch's intra-op threads for a campaign process that is alone on its cores: the cores other processes leave
    free (rounded, at least 1), with the reason.  Measured on a 2-core CPU machine (docs/robustness.md, 3 runs each):
    idle, 2 threads checked 1.5x the examples of 1; with one core kept busy by another process, 1 thread checked 1.6x
    the examples of 2 (torch's default, every core).  None where the cores cannot be read (torch's default then)."""
    got = measure()
    if got is None:
        return None
    cores, busy = got
    n = max(1, min(cores, int(cores - busy + 0.5)))
    return n, f"{cores} cores, {busy:.1f} kept busy by other processes"


def write_atomic(path, text: str, *, durable: bool = False, mode: int | None = None, prefix: str | None = None,
                 suffix: str = ".tmp") -> None:
    """Write `text` to `path` through a temporary file in the same folder and os.replace: a reader sees the old
    file or the whole new one, never a part (corpus entries, reports, study records, mutated copies).  durable:
    fsync before the rename; mode: the file's permissions (mkstemp's are 0600); prefix, suffix: the temporary
    file's name (default ".NAME." and ".tmp"), for a folder whose cleanup knows them."""
    import tempfile
    from pathlib import Path

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}." if prefix is None else prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
