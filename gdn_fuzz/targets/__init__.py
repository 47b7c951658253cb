"""Targets: anything exposing the production entry point and its constants.

A target is a Python file defining ``gated_delta_rule_mtp_ucache_flush`` plus the module
constants RING_SLOTS (32) and W_RING (16), whose dtype arm is chosen by the
GDN_UCACHE_*_DTYPE environment variables at import (D1).  The loader imports one module
instance per (file, arm), with the arm's variables set only for the duration of that
import, and checks that the module fits before anything runs.

Built-in names:
  reference   the torch implementation in this package (CPU or CUDA; the CI default)
  production  FlashInfer's fused CuTeDSL kernel: $GDN_FUZZ_KERNEL_MODULE=/path/to/file.py,
              else the installed flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache_flush
  sm100       flashinfer.gdn_kernels.gdn_replay_mtp_umma (FlashInfer >= 0.7.3, B200 only)
  mutant:NAME a catalogued bug (gdn_fuzz.mutants) applied to a temporary copy of its base
Any other value is taken as a path to a Python file (a user's kernel, an older version,
a patched copy).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from ..arms import ENV_VARS, Arm, get_arm

ENTRY = "gated_delta_rule_mtp_ucache_flush"
PRODUCTION_MODULE = "flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache_flush"
SM100_MODULE = "flashinfer.gdn_kernels.gdn_replay_mtp_umma"
SM100_ENTRY = "gated_delta_rule_mtp_ucache_flush_umma"
KERNEL_MODULE_ENV = "GDN_FUZZ_KERNEL_MODULE"
REFERENCE_PATH = Path(__file__).with_name("reference_ucache_flush.py")


class TargetUnavailable(RuntimeError):
    """The target cannot run here; the message says why and what to do."""


class TargetMismatch(TypeError):
    """The module does not fit the production contract (missing entry point, wrong constants)."""


def _module_file(dotted: str) -> Path | None:
    """Locate a submodule's file without importing its (possibly heavy) parent packages."""
    top, _, rest = dotted.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc, *rest.split(".")).with_suffix(".py")
        if p.is_file():
            return p
    return None


def resolve_production_path() -> Path:
    """$GDN_FUZZ_KERNEL_MODULE if set, else the installed FlashInfer module's file."""
    env = os.environ.get(KERNEL_MODULE_ENV, "").strip()
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise TargetUnavailable(
                f"{KERNEL_MODULE_ENV}={env!r} is not a file; point it at a .py file that defines {ENTRY}")
        return p.resolve()
    p = _module_file(PRODUCTION_MODULE)
    if p is None:
        raise TargetUnavailable(
            f"{PRODUCTION_MODULE} is not installed; `pip install 'gdn-fuzz[gpu]'` "
            f"(flashinfer-python==0.7.2.post1) or set {KERNEL_MODULE_ENV}=/path/to/file.py")
    return p


_LOCK = threading.RLock()
_MODULES: dict[tuple[str, str], ModuleType] = {}


def import_file(path: Path, name: str) -> ModuleType:
    """Import the Python file `path` as module `name` (registered in sys.modules; removed again if
    its import raises, so a failed import leaves nothing half-initialised behind)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetUnavailable(f"cannot import {path}: not a Python source file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def import_with_env(path: Path, env: dict[str, str], name: str | None = None) -> ModuleType:
    """Import `path` as a fresh module with `env` set only while it imports (D1 is read then).

    Errors raised by the module's own import (e.g. ValueError for an illegal dtype env) pass
    through unchanged; the environment is restored whatever happens.
    """
    path = Path(path)
    digest = hashlib.sha1(f"{path.resolve()}|{sorted(env.items())}".encode()).hexdigest()[:12]
    name = name or f"_gdn_fuzz_target_{path.stem}_{digest}"
    with _LOCK:
        saved = {k: os.environ.get(k) for k in env}
        try:
            os.environ.update(env)
            return import_file(path, name)
        finally:
            for k, old in saved.items():
                if old is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = old


def check_fits(mod: ModuleType, arm: Arm, path: Path, entry: str = ENTRY) -> None:
    """Say clearly what is wrong when a module does not fit the contract (D3)."""
    where = f"{path} (arm {arm.name})"
    if not callable(getattr(mod, entry, None)):
        raise TargetMismatch(f"{where} defines no callable {entry}(); a target must expose the entry point")
    for const, want in (("RING_SLOTS", 32), ("W_RING", 16)):
        got = getattr(mod, const, None)
        if got != want:
            raise TargetMismatch(
                f"{where}: {const}={got!r}, expected {want}; gdn_fuzz models the 32-slot ring with a "
                "16-row window (contract D3). Older 16-slot ring kernels are not this contract.")
    for const, want in (("IO_TORCH", arm.io), ("ST_TORCH", arm.state), ("RING_TORCH", arm.ring)):
        got = getattr(mod, const, want)
        if got != want:
            raise TargetMismatch(
                f"{where}: {const}={got} but arm {arm.name} needs {want}; the module ignored "
                f"{', '.join(ENV_VARS)} at import")


def load_module(path: Path, arm: Arm | str, entry: str = ENTRY) -> ModuleType:
    """One module instance per (file, arm), imported with the arm's env vars scoped to the import."""
    arm = get_arm(arm) if isinstance(arm, str) else arm
    key = (str(Path(path).resolve()), arm.name)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            mod = import_with_env(Path(path), arm.env_dict)
            check_fits(mod, arm, Path(path), entry)
            _MODULES[key] = mod
        return mod


@dataclass
class Target:
    """A kernel implementation the checks run against.

    name: 'reference', 'production', 'sm100' or a file path; path: the file imported.
    `launch(arm, **kwargs)` calls the entry point of that arm's module instance.
    """

    name: str
    path: Path
    entry: str = ENTRY
    needs_cuda: bool = False
    min_sm: tuple[int, int] | None = None
    _compiles: dict = field(default_factory=dict)

    def module(self, arm: Arm | str) -> ModuleType:
        return load_module(self.path, arm, self.entry)

    def launch(self, arm: Arm | str, **kwargs):
        return getattr(self.module(arm), self.entry)(**kwargs)

    def compile_count(self, arm: Arm | str) -> int:
        """Entries in the module's JIT cache (_CACHE), 0 for modules without one."""
        return len(getattr(self.module(arm), "_CACHE", {}) or {})

    def unavailable_reason(self, device: str) -> str | None:
        """None when launches can run on `device`, else why not (in words)."""
        import torch

        if self.needs_cuda:
            if not str(device).startswith("cuda"):
                return f"target {self.name} launches only on CUDA devices (H15); got device={device!r}"
            if not torch.cuda.is_available():
                return f"target {self.name} needs a CUDA GPU and this machine has none"
            if self.min_sm is not None:
                cap = torch.cuda.get_device_capability(torch.device(device))
                if cap < self.min_sm:
                    return (f"target {self.name} needs SM{self.min_sm[0]}{self.min_sm[1]}+; "
                            f"{torch.cuda.get_device_name(torch.device(device))} is SM{cap[0]}{cap[1]}")
        return None

    def __str__(self) -> str:
        return self.name


def get_target(name: str) -> Target:
    """Resolve a target by name ('reference', 'production', 'sm100') or file path."""
    if name == "reference":
        return Target("reference", REFERENCE_PATH)
    if name == "production":
        return Target("production", resolve_production_path(), needs_cuda=True, min_sm=(9, 0))
    if name == "sm100":
        p = _module_file(SM100_MODULE)
        if p is None:
            raise TargetUnavailable(
                f"{SM100_MODULE} is not installed (it ships with FlashInfer >= 0.7.3, unreleased "
                "when gdn_fuzz 0.1 was written); the sm100 target also needs a B200-class GPU (SM100)")
        return Target("sm100", p, entry=SM100_ENTRY, needs_cuda=True, min_sm=(10, 0))
    if name.startswith("mutant:"):
        from ..mutants import base_path, get_mutant, materialize_mutant

        m = get_mutant(name.split(":", 1)[1])
        base_is_prod = m.base == "production"
        base_path(m)  # raises TargetUnavailable when the production file is absent
        return Target(name, materialize_mutant(m), needs_cuda=base_is_prod, min_sm=(9, 0) if base_is_prod else None)
    p = Path(name).expanduser()
    if p.suffix == ".py" and p.is_file():
        return Target(str(p), p.resolve(), needs_cuda=False)
    raise ValueError(
        f"target={name!r} is neither 'reference', 'production', 'sm100', 'mutant:NAME' nor an existing .py file; "
        "pass one of those names or a path to a module defining " + ENTRY)


def default_target_name() -> str:
    """'production' when a CUDA GPU of SM90+ and the production module are present, else 'reference'."""
    import torch

    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
        try:
            resolve_production_path()
            return "production"
        except TargetUnavailable:
            pass
    return "reference"
