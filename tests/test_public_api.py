"""The public surface: a property of one's own, written with public names only.

The example below is the one the package docstring points to: ten lines, imports from
`gdn_fuzz` and `gdn_fuzz.oracles` only.  It checks M6 on its own: on verify rows the appended
g records continue the window's cumulative decay (G_P + Gamma_s), read back through the oracle.
It must pass on the reference target and find a planted bug (the catalogue's g_per_token, which
stores per-token g instead of the cumulative value).
"""

from __future__ import annotations

from hypothesis import HealthCheck, find, given, settings

import gdn_fuzz
from gdn_fuzz import cases, expectation, get_target, observe


def appended_g_ok(target, case) -> bool:
    """Example property (M6): every live row's appended g records equal the oracle's within 2^-16."""
    obs = observe(target, case)
    e = expectation(obs)
    idx = obs.before["initial_state_indices"].long().clamp(min=0)
    got = obs.after["g_cache"].permute(0, 2, 1)[idx[:, None].expand_as(e.slots), e.slots]  # [B, T, HV]
    err = (got.double() - e.g_app).abs() / e.g_mag.clamp_min(1e-30)
    return bool((err[~e.pad] <= 2.0**-16).all())


@settings(max_examples=20, deadline=None)
@given(cases(arms=("bf16",)))
def test_example_property_holds_on_the_reference(case):
    assert appended_g_ok(get_target("reference"), case)


def test_example_property_finds_a_planted_bug():
    bad = find(cases(arms=("bf16",)), lambda c: not appended_g_ok(get_target("mutant:g_per_token"), c),
               settings=settings(max_examples=200, deadline=None, database=None,
                                 suppress_health_check=list(HealthCheck)))
    assert any(not r.pad for r in bad.rows)


def test_public_names_resolve_and_import_changes_nothing():
    """Every name in __all__ resolves; importing gdn_fuzz, its public names and then every module of the
    package (plugin, CLI, studies, serving included) in a fresh process leaves Hypothesis' profile,
    torch's thread count and the environment (CUDA_VISIBLE_DEVICES in an xdist worker too) as they were,
    and CUDA uninitialized (a driver that forks campaign workers after CUDA started hands them a broken
    context: the H200 showed it when an import asked torch.cuda.is_current_stream_capturing())."""
    import os
    import subprocess
    import sys

    for name in gdn_fuzz.__all__:
        assert getattr(gdn_fuzz, name) is not None, name
    for mod in ("gdn_fuzz.strategies", "gdn_fuzz.oracles"):
        m = __import__(mod, fromlist=["__all__"])
        assert all(hasattr(m, n) for n in m.__all__)
    show = ("import torch\nprint(hypothesis.settings.get_current_profile_name(), hypothesis.settings().max_examples, "
            "torch.get_num_threads(), os.environ.get('CUDA_VISIBLE_DEVICES'), torch.cuda.is_initialized())\n"
            "import json\nprint(json.dumps(dict(os.environ)).replace(' ', ''))")
    every = ("import pkgutil, importlib\nfor m in pkgutil.walk_packages(gdn_fuzz.__path__, 'gdn_fuzz.'):\n"
             "    if not m.name.endswith('__main__'):\n        importlib.import_module(m.name)\n")
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER")}

    def run(code, **extra):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env={**base, **extra})
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    # Hypothesis' own choice (it loads its built-in "ci" profile when $CI is set) is the baseline
    for extra in ({}, {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "0,1"}):
        plain = run("import os, hypothesis\n" + show, **extra)
        ours = run("import os, hypothesis, gdn_fuzz\n[getattr(gdn_fuzz, n) for n in gdn_fuzz.__all__]\n"
                   + every + show, **extra)
        assert ours == plain and plain[3] == extra.get("CUDA_VISIBLE_DEVICES", "None"), (extra, plain, ours)
