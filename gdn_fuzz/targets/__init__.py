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
              (on an SM100 GPU, flashinfer-python 0.7.4 routes eligible calls to its UMMA backend, H19)
  production@VERSION  that release's file of the same module, installed or fetched
              (`gdn-fuzz release fetch VERSION`; gdn_fuzz.targets.releases.release_file)
  sm100       the UMMA entry point flashinfer.gdn_kernels.gdn_replay_mtp_umma.gated_delta_rule_mtp_ucache_flush_umma
              (flashinfer-python 0.7.4; launches on SM100-class GPUs only; fp16-state arm)
  materialize FlashInfer 0.7.4's prefix materializer gdn_prefix_materialize (PM*): $GDN_FUZZ_MATERIALIZE_MODULE
              (an edited copy: its relative imports resolve against the installed flashinfer.gdn_kernels), else
              the installed flashinfer.gdn_kernels.gdn_prefix_materialize; one module state per dtype arm (PMD3)
  materialize-reference  the torch implementation of the materializer in this package (CPU or CUDA)
  mutant:NAME a catalogued bug (gdn_fuzz.targets.mutants) applied to a temporary copy of its base
Any other value is taken as a path to a Python file (a user's kernel, an older version,
a patched copy); a file that defines gdn_prefix_materialize (and not the flush entry point) is a
materializer target.

Each target has a release model (Target.release: gdn_fuzz.targets.releases.detect, or the release
given by get_target(name, release=...)): the host checks it is held to, its backends and the known
bugs of each backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from gdn_fuzz.arms import Arm
from gdn_fuzz.targets.loading import (  # noqa: F401  (re-exported: the public names of targets)
    ENTRY,
    MATERIALIZE_MODULE_ENV,
    PM_ENTRY,
    PM_MODULE,
    PM_REFERENCE_PATH,
    PRODUCTION_MODULE,
    KERNEL_MODULE_ENV,
    REFERENCE_PATH,
    SM100_MODULE,
    SM100_ENTRY,
    TargetUnavailable,
    TargetMismatch,
    _module_file,
    resolve_production_path,
    resolve_materialize_path,
    import_file,
    import_with_env,
    check_fits,
    load_module,
    package_relative,
)
from gdn_fuzz.targets import kernel_store
from gdn_fuzz.targets import releases
from gdn_fuzz.targets.mutants import base_path, get_mutant, materialize_mutant

__all__ = ["Target", "get_target", "kernel_of", "default_target_name", "TargetUnavailable", "TargetMismatch", "ENTRY", "PM_ENTRY",
           "PM_MODULE", "MATERIALIZE_MODULE_ENV", "PM_REFERENCE_PATH", "resolve_materialize_path",
           "PRODUCTION_MODULE", "KERNEL_MODULE_ENV", "REFERENCE_PATH", "SM100_MODULE", "SM100_ENTRY",
           "resolve_production_path", "import_file", "import_with_env", "check_fits", "load_module"]


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
    model_entry: str = "flush"  # the release model's entry point this target runs ("flush" | "umma")
    base: Path | None = None  # the file a mutant was made from: the release model is that file's
    release_override: str | None = None  # a release version that models this target (else detected)
    released: bool = False  # FlashInfer's own code (production, production@V, sm100): its known bugs apply
    _detected: releases.Detected | None = field(default=None, repr=False, compare=False)

    @property
    def release(self) -> releases.Detected:
        """The release model of this target (detected once; releases.detect)."""
        if self._detected is None:
            if self.release_override:
                self._detected = releases.Detected(releases.get_release(self.release_override),
                                                   f"chosen for target {self.name} (get_target(release=...))", True)
            else:
                self._detected = releases.detect(self.path, self.model_entry, base=self.base)
        return self._detected

    def backend_for_case(self, case, device=None) -> str | None:
        """backend_for of a drawn case of either kernel (a materializer's case has no T: one kernel, no routing)."""
        if self.kernel == "materialize":
            return "materialize" if self.released else None
        return self.backend_for(case.arm, case.T, case.H, case.HV, device)

    def backend_for(self, arm: str, T: int, H: int, HV: int, device=None) -> str | None:
        """The backend a launch of this shape (contiguous pools, no pdl_trigger: what a drawn Case is) runs on
        (H19): 'umma' for the sm100 target; for the released flush kernel 'umma' where an SM100-class GPU and
        the release's UMMA backend serve it, else 'hmma'; None for targets that are not FlashInfer's code."""
        if not self.released:
            return None
        if self.model_entry == "umma":
            return "umma"
        rel = self.release.release
        if self.model_entry == "materialize":
            return "materialize"  # one kernel, no backends to route between: its known bugs are filed under it
        if not any(b.name != "hmma" and b.serves(arm, T, H, HV, m) for b in rel.backends for m in b.sm_major):
            return "hmma"  # no other backend serves this shape on any GPU: no need to ask which GPU this is
        major = releases.gpu_major(device)
        for b in rel.backends:
            if b.serves(arm, T, H, HV, major):
                return b.name
        return "hmma"

    @property
    def kernel(self) -> str:
        """Which kernel's contract the target is held to: "flush" (the decode step) or "materialize" (PM*)."""
        return "materialize" if self.entry == PM_ENTRY else "flush"

    def module(self, arm: Arm | str) -> ModuleType:
        return load_module(self.path, arm, self.entry)

    def launch(self, arm: Arm | str, **kwargs):
        mod = self.module(arm)
        try:
            return getattr(mod, self.entry)(**kwargs)
        finally:  # a compile that raised inside the call must not keep other processes waiting on its lock
            kernel_store.release_held(mod)

    def compile_count(self, arm: Arm | str) -> int:
        """Kernels the module compiled in this process (its JIT cache _CACHE, less the kernels read
        from the kernel store: gdn_fuzz.targets.kernel_store); 0 for modules without one."""
        return kernel_store.compiles(self.module(arm))

    def store_loads(self, arm: Arm | str) -> int:
        """Kernels the module read from the kernel store in this process."""
        return kernel_store.loads(self.module(arm))

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


def get_target(name: str, release: str | None = None) -> Target:
    """Resolve a target by name ('reference', 'production', 'production@VERSION', 'sm100', 'mutant:NAME') or
    file path; `release` (a modelled version) overrides the detected release model."""
    if release is not None:
        releases.get_release(release)  # ValueError naming the modelled releases
    t = _get_target(name)
    t.release_override = release
    t._detected = None
    return t


def _get_target(name: str) -> Target:
    if name == "reference":
        return Target("reference", REFERENCE_PATH)
    if name == "production":
        return Target("production", resolve_production_path(), needs_cuda=True, min_sm=(9, 0), released=True)
    if name.startswith("production@"):
        version = name.split("@", 1)[1]
        releases.get_release(version)
        return Target(name, releases.release_file(version), needs_cuda=True, min_sm=(9, 0), released=True)
    if name == "sm100":
        p = _module_file(SM100_MODULE)
        if p is None:
            raise TargetUnavailable(
                f"{SM100_MODULE} is not installed (flashinfer-python 0.7.4 ships it: pip install 'gdn-fuzz[gpu]'); "
                "the sm100 target also needs an SM100-class GPU (B200) to launch")
        return Target("sm100", p, entry=SM100_ENTRY, needs_cuda=True, min_sm=(10, 0), model_entry="umma",
                      released=True)
    if name == "materialize":
        return Target("materialize", resolve_materialize_path(), entry=PM_ENTRY, needs_cuda=True, min_sm=(9, 0),
                      model_entry="materialize", released=True)
    if name == "materialize-reference":
        return Target("materialize-reference", PM_REFERENCE_PATH, entry=PM_ENTRY, model_entry="materialize")
    if name.startswith("mutant:"):
        m = get_mutant(name.split(":", 1)[1])
        on_gpu = m.base in ("production", "materialize")
        base = base_path(m)  # raises TargetUnavailable when the base file is absent
        pm = m.base in ("materialize", "materialize-reference")
        return Target(name, materialize_mutant(m), needs_cuda=on_gpu, min_sm=(9, 0) if on_gpu else None,
                      base=base, entry=PM_ENTRY if pm else ENTRY, model_entry="materialize" if pm else "flush")
    p = Path(name).expanduser()
    if p.suffix == ".py" and p.is_file():
        if defines(p, PM_ENTRY) and not defines(p, ENTRY):
            return Target(str(p), p.resolve(), entry=PM_ENTRY, model_entry="materialize",
                          needs_cuda=package_relative(p))
        return Target(str(p), p.resolve(), needs_cuda=False)
    raise ValueError(
        f"target={name!r} is neither 'reference', 'production', 'production@VERSION', 'sm100', 'materialize', "
        "'materialize-reference', 'mutant:NAME' nor an existing .py file; pass one of those names or a path to a "
        f"module defining {ENTRY} or {PM_ENTRY}")


def kernel_of(name: str) -> str:
    """Target.kernel of the target `name` without loading it: "materialize" or "flush"."""
    if name in ("materialize", "materialize-reference"):
        return "materialize"
    if name.startswith("mutant:"):
        m = get_mutant(name.split(":", 1)[1])
        return "materialize" if m.base in ("materialize", "materialize-reference") else "flush"
    p = Path(name).expanduser()
    if p.suffix == ".py" and p.is_file() and defines(p, PM_ENTRY) and not defines(p, ENTRY):
        return "materialize"
    return "flush"


def defines(path: Path, function: str) -> bool:
    """The file defines `function` at module level (read with ast, nothing imported)."""
    return releases.function_params(path, function) is not None


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
