"""Loading a target file: one module instance per (file, dtype arm), and where the built-in targets live.

gdn_fuzz.targets (Target, get_target) and gdn_fuzz.targets.mutants both build on this module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

from gdn_fuzz.arms import ENV_VARS, Arm, get_arm
from gdn_fuzz.targets import kernel_store

ENTRY = "gated_delta_rule_mtp_ucache_flush"
PRODUCTION_MODULE = "flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache_flush"
SM100_MODULE = "flashinfer.gdn_kernels.gdn_replay_mtp_umma"
SM100_ENTRY = "gated_delta_rule_mtp_ucache_flush_umma"
KERNEL_MODULE_ENV = "GDN_FUZZ_KERNEL_MODULE"
REFERENCE_PATH = Path(__file__).with_name("reference_ucache_flush.py")
# the prefix materializer (flashinfer-python 0.7.4): a module of the flashinfer.gdn_kernels package whose
# relative imports bind it to the package's flush module, and so to that module's dtype arm (PMD3)
PM_ENTRY = "gdn_prefix_materialize"
PM_PACKAGE = "flashinfer.gdn_kernels"
PM_MODULE = PM_PACKAGE + ".gdn_prefix_materialize"
MATERIALIZE_MODULE_ENV = "GDN_FUZZ_MATERIALIZE_MODULE"
PM_REFERENCE_PATH = Path(__file__).with_name("reference_prefix_materialize.py")


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


def _resolve(env_var: str, module: str, entry: str, install_hint: str) -> Path:
    """$env_var if set (a file defining `entry`: a user's or an edited copy), else the installed `module`'s file."""
    env = os.environ.get(env_var, "").strip()
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise TargetUnavailable(f"{env_var}={env!r} is not a file; point it at a .py file that defines {entry}")
        return p.resolve()
    p = _module_file(module)
    if p is None:
        raise TargetUnavailable(f"{module} is not installed; {install_hint} or set {env_var}=/path/to/file.py")
    return p


def resolve_production_path() -> Path:
    """$GDN_FUZZ_KERNEL_MODULE if set, else the installed FlashInfer module's file."""
    return _resolve(KERNEL_MODULE_ENV, PRODUCTION_MODULE, ENTRY,
                    "`pip install 'gdn-fuzz[gpu]'` (flashinfer-python==0.7.4)")


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


def resolve_materialize_path() -> Path:
    """$GDN_FUZZ_MATERIALIZE_MODULE if set (an edited copy of gdn_prefix_materialize.py), else the installed file."""
    return _resolve(MATERIALIZE_MODULE_ENV, PM_MODULE, PM_ENTRY, "it ships with flashinfer-python 0.7.4: "
                    "`pip install 'gdn-fuzz[gpu]'` (or [kernel-cpu] for its host checks)")


def package_relative(path: Path) -> bool:
    """The file imports from its own package (`from .x import ...`): it must be loaded inside
    flashinfer.gdn_kernels (PMD3: by path alone 'attempted relative import with no known parent package')."""
    try:
        text = Path(path).read_text()
    except OSError:
        return False
    return "\nfrom ." in text


def import_in_package(path: Path, arm: Arm) -> ModuleType:
    """Import `path` as a module of flashinfer.gdn_kernels bound to `arm`: while it imports, the package's
    flush module is this process's instance of that file for `arm` (load_module), so the relative import of
    io, ring_ty and state_ty (PF 121-150) gives this arm's dtypes, and the env of the arm is set.  Each arm gets
    its own module state; the package's own copy (what vLLM imports) is left as it is."""
    import importlib

    try:
        importlib.import_module(PM_PACKAGE)
    except ImportError as e:
        raise TargetUnavailable(f"{path} imports from {PM_PACKAGE}, which does not import here ({e}); install "
                                "flashinfer-python 0.7.4 (`pip install 'gdn-fuzz[gpu]'`)") from e
    flush = _module_file(PRODUCTION_MODULE)
    if flush is None:
        raise TargetUnavailable(f"{PRODUCTION_MODULE} is not installed beside {PM_PACKAGE}")
    fmod = load_module(flush, arm)
    digest = hashlib.sha1(f"{Path(path).resolve()}|{arm.name}".encode()).hexdigest()[:12]
    name = f"{PM_PACKAGE}._gdn_fuzz_{Path(path).stem}_{digest}"
    with _LOCK:
        saved = sys.modules.get(PRODUCTION_MODULE)
        sys.modules[PRODUCTION_MODULE] = fmod
        try:
            return import_with_env(Path(path), arm.env_dict, name=name)
        finally:
            if saved is None:
                sys.modules.pop(PRODUCTION_MODULE, None)
            else:
                sys.modules[PRODUCTION_MODULE] = saved


def check_fits_materialize(mod: ModuleType, arm: Arm, path: Path) -> None:
    """A materializer module exposes gdn_prefix_materialize, the 16-row window, and the arm's STATE and RING
    dtypes (state_ty_torch()/ring_ty_torch() of FlashInfer's file, ST_TORCH/RING_TORCH of the reference)."""
    where = f"{path} (arm {arm.name})"
    if not callable(getattr(mod, PM_ENTRY, None)):
        raise TargetMismatch(f"{where} defines no callable {PM_ENTRY}(); a materializer target must expose it")
    if getattr(mod, "W_RING", None) != 16:
        raise TargetMismatch(f"{where}: W_RING={getattr(mod, 'W_RING', None)!r}, expected 16 (PMS1)")
    for fn, const, want in (("state_ty_torch", "ST_TORCH", arm.state), ("ring_ty_torch", "RING_TORCH", arm.ring)):
        got = getattr(mod, fn)() if callable(getattr(mod, fn, None)) else getattr(mod, const, want)
        if got != want:
            raise TargetMismatch(f"{where}: its {const} is {got} but arm {arm.name} needs {want}; the module was bound "
                                 f"to another arm's flush module (PMD3) or ignored {', '.join(ENV_VARS)}")


_RESOLVED: dict = {}


def _resolved(path) -> str:
    """str(Path(path).resolve()), remembered per path as given: every launch asks for its module, and resolving
    is a few file-system calls (~80 us, measured on the CPU machine: a share of an isolated check's host time)."""
    got = _RESOLVED.get(path)
    if got is None:
        got = _RESOLVED[path] = str(Path(path).resolve())
    return got


def load_module(path: Path, arm: Arm | str, entry: str = ENTRY) -> ModuleType:
    """One module instance per (file, arm), imported with the arm's env vars scoped to the import.

    A module that compiles with the CuTe DSL gets a disk-backed kernel store in place of its
    `_CACHE` dict (gdn_fuzz.targets.kernel_store; GDN_FUZZ_KERNEL_STORE=off keeps it in memory)."""
    arm = get_arm(arm) if isinstance(arm, str) else arm
    key = (_resolved(path), arm.name)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            if entry == PM_ENTRY:  # the materializer: no kernel store (its compile key holds the device target)
                mod = import_in_package(Path(path), arm) if package_relative(path) else \
                    import_with_env(Path(path), arm.env_dict)
                check_fits_materialize(mod, arm, Path(path))
            else:
                mod = import_with_env(Path(path), arm.env_dict)
                check_fits(mod, arm, Path(path), entry)
                kernel_store.install(mod, Path(path), arm.name)
            _MODULES[key] = mod
        return mod
