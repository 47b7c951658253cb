"""Host checks of every release (H1-H22) and import-time dtype selection (D1, D2), by release model.

How this file tests
-------------------
Each target is held to the host-check model of its release (gdn_fuzz.targets.releases: detected from
its file, or given): which checks run in which order, the exception type of each, whether its
message names the argument it rejects.  The targets: ``reference`` (this package's torch mirror,
modelled as 0.7.4), ``production`` (the installed FlashInfer module), ``production@VERSION`` for
every other modelled release whose file is here (0.7.2.post1 after ``gdn-fuzz release fetch
0.7.2.post1``; skipped with that reason otherwise), ``sm100`` (0.7.4's UMMA entry point, its own
model) and the target the user selected (``--gdn-target``), each once.

Every call starts from one *valid* call (``hostchecks.base_call``: K = V = 128, H = 1, HV = 2,
B = 2, pool = 3, T = 4) and applies *changes* (``hostchecks.CHANGES``: an argument set to None,
given the wrong dtype, shape or strides, a flag, a new keyword with a legal or illegal value).
``hostchecks.expect`` walks the release's checks in order and says which fires first: one that
catches a change, or an environment check that fires for this call whatever its arguments (the
device probe on CPU tensors, the capture probe on a CPU build of torch: on this machine they are
real, and the model says where each release puts them).  The test then asserts, by clause:

1. the exception type of that check (or that the call passes every host check);
2. that the message names the rejected argument where the model says the check's message does
   (a bare ``assert`` names nothing): never a message's wording;
3. that a rejected call left every input tensor bitwise unchanged.

Single changes are tried on every arm they apply to (of those ``--gdn-arms`` selects; all by default),
and for an entry that takes ``backend``,
also with ``backend="hmma"``: on a CPU that is how 0.7.4's H13, H14, H21 and H22 are reached (with
"auto" its device probe, H19, comes first).  Hypothesis draws sets of two to four changes and a
variant, so the *order* of the checks is tested, not just each check alone.

A target whose model is not an exact match (an edited or newer release, a user's file) runs with
the model the detection chose; a single change that behaves otherwise there is a contract change:
each such test skips naming it, and ``test_contract_changes`` fails once with the whole table
(clause, change, what the model says, what the target did) instead of a wall of failures.
"""

from __future__ import annotations

import contextlib
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_fuzz.arms import ARM_NAMES, ARMS, ENV_VARS
from gdn_fuzz.properties import hostchecks as hc
from gdn_fuzz.targets import Target, TargetMismatch, TargetUnavailable, get_target, import_with_env, releases

ENTRY = "gated_delta_rule_mtp_ucache_flush"
ARM0 = "bf16"
W_RING = 16

HYP = settings(max_examples=20, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- targets

_LOADED: dict[str, Target | str] = {}


def other_releases() -> list[str]:
    """production@VERSION for every modelled release other than the installed one."""
    inst = releases.installed_version()
    return [f"production@{v}" for v in releases.RELEASES if v != inst]


def _load(name: str) -> Target:
    """The target with a module of its first legal arm imported, or a skip saying why it cannot run here."""
    if name not in _LOADED:
        try:
            t = get_target(name)
            t.module(t.release.release.entry(t.model_entry).arms[0])
            _LOADED[name] = t
        except (TargetUnavailable, TargetMismatch, ImportError) as e:
            _LOADED[name] = f"target {name!r} is not importable here ({type(e).__name__}: {e})"
    got = _LOADED[name]
    if isinstance(got, str):
        pytest.skip(got)
    return got


def _target_id(name: str) -> str:
    return os.path.basename(name) if name.endswith(".py") else name


def _names(config) -> list[str]:
    from gdn_fuzz.pytest_plugin import _selection

    selected = _selection(config)[0]
    return list(dict.fromkeys(["reference", "production", *other_releases(), "sm100", selected]))


def pytest_generate_tests(metafunc):
    """`target`: reference, production, production@VERSION (other releases), sm100 and the selected
    target, each once (parametrization happens at collection, before any fixture can run)."""
    if "target" not in metafunc.fixturenames:
        return
    names = _names(metafunc.config)
    if metafunc.definition.get_closest_marker("flush_entry"):
        names = [n for n in names if n != "sm100"]
    params = [pytest.param(n, id=_target_id(n), marks=[pytest.mark.kernel_module] if n != "reference" else [])
              for n in names]
    metafunc.parametrize("target", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def target(request) -> Target:
    return _load(request.param)


def entry_of(target: Target) -> releases.EntryModel:
    return target.release.release.entry(target.model_entry)


def variants(target: Target) -> list[dict]:
    """{} and, where the entry takes `backend`, backend='hmma' (skips 0.7.4's early device probe)."""
    return [{}] + ([{"backend": "hmma"}] if "backend" in entry_of(target).params else [])


def run_probe(target: Target, arm: str, changes, extra=None) -> hc.Probe:
    mod = target.module(arm)
    return hc.probe(getattr(mod, target.entry), mod, target.release.release, target.model_entry, arm, changes,
                    extra=extra)


def _verdict(target: Target, pr: hc.Probe) -> str | None:
    if pr.inputs_changed:
        return f"a rejected call modified its inputs {', '.join(pr.inputs_changed)}"
    return pr.problem


# --------------------------------------------------------------------------- the model of each target

def test_release_model_detected(target):
    """Each target's release model: the installed and fetched FlashInfer files by their sha256 (exact), the
    reference by its declaration, sm100 by its file; the model has the target's entry point."""
    got = target.release
    assert target.model_entry in got.release.entries
    if target.name in ("reference", "sm100") or target.name.startswith("production"):
        assert got.exact, got
    if target.name.startswith("production@"):
        assert got.release.version == target.name.split("@", 1)[1]
    if target.name == "reference":
        assert got.release.version == "0.7.4" and "declares" in got.how


def _change_params():
    """One test per change (every arm it applies to, every variant, inside the test)."""
    return [pytest.param(c, id=c.id) for c in hc.CHANGES.values()]


@pytest.mark.parametrize("change", _change_params())
def test_single_change(target, change, gdn_selection):
    """The call with one change raises the type of the first check the release model says fires (or
    passes every host check), names the argument where the check's message does, and leaves its inputs
    unchanged; on every arm the change applies to, with and without backend='hmma'."""
    em = entry_of(target)
    if not set(change.arms) & set(em.arms):
        pytest.skip(f"{change.id} applies to arms {', '.join(change.arms)}; the {em.name} entry serves "
                    f"{', '.join(em.arms)}")
    try:
        hc.catch(em, change)
    except hc.NotModelled as e:
        pytest.skip(str(e))
    problems = []
    for arm, extra in hc.single_calls(em, change, variants(target), gdn_selection[1]):
        why = _verdict(target, run_probe(target, arm, [change], extra))
        if why:
            problems.append(f"{arm} {extra or ''}: {why}")
    if problems and not target.release.exact:
        pytest.skip(f"contract change against the {target.release} model (test_contract_changes tabulates them): "
                    + problems[0])
    assert not problems, f"{target.name} ({target.release}), change {change.id}:\n" + "\n".join(problems)


@st.composite
def change_sets(draw, em: releases.EntryModel):
    arm = draw(st.sampled_from(em.arms), label="arm")
    pool = hc.changes_for(em, arm)
    chosen = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=4, unique_by=lambda c: c.id)
                  .filter(hc.compatible), label="changes")
    return arm, chosen


@HYP
@given(data=st.data())
def test_first_check_in_release_order(target, data):
    """Order: for two to four changes at once (and a drawn variant), the check that fires is the first of
    theirs, or of the environment's, in the release's order; same type, names its argument, inputs kept."""
    em = entry_of(target)
    arm, chosen = data.draw(change_sets(em))
    extra = data.draw(st.sampled_from(variants(target)), label="variant")
    if extra and any(set(extra) & set(c.touches) for c in chosen):
        extra = {}
    pr = run_probe(target, arm, chosen, extra)
    why = _verdict(target, pr)
    if why and not target.release.exact:
        pytest.skip(f"contract change against the {target.release} model: {why}")
    assert why is None, f"{target.name} ({target.release}) {arm} {extra} {[c.id for c in chosen]}: {why}"


def test_contract_changes(target, gdn_selection):
    """For a target whose model is not an exact match: every single change it handles otherwise than its
    model (on the selected arms, --gdn-arms), as one table (clause, change, the model, the target).  Exact
    models: test_single_change checks each change on its own."""
    if target.release.exact:
        pytest.skip(f"{target.name}: the {target.release} model is exact; test_single_change covers each change")
    table = hc.single_change_table(lambda arm: getattr(target.module(arm), target.entry), target.module,
                                   target.release.release, target.model_entry, arms=gdn_selection[1],
                                   extras=variants(target))
    rows: dict = {}
    for p in table:
        if not p.ok:
            clause = p.expected.check.clause if p.expected.check else "-"
            rows.setdefault((clause, p.changes[0]), (p.problem or f"inputs changed {p.inputs_changed}", []))[1].append(p.arm)
    assert not rows, (f"{target.name}: {len(rows)} host-check contract changes against the model "
                      f"{target.release}:\n" + "\n".join(
                          f"  [{clause}] {cid} (arms {', '.join(dict.fromkeys(arms))}): {why}"
                          for (clause, cid), (why, arms) in sorted(rows.items())))


@pytest.mark.gpu
def test_single_changes_on_cuda_tensors(target):
    """On a GPU, with CUDA tensors: every single change, on every arm and variant, raises what the release
    model says where the device probes pass (0.7.4's H13, H14, H16, H20, H21 and H22 are reached as on a
    serving machine), and the legal ones launch.  An illegal change the model lets through (an input the
    release does not validate) is not launched: it would run the kernel on garbage."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (CPU tensors: test_single_change)")
    if target.unavailable_reason("cuda"):
        pytest.skip(target.unavailable_reason("cuda"))
    em = entry_of(target)
    problems, n = [], 0
    for change in hc.changes_for(em):
        for arm, extra in hc.single_calls(em, change, variants(target)):
            mod = target.module(arm)
            if hc.unvalidated_on_device(mod, target.release.release, target.model_entry, arm, change, "cuda", extra):
                continue
            pr = hc.probe(getattr(mod, target.entry), mod, target.release.release, target.model_entry, arm,
                          [change], "cuda", extra)
            n += 1
            why = _verdict(target, pr)
            if why:
                problems.append(f"{change.id} {arm} {extra or ''}: {why}")
    torch.cuda.synchronize()
    assert n > 100 and not problems, f"{target.name} ({target.release}), {n} calls:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- what the model leaves unvalidated

@pytest.mark.flush_entry
def test_h11_ranges_unchecked_without_restart(target):
    """H11 (1.3): with restart_hist_on_flush=False the cursor values are never range checked: the call passes
    every host check (a target with a device probe stops there on CPU tensors)."""
    kw = hc.base_call(ARM0)
    kw["restart_hist_on_flush"] = False
    kw["hist_len"][:] = torch.tensor([40, -3], dtype=torch.int32)
    kw["cache_base"][:] = torch.tensor([-7, 1000], dtype=torch.int32)
    mod = target.module(ARM0)
    exp = hc.expect_for(target.release.release, target.model_entry, [], kw, ARM0, mod)
    assert exp.check is None or exp.check.when, exp.describe()  # nothing but an environment check
    obs = hc.observe_call(getattr(mod, target.entry), kw)
    assert hc.judge(exp, obs) is None, hc.judge(exp, obs)


@pytest.mark.flush_entry
@pytest.mark.parametrize("what", ["k-K=64", "hist_len-2D"])
def test_host_check_gaps(target, what):
    """H5/H10 gaps: k's last dim is never checked (only q's K is), and a [B, 1] hist_len passes H10 (only
    dtype and shape[0] are checked): the released module lets both through its host checks.  These are
    gaps (1.3 leaves both unvalidated), pinned for production and the reference only."""
    if not (target.name.startswith("production") or target.name == "reference"):
        pytest.skip(f"{what}: unvalidated by the contract (1.3); pinned for production and reference only")
    kw = hc.base_call(ARM0)
    if what == "k-K=64":
        kw["k"] = kw["k"][..., :64].contiguous()
    else:
        kw["hist_len"] = kw["hist_len"][:, None].contiguous()
    mod = target.module(ARM0)
    exp = hc.expect_for(target.release.release, "flush", [], kw, ARM0, mod)
    obs = hc.observe_call(getattr(mod, target.entry), kw)
    if exp.check is not None:  # production on CPU tensors: the device probe is the first check that fires
        assert hc.judge(exp, obs) is None, hc.judge(exp, obs)
    else:  # the reference's host checks pass too; it fails later, in its torch math
        assert obs.exc == "RuntimeError", obs.describe()


@pytest.mark.kernel_module
@HYP
@given(T=st.sampled_from([4, 8]), flush_min=st.none() | st.integers(-3, 20),
       hist=st.lists(st.integers(-3, 40), min_size=2, max_size=2),
       base=st.lists(st.integers(-40, 70), min_size=2, max_size=2),
       variant=st.sampled_from([{}, {"backend": "hmma"}]))
def test_unchecked_cursors_pass_the_host_checks(T, flush_min, hist, base, variant):
    """H14 and 1.3, for the installed release and the reference: over drawn flush_min and restart=False
    cursor values, the only host check that can refuse is H14 (flush_min outside [1, 17 - T]); otherwise
    the call passes every host check: production reaches its device probe, and the reference returns
    normally whatever the cursors (P outside [0, 16] is silently wrong by contract, never an exception)."""
    for name in ("production", "reference"):
        t = _load(name)
        kw = hc.with_T(hc.base_call(ARM0), T)
        kw.update(flush_min=flush_min, restart_hist_on_flush=False, **variant)
        kw["hist_len"][:] = torch.tensor(hist, dtype=torch.int32)
        kw["cache_base"][:] = torch.tensor(base, dtype=torch.int32)
        mod = t.module(ARM0)
        changes = [] if flush_min is None or 1 <= flush_min <= W_RING - T + 1 else [hc.get_change("flush_min=0")]
        exp = hc.expect_for(t.release.release, "flush", changes, kw, ARM0, mod)
        obs = hc.observe_call(getattr(mod, t.entry), kw)
        assert hc.judge(exp, obs) is None, f"{name} T={T} flush_min={flush_min} hist={hist} base={base}: " \
                                             f"{hc.judge(exp, obs)}"


# --------------------------------------------------------------------------- D1, D2

@contextlib.contextmanager
def _clean_dtype_env():
    """Remove the three GDN_UCACHE_*_DTYPE variables for the block, then restore them."""
    saved = {k: os.environ.pop(k) for k in ENV_VARS if k in os.environ}
    try:
        yield
    finally:
        for k in ENV_VARS:
            os.environ.pop(k, None)
        os.environ.update(saved)


IO_V, ST_V, RG_V = ENV_VARS
FP16_NAMES = ("fp16", "float16", "half")
BF16_NAMES = ("bf16", "bfloat16")


def d1_model(env: dict[str, str]):
    """D1 as the contract states it: (IO, STATE, RING) dtypes, or the name of the variable that
    raises.  Values are stripped and lower-cased; STATE/RING equality with IO is literal."""
    io_s = env.get(IO_V, "bf16").strip().lower()
    if io_s in FP16_NAMES:
        io = torch.float16
    elif io_s in BF16_NAMES:
        io = torch.bfloat16
    else:
        return IO_V
    got = [io]
    for var in (ST_V, RG_V):
        s = env.get(var, "").strip().lower()
        if s in ("", io_s):
            got.append(io)
        elif s in FP16_NAMES and io == torch.bfloat16:
            got.append(torch.float16)
        else:
            return var
    return tuple(got)


def _import(target: Target, env: dict[str, str]):
    with _clean_dtype_env():
        return import_with_env(target.path, env)


def _d1_outcome(target: Target, env: dict[str, str]):
    """(IO, STATE, RING) of the import, or ("ValueError", message)."""
    try:
        mod = _import(target, env)
    except ValueError as e:
        return ("ValueError", str(e))
    return (mod.IO_TORCH, mod.ST_TORCH, mod.RING_TORCH)


def _d1_expect(target: Target, env: dict[str, str]):
    """D1 by clause: ValueError at import whose message names the offending variable, or the dtypes."""
    want = d1_model(env)
    got = _d1_outcome(target, env)
    if isinstance(want, str):
        assert got[0] == "ValueError", f"{env}: expected ValueError naming {want}, imported with {got}"
        assert hc.names_argument(got[1], want), f"{env}: the D1 message does not name {want}: {got[1]!r}"
    else:
        assert got == want, f"{env}: {got}"
    return got


BF, FP = torch.bfloat16, torch.float16
D1_CASES = [
    pytest.param({IO_V: "fp32"}, IO_V, id="IO=fp32"),
    pytest.param({IO_V: ""}, IO_V, id="IO=empty-string"),  # set-but-empty is not the default
    pytest.param({ST_V: "bfloat16"}, ST_V, id="STATE=bfloat16,IO-unset"),  # literal: unset IO is 'bf16'
    pytest.param({IO_V: "bfloat16", ST_V: "bf16"}, ST_V, id="IO=bfloat16,STATE=bf16"),
    pytest.param({IO_V: "half", ST_V: "fp16"}, ST_V, id="IO=half,STATE=fp16"),
    pytest.param({IO_V: "fp16", ST_V: "bf16"}, ST_V, id="IO=fp16,STATE=bf16"),
    pytest.param({ST_V: "fp32"}, ST_V, id="STATE=fp32"),
    pytest.param({IO_V: "float16", RG_V: "fp16"}, RG_V, id="IO=float16,RING=fp16"),
    pytest.param({IO_V: "fp16", RG_V: "bf16"}, RG_V, id="IO=fp16,RING=bf16"),
    pytest.param({RG_V: "fp32"}, RG_V, id="RING=fp32"),
    # legal spellings (the code, not a guess): RING=fp16 with IO=fp16 is the same literal
    pytest.param({IO_V: "fp16", RG_V: "fp16"}, (FP, FP, FP), id="IO=fp16,RING=fp16-legal"),
    pytest.param({IO_V: " BF16 "}, (BF, BF, BF), id="IO=' BF16 '-legal"),
    pytest.param({IO_V: "Half", ST_V: "HALF", RG_V: " half"}, (FP, FP, FP), id="IO=Half,STATE=HALF-legal"),
    pytest.param({ST_V: "Float16", RG_V: "half"}, (BF, FP, FP), id="STATE=Float16,RING=half-legal"),
    pytest.param({IO_V: "bf16", ST_V: "bf16", RG_V: ""}, (BF, BF, BF), id="all-bf16-legal"),
]


@pytest.mark.flush_entry
@pytest.mark.parametrize("env,want", D1_CASES)
def test_d1_import_env(target, env, want):
    """D1: the dtype variables are read at import, stripped and lower-cased; anything outside the
    legal set (with a literal equality test for STATE/RING = IO) raises ValueError at import."""
    assert d1_model(env) == want  # the table states what the contract says
    _d1_expect(target, env)


@pytest.mark.flush_entry
def test_d1_env_read_only_at_import(target):
    """D1: import_with_env restores the environment, and a module keeps the dtypes of its import."""
    with _clean_dtype_env():
        os.environ[IO_V] = "bf16"
        mod = import_with_env(target.path, {IO_V: "fp16"})
        assert os.environ[IO_V] == "bf16"
        os.environ[IO_V] = "bf16"  # changing the env afterwards does not change the module
        assert mod.IO_TORCH == torch.float16


_SPELLINGS = st.none() | st.sampled_from(
    ["", "bf16", "bfloat16", "BF16", " bf16 ", "fp16", "float16", "half", "HALF", " Fp16", "fp32", "float32", "bf 16"])


@pytest.mark.flush_entry
@HYP
@given(io=_SPELLINGS, state=_SPELLINGS, ring=_SPELLINGS)
def test_d1_env_spellings(target, io, state, ring):
    """D1: for drawn spellings of the three variables (None = unset) the import raises or selects
    dtypes exactly as the contract's rule says."""
    env = {k: v for k, v in ((IO_V, io), (ST_V, state), (RG_V, ring)) if v is not None}
    _d1_expect(target, env)


@pytest.mark.kernel_module
@HYP
@given(io=_SPELLINGS, state=_SPELLINGS, ring=_SPELLINGS)
def test_d1_differential_import(io, state, ring):
    """D1: the reference and production select the same dtypes at import, or both raise ValueError naming
    the same variable, for the same environment."""
    env = {k: v for k, v in ((IO_V, io), (ST_V, state), (RG_V, ring)) if v is not None}
    res = []
    for t in (_load("reference"), _load("production")):
        got = _d1_outcome(t, env)
        res.append(("ValueError", [v for v in ENV_VARS if hc.names_argument(got[1], v)]) if got[0] == "ValueError"
                   else got)
    assert res[0] == res[1]


@pytest.mark.flush_entry
@pytest.mark.parametrize("arm", ARM_NAMES)
def test_d2_legal_arms_import(target, arm):
    """D2/D3: each of the five legal arms imports (through its exact env values) with IO_TORCH,
    ST_TORCH and RING_TORCH equal to the arm's dtypes, and the ring constants of the contract."""
    a = ARMS[arm]
    mod = _import(target, a.env_dict)
    assert (mod.IO_TORCH, mod.ST_TORCH, mod.RING_TORCH) == (a.io, a.state, a.ring)
    assert (mod.W_RING, mod.RING_SLOTS, mod.RING_MASK, mod.K_DIM, mod.V_DIM_C) == (16, 32, 31, 128, 128)
    assert callable(getattr(mod, ENTRY))
