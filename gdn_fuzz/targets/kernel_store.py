"""Compiled CuTe DSL kernels kept on disk, so that a second campaign process does not compile again.

Why this exists (issue 17): every `gdn-fuzz run` on an H200 spent 52-67 s compiling the kernels of
its warm-up, and a second process on the same machine paid the same again.  The DSL's own disk
cache (CUTE_DSL_CACHE_DIR) is never written for this kernel: FlashInfer compiles it with
`cute.compile`, which sets compile_only=True, and nvidia-cutlass-dsl 4.8.1 turns its cache off
for compile-only calls (base_dsl/dsl.py: "Cache is disabled as user wants to compile only").

What it does: a target module that compiles through a module-level dict `_CACHE` (FlashInfer's
wrapper: `if cache_key not in _CACHE: _CACHE[cache_key] = cute.compile[...](...)`, then
`_CACHE[cache_key](*args)`) gets a KernelStore in place of that dict.  A miss in memory looks on
disk; a kernel the wrapper compiles is written to disk with the DSL's own export
(`JitCompiledFunction.dump_to_object`) and read back with `cutlass.cute.runtime.load_module`
(the DSL's documented AOT path: an ELF object with the host launch function and the cubin,
linked in-process by JITLink; no compiler or linker is needed).  The wrapper itself is not
edited: the code under test runs as released.

Which kernel a file holds: the SHA-256 of the target file's bytes (so a mutant, an edited
kernel or another FlashInfer release never reads another file's kernel), the dtype arm, the
versions of flashinfer-python and nvidia-cutlass-dsl, and the wrapper's own cache key (dtypes,
arch and device index, T bucket, flags, H, HV, V), hashed into the file name.  Helper modules the
wrapper imports are covered only through the flashinfer version: whoever edits FlashInfer in
place must clear the store (or set GDN_FUZZ_KERNEL_STORE=off).

One compile per kernel across processes: a process that misses a kernel on disk takes an exclusive lock on
the kernel's `.lock` file (fcntl.flock) and compiles it; another process that misses the same kernel then
waits for that lock (up to LOCK_WAIT_S) and reads the kernel the first one wrote, instead of compiling it too
(8 campaign processes starting on an empty store compiled each kernel 8 times).  The lock ends when the
kernel is stored, when the launch that missed it returns or raises (Target.launch: release_held), when the
process misses another kernel (the wrapper compiles one kernel at a time, so a kernel that was never stored did
not compile), or with the process.  A wait that times out (LOCK_WAIT_S) compiles, as without the lock.

Where: $GDN_FUZZ_KERNEL_STORE (a folder), else $XDG_CACHE_HOME/gdn_fuzz/kernels, else
~/.cache/gdn_fuzz/kernels.  GDN_FUZZ_KERNEL_STORE=off keeps everything in memory (the
wrapper's own behaviour).  Writes are atomic (a temporary file in the folder, then os.replace),
so processes sharing a store never read half a kernel.  Anything that fails (a DSL without the
export, an unreadable or stale file, a full disk) falls back to compiling, with one warning per
process; a store can never make a launch fail that would not fail without it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from gdn_fuzz.environment import dist_version

STORE_ENV = "GDN_FUZZ_KERNEL_STORE"
# the longest wait for another process's compile of one kernel: the H200's took ~6 s each (docs/benchmarks.md, run
# 63); well under the 30 s floor of a launch's hang timeout, which does not pause for this wait
LOCK_WAIT_S = 15.0
OFF = ("off", "0", "none", "false", "no")
FORMAT = "gdn-fuzz-kernel-store-1"


def store_dir() -> Path | None:
    """The store's folder, or None when GDN_FUZZ_KERNEL_STORE switches it off."""
    v = os.environ.get(STORE_ENV, "").strip()
    if v.lower() in OFF:
        return None
    if v:
        return Path(v).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "gdn_fuzz" / "kernels"


def _version(dist: str) -> str:
    return dist_version(dist, "absent")  # part of a kernel's identity: keep the word


def identity(path: Path, arm_name: str) -> str:
    """Everything besides the wrapper's cache key that decides which kernel a key compiles to."""
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return "|".join((FORMAT, digest, arm_name, "flashinfer-python=" + _version("flashinfer-python"),
                     "nvidia-cutlass-dsl=" + _version("nvidia-cutlass-dsl")))


class KernelStore(dict):
    """A dict of compiled kernels (the wrapper's _CACHE) backed by a folder of exported objects.

    compiled: kernels this process compiled (the wrapper's misses); loaded: read from the folder.
    """

    def __init__(self, folder: Path, ident: str, initial: dict | None = None):
        super().__init__(initial or {})
        self.folder = Path(folder)
        self.ident = ident
        self.loaded = 0
        self.compiled = 0
        self.saved = 0
        self.errors: list[str] = []
        self._modules: list = []  # loaded ExternalBinaryModules: their engines own the code
        self._lock = threading.Lock()
        self._held: dict = {}  # key -> the open .lock file this process holds while it compiles that kernel
        self.waited_s = 0.0  # seconds spent waiting for other processes' compiles

    def name(self, key) -> str:
        """The file-name stem of `key` (also the exported symbol prefix: [0-9a-z_] only)."""
        return "k" + hashlib.sha256(f"{self.ident}|{key!r}".encode()).hexdigest()[:40]

    def path(self, key) -> Path:
        return self.folder / (self.name(key) + ".o")

    def _warn(self, what: str, err: BaseException) -> None:
        msg = f"{what}: {type(err).__name__}: {err}"
        if not self.errors:
            print(f"gdn-fuzz: kernel store {self.folder}: {msg}; compiling instead "
                  f"(set {STORE_ENV}=off to silence)", file=sys.stderr)
        self.errors.append(msg)

    def _load(self, key):
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            from cutlass.cute.runtime import load_module

            mod = load_module(str(p))
            fn = getattr(mod, self.name(key))
        except Exception as e:  # noqa: BLE001 - any failure means: compile as the wrapper would
            self._warn(f"reading {p.name}", e)
            return None
        self._modules.append(mod)
        return fn

    def _save(self, key, fn) -> None:
        dump = getattr(fn, "dump_to_object", None)
        if dump is None:
            return
        tmp = None
        try:
            data = dump(self.name(key))
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".o", dir=self.folder)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, self.path(key))
            tmp = None
            self.saved += 1
        except Exception as e:  # noqa: BLE001 - the kernel is compiled and in memory; only the disk copy failed
            self._warn(f"writing {self.path(key).name}", e)
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)

    def __contains__(self, key) -> bool:
        if dict.__contains__(self, key):
            return True
        with self._lock:
            if dict.__contains__(self, key):
                return True
            self._release_all(keep=key)  # a kernel that was never stored: its compile failed
            fn = self._load(key)
            if fn is None:
                self._claim(key)  # hold its lock, after waiting for a process that holds it (compiles it)
                fn = self._load(key)  # stored meanwhile, by that process or one that just finished
                if fn is not None:
                    self._release(key)
            if fn is None:
                return False  # the wrapper compiles it (this process holds its lock, where locks work)
            dict.__setitem__(self, key, fn)
            self.loaded += 1
            return True

    def __setitem__(self, key, fn) -> None:
        dict.__setitem__(self, key, fn)
        self.compiled += 1
        self._save(key, fn)
        with self._lock:
            self._release(key)

    def _claim(self, key) -> None:
        """Hold the kernel's lock file, waiting while another process holds it (it is compiling that kernel).
        Where it cannot lock (no fcntl, an unwritable folder, a filesystem without locks, a wait past LOCK_WAIT_S)
        it holds nothing: the process compiles then, as without a store."""
        try:
            import fcntl
        except ImportError:
            return
        import time

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fh = open(self.folder / (self.name(key) + ".lock"), "a+b")
        except OSError:
            return
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 > LOCK_WAIT_S:
                    fh.close()
                    self._warn(f"waiting for {self.name(key)}.lock", TimeoutError(f"held past {LOCK_WAIT_S:g} s"))
                    return
                time.sleep(0.05)
            except OSError:  # a filesystem without locks
                fh.close()
                return
        self.waited_s += time.monotonic() - t0
        self._held[key] = fh

    def __del__(self):
        if getattr(self, "_held", None):
            self._release_all()

    def _release_all(self, keep=None) -> None:
        for k in [k for k in self._held if k != keep]:
            self._release(k)

    def _release(self, key) -> None:
        fh = self._held.pop(key, None)
        if fh is not None:
            fh.close()  # closing the file drops the flock


def install(mod: ModuleType, path: Path, arm_name: str) -> KernelStore | None:
    """Give `mod` a KernelStore in place of its `_CACHE` dict, when it compiles with the CuTe DSL
    (it has `cute` and a dict `_CACHE`) and the store is not switched off.  Returns the store."""
    folder = store_dir()
    cache = getattr(mod, "_CACHE", None)
    if folder is None or not isinstance(cache, dict) or isinstance(cache, KernelStore) \
            or getattr(mod, "cute", None) is None:
        return None
    store = KernelStore(folder, identity(path, arm_name), cache)
    mod._CACHE = store
    return store


def release_held(mod: ModuleType) -> None:
    """Drop the locks `mod`'s store holds for kernels it missed and never stored (their compile raised)."""
    cache = getattr(mod, "_CACHE", None)
    if isinstance(cache, KernelStore) and cache._held:
        with cache._lock:
            cache._release_all()


def compiles(mod: ModuleType) -> int:
    """Kernels `mod` compiled in this process (loaded ones not counted); len(_CACHE) without a store."""
    cache = getattr(mod, "_CACHE", None) or {}
    return cache.compiled if isinstance(cache, KernelStore) else len(cache)


def loads(mod: ModuleType) -> int:
    cache = getattr(mod, "_CACHE", None)
    return cache.loaded if isinstance(cache, KernelStore) else 0
