"""`gdn-fuzz doctor`: what this machine can run, and why not."""

from __future__ import annotations

import importlib.util
import platform
import subprocess
import sys

from gdn_fuzz.arms import ARMS
from gdn_fuzz.environment import dist_version
from gdn_fuzz.targets import PRODUCTION_MODULE, TargetMismatch, TargetUnavailable, get_target, releases


_version = dist_version  # "not installed" where it is not


def report() -> str:
    import torch

    installed = releases.installed_version()
    lines = [f"python {platform.python_version()}  torch {torch.__version__}  "
             f"flashinfer-python {_version('flashinfer-python')}  nvidia-cutlass-dsl {_version('nvidia-cutlass-dsl')}  "
             f"hypothesis {_version('hypothesis')}"]
    majors = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            majors.append(cap[0])
            lines.append(f"GPU {i}: {torch.cuda.get_device_name(i)} SM{cap[0]}{cap[1]}")
    else:
        lines.append("GPU: none (torch.cuda.is_available() is False)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lines += _releases(installed)
    names = ["reference", "production", *[f"production@{v}" for v in releases.RELEASES if v != installed], "sm100"]
    for name in names:
        try:
            t = get_target(name)
        except (TargetUnavailable, ValueError) as e:
            lines.append(f"target {name}: unavailable: {e}")
            continue
        legal = t.release.release.entry(t.model_entry).arms
        arms_ok, arms_bad = _import_arms(t, legal)
        why = t.unavailable_reason(device)
        lines.append(f"target {name}: {t.path}")
        lines.append(f"  release model: {t.release}")
        lines.append(f"  entry point: {t.entry} (arms it serves: {', '.join(legal)})")
        lines.append(f"  arms that import: {', '.join(arms_ok) or 'none'}")
        for b in arms_bad:
            lines.append(f"  arm fails to import: {b}")
        lines.append(f"  launches on {device}: " + ("yes" if why is None else f"no: {why}"))
        if t.released and t.model_entry == "flush":
            for b in t.release.release.backends:
                here = [m for m in majors if m in b.sm_major]
                lines.append(f"  backend {b.name}: arms {', '.join(b.arms)}, T {_span(b.Ts)}"
                             + (f", HV/H {b.heads_per_key[0]}-{b.heads_per_key[1]}" if b.heads_per_key else "")
                             + ("" if b.pdl else ", no pdl_trigger")
                             + f"; GPU majors {', '.join(map(str, b.sm_major))}: "
                               + ("this machine has one" if here else "none on this machine"))
        if why is not None and arms_ok and t.released:
            lines.append("  host checks run here: tests/test_host_checks.py (this release's model), "
                         "tests/test_sm100.py (UMMA routing on an SM100 stand-in)")
    lines += _siblings(device)
    lines += _materializer(installed)
    ray = _version("ray")
    lines.append("fleets: --processes N / --gpus here; --ray: " + (
        f"ray {ray} installed (a cluster: `ray start --head`, then --ray auto; docs/fleet.md)" if ray != "not installed"
        else "ray not installed (pip install 'gdn-fuzz[cluster]')"))
    return "\n".join(lines)


def _import_arms(t, arms) -> tuple[list[str], list[str]]:
    """(arms whose module imports, "arm (Error: message)" of those that fail) for target t."""
    ok, bad = [], []
    for arm in arms:
        try:
            t.module(arm)
            ok.append(arm)
        except (TargetMismatch, TargetUnavailable, ImportError, ValueError, RuntimeError) as e:
            bad.append(f"{arm} ({type(e).__name__}: {e})")
    return ok, bad


def _span(Ts) -> str:
    Ts = sorted(Ts)
    return f"{Ts[0]}-{Ts[-1]}" if len(Ts) > 2 and Ts == list(range(Ts[0], Ts[-1] + 1)) else ", ".join(map(str, Ts))


def _releases(installed: str | None) -> list[str]:
    """The modelled releases, which is installed, where the others' files are (gdn-fuzz release fetch)."""
    out = [f"release models: {', '.join(releases.RELEASES)} (default {releases.DEFAULT.version}); installed: "
           f"{installed or 'none'}" + ("" if installed is None or installed in releases.RELEASES else
                                       f" (no model: modelled as {releases.NEWEST.version}, `gdn-fuzz diff "
                                       f"{releases.NEWEST.version} production`)")]
    for v in releases.RELEASES:
        if v == installed:
            continue
        try:
            out.append(f"  {v}: {releases.release_file(v)} (target production@{v})")
        except (TargetUnavailable, releases.ReleaseFileError) as e:
            out.append(f"  {v}: not here ({str(e).split(';')[-1].strip()})")
    return out


MATERIALIZE = "flashinfer.gdn_kernels.gdn_prefix_materialize"


def _materializer(installed: str | None) -> list[str]:
    """0.7.4's prefix materializer: whether it is installed, the one arm the package copy has with this environment
    (that of the package's copy of the flush module at its first import, PMD3), where it launches, and the
    targets that drive it with the arms each imports (one module state per arm: gdn_fuzz.targets.loading)."""
    p = releases.installed_file("gdn_prefix_materialize.py")
    out = [f"kernel {MATERIALIZE}.gdn_prefix_materialize (prefix cache, flashinfer-python 0.7.4): "
           + (f"installed ({p})" if p else "not installed")]
    if p:
        # a fresh process with this environment: what a server that imports FlashInfer now would get (this
        # process has imported the package's flush module already, under the first arm gdn_fuzz loaded)
        code = (f"import importlib, sys; importlib.import_module({MATERIALIZE!r}); "
                f"m = sys.modules[{PRODUCTION_MODULE!r}]; print(m.IO_TORCH, m.ST_TORCH, m.RING_TORCH)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        got = r.stdout.split()
        arm = next((a.name for a in ARMS.values() if [str(a.io), str(a.state), str(a.ring)] == got), None)
        if r.returncode == 0 and arm:
            out.append(f"  its arm with this environment: {arm} (that of the package's flush module at its first "
                       "import, from GDN_UCACHE_*_DTYPE then, PMD3: another arm needs another process)")
        else:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            out.append(f"  fails to import with this environment: {last}")
        out.append("  launches on an SM90+ GPU (no arch gate, PMS9)")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("materialize", "materialize-reference"):
        try:
            t = get_target(name)
        except (TargetUnavailable, ValueError) as e:
            out.append(f"  target {name}: unavailable: {e}")
            continue
        ok, bad = _import_arms(t, ARMS)
        why = t.unavailable_reason(device)
        out.append(f"  target {name}: {t.path}; arms that import (each its own module state): {', '.join(ok) or 'none'}"
                   + "".join(f"; fails: {b}" for b in bad))
        out.append(f"    launches on {device}: " + ("yes" if why is None else f"no: {why}"))
    out.append("  driven by gdn_fuzz: `gdn-fuzz run --target materialize`, `pytest --gdn-target materialize` "
               "(tests/test_materialize.py; on a CPU the host checks PMH1-PMH12 against the real module), the "
               "serving flow (tests/test_prefix_serving.py), `gdn-fuzz unguarded --target materialize`, "
               "`gdn-fuzz mutants --base materialize` (docs/materialize.md)")
    return out


SIBLING = "flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache"  # the verify-only kernel, same release


def _siblings(device: str) -> list[str]:
    """The kernels around the fused one (issue 18): the verify-only sibling and SGLang's Triton ReplaySSM
    files -- whether they are here, where they would run, and which of them gdn_fuzz drives today."""
    from gdn_fuzz.targets.triton_baseline import resolve_sglang_files, triton_missing_reason

    try:
        found = importlib.util.find_spec(SIBLING) is not None
    except (ImportError, ValueError):
        found = False
    out = [f"kernel {SIBLING}.gated_delta_rule_mtp_ucache (verify-only sibling: 16-slot ring, state read-only): "
           + ("installed" if found else "not installed (flashinfer-python 0.7.2.post1 and 0.7.4 ship it)"),
           "  launches on an SM90 GPU, like the production target; driven by gdn_fuzz: yes, by "
           "tests/test_verify_sibling.py (gdn_fuzz.properties.sibling: its launch vs a float64 oracle of its "
           "16-slot ring, and bitwise vs the fused kernel's verify rows at cache_base 0; GPU only, not a "
           "`gdn-fuzz run` property)"]
    try:
        where, folder = resolve_sglang_files()
        here = f"found ({where}: {folder or 'the installed sglang package'})"
    except TargetUnavailable as e:
        here = f"not found: {e}"
    no_triton = triton_missing_reason()
    runs = (f"no: {no_triton}" if no_triton else "on CUDA, or on the CPU in Triton's interpreter "
            "(TRITON_INTERPRET=1 set before the process starts)")
    out += [f"kernels of SGLang's Triton ReplaySSM baseline: {here}",
            f"  runs {runs}; this machine's device: {device}",
            "  gdn_replayssm_spec_decode, commit_gdn_replayssm_spec: driven (`gdn-fuzz triton`, docs/triton-baseline.md)",
            "  commit_gdn_replayssm_circular, commit_gdn_replayssm_spec(fold_every_commit=True) and "
            "commit_gdn_replayssm_fold_all_layers (gdn_replayssm_spec_fold.py): driven (`gdn-fuzz triton`, "
            "tests/test_triton_baseline.py)",
            "  commit_gdn_replayssm_fold_after_verify: not driven (it imports a module the released files lack)"]
    return out
