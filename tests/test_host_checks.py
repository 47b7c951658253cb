"""Host checks (H1-H16) and import-time dtype selection (D1, D2) of the entry point.

How this file tests
-------------------
Every test starts from one *valid* call: the keyword arguments that
``gdn_fuzz.case.materialize`` builds for a small case (K = V = 128, H = 1, HV = 2,
B = 2, pool = 3, T = 4 unless said otherwise).  It then breaks exactly one argument
(sets it to None, gives it the wrong dtype, shape, length or strides, or passes an
unsupported flag) and calls the entry point of a target.  For each broken call it
asserts three things:

1. the exception type the contract lists for that host check (section 1.2), and the
   clause: the contract fixes the type and the clause, not the wording.  A message that
   names a clause id in brackets (``[H9]``, ``[D1]``) must name the expected one;
2. the message, only for the released module (``production``: its wording is part of
   what we regression-test) and for our own ``reference`` mirror of it: a substring
   copied from the real FlashInfer module, so that the message names the broken
   argument.  Some checks are bare ``assert`` statements with no message at all: for
   those the production target must raise with an empty message (a bare assert does not
   tell the caller which argument was wrong: that is itself a finding).  Any other
   target (``--gdn-target PATH.py``, a mutant, sm100) is held to type and clause only;
   ``expect_guard`` applies that rule;
3. that the rejected call left every input tensor bitwise unchanged (each tensor is
   cloned before the call and compared bit for bit afterwards with
   ``gdn_fuzz.observation.same_bits``).

The tests run against the targets of the ``target`` fixture: ``reference`` (the torch
mirror in this package, always available), ``production`` (FlashInfer's CuTeDSL module)
and the target the user selected (``--gdn-target`` / GDN_FUZZ_TARGET, the name the
``gdn_selection`` fixture returns), without duplicates.  The production module imports on
a CPU-only machine (torch CPU build plus nvidia-cutlass-dsl) and its host checks run
before any launch, so they are tested for real here; a valid call then ends in ValueError
"GDN CuTe-DSL kernels require CUDA tensors" (H15).  Where a target cannot be imported
(flashinfer or cutlass missing, a module that does not fit), it is skipped with the
reason; it never fails for that.

Two things differ on CPU by design, and each test says what it expects per target.  A
target that applies H15 (one that launches only on CUDA: production, sm100, mutants of
production) is expected to behave as the production module does here:
* H11 range checks (hist_len in [0, 16], cache_base in [0, 32)) run only after
  ``torch.cuda.is_current_stream_capturing()``, which raises RuntimeError on a CPU-only
  torch build.  The production target therefore raises that RuntimeError there; on a
  CUDA build of torch it raises the range AssertionError, as the reference does.
* H16 (block-strided pools) is checked after the device check (H15 comes first in the
  contract's order), so on CPU tensors the production target raises the H15 ValueError
  first; a target without H15 (the reference, a CPU target) raises the H16
  NotImplementedError.

A differential test then feeds the same broken inputs to reference and production and
requires the same exception type and the same message.  Where the reference is known to
disagree with the real module the case is a strict xfail whose reason states the exact
difference (a reference bug), so the suite passes and the disagreement stays visible.

D1/D2 are tested by importing each target's file with ``import_with_env`` under chosen
GDN_UCACHE_*_DTYPE values (the variables are read only at import; the other two are
removed from the environment for the import): illegal spellings raise ValueError at
import (naming the variable, for production and reference), and each of the five legal
arms imports with IO_TORCH, ST_TORCH and RING_TORCH equal to the arm's dtypes.

Hypothesis draws T outside {4, 8}, flush_min outside [1, 17 - T], unchecked cursor
values and env spellings, with at most 20 examples per test.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_fuzz.arms import ARM_NAMES, ARMS, ENV_VARS
from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.observation import clone_inputs, same_bits
from gdn_fuzz.targets import Target, TargetMismatch, TargetUnavailable, get_target, import_with_env

ENTRY = "gated_delta_rule_mtp_ucache_flush"
ARM0 = "bf16"
B, H, HV, POOL, K = 2, 1, 2, 3, 128
W_RING, RING_SLOTS = 16, 32

HYP = settings(max_examples=20, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow])

H15_MATCH = re.escape("GDN CuTe-DSL kernels require CUDA tensors")


# --------------------------------------------------------------------------- targets

_LOADED: dict[str, Target | str] = {}

# Targets whose messages are compared word for word: the released module (its messages are part
# of what we regression-test) and our mirror of it.  Every other target: exception type and clause.
EXACT_MESSAGES = ("production", "reference")


def _load(name: str) -> Target:
    """The target with its bf16 module imported, or a skip saying why it cannot run here."""
    if name not in _LOADED:
        try:
            t = get_target(name)
            t.module(ARM0)
            _LOADED[name] = t
        except (TargetUnavailable, TargetMismatch, ImportError) as e:
            _LOADED[name] = f"target {name!r} is not importable here ({type(e).__name__}: {e})"
    got = _LOADED[name]
    if isinstance(got, str):
        pytest.skip(got)
    return got


def _target_id(name: str) -> str:
    if name in ("reference", "production") or not name.endswith(".py"):
        return name
    return os.path.basename(name)


def pytest_generate_tests(metafunc):
    """`target`: reference, production and the selected target (--gdn-target / GDN_FUZZ_TARGET),
    each once.  The selection is computed as the plugin's `gdn_selection` fixture computes it
    (parametrization happens at collection, before any fixture can run)."""
    if "target" not in metafunc.fixturenames:
        return
    from gdn_fuzz.pytest_plugin import _selection

    selected = _selection(metafunc.config)[0]
    names = list(dict.fromkeys(["reference", "production", selected]))
    params = [pytest.param(n, id=_target_id(n),
                           marks=[pytest.mark.kernel_module] if n == "production" else [])
              for n in names]
    metafunc.parametrize("target", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def target(request, gdn_selection) -> Target:
    """One of reference, production and the selected target (see pytest_generate_tests)."""
    assert request.param in ("reference", "production", gdn_selection[0])
    return _load(request.param)


def applies_h15(target: Target) -> bool:
    """The target launches only on CUDA (H15): production, sm100, mutants of production.  On CPU
    tensors such a target is expected to behave as the production module does (module docstring)."""
    return target.needs_cuda


@pytest.fixture(scope="module")
def pair() -> tuple[Target, Target]:
    """(reference, production) for the differential tests; skipped without production."""
    return _load("reference"), _load("production")


def _capture_probe_error() -> RuntimeError | None:
    """What torch.cuda.is_current_stream_capturing() raises here (None on a CUDA build)."""
    try:
        torch.cuda.is_current_stream_capturing()
    except RuntimeError as e:
        return e
    return None


CAPTURE_ERR = _capture_probe_error()


# --------------------------------------------------------------------------- valid calls

_BASE: dict[tuple[str, int], dict] = {}


def valid_kwargs(arm: str = ARM0, T: int = 4, **over) -> dict:
    """A fresh copy of a valid call: row 0 verify (P=3, base 5), row 1 flush (P=13, base 30)."""
    key = (arm, T)
    if key not in _BASE:
        case = Case(arm=arm, T=T, H=H, HV=HV, pool=POOL,
                    rows=(Row(0, 3, 5), Row(2, 13, 30)), seed=11)
        _BASE[key] = materialize(case, "cpu")
    kw = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in _BASE[key].items()}
    kw.update(over)
    return kw


def with_T(kw: dict, T: int) -> dict:
    """Give q, k, v, a, b a token dim of T (consistent shapes; values do not matter)."""
    for n in ("q", "k", "v", "a", "b"):
        x = kw[n]
        idx = torch.arange(T) % x.shape[1]
        kw[n] = x[:, idx].contiguous()
    return kw


def snapshot(kw: dict) -> dict:
    return {k: v for k, v in clone_inputs(kw).items() if isinstance(v, torch.Tensor)}


def assert_unchanged(kw: dict, before: dict) -> None:
    """Every input tensor keeps its bits after a rejected call."""
    for name, old in before.items():
        new = kw[name]
        assert new.shape == old.shape and new.dtype == old.dtype, f"{name} changed shape/dtype"
        assert bool(same_bits(old, new).all()), f"rejected call modified input {name}"


_CLAUSE_TAG = re.compile(r"\[([HD]\d{1,2})\]")


@contextlib.contextmanager
def expect_guard(target_name: str, exc, clause: str, msg_regex: str | None):
    """The block must raise `exc` for host check / dtype rule `clause`.

    The contract (1.2, D1) fixes the exception type and the clause, not the wording, so:
    * every target: the type; and a message that names a clause id in brackets ("[H9]")
      must name `clause`;
    * production and reference only (EXACT_MESSAGES): the message matches `msg_regex`
      (re.search, as pytest.raises(match=)).  msg_regex None marks a bare `assert`: the
      production module's message must then be empty (that lack of a message is itself a
      regression-tested finding of the released module).
    Yields pytest's ExceptionInfo.
    """
    with pytest.raises(exc) as ei:
        yield ei
    msg = str(ei.value)
    tag = _CLAUSE_TAG.search(msg)
    assert tag is None or tag.group(1) == clause, \
        f"{target_name}: expected a {clause} rejection, the message names {tag.group(1)}: {msg}"
    if msg_regex is None:
        if target_name == "production":
            # Bare `assert` in the kernel: the message is empty and does not name the argument.
            assert msg == "", f"bare assert now has a message: {msg}"
    elif target_name in EXACT_MESSAGES:
        assert re.search(msg_regex, msg), f"{target_name}: message {msg!r} does not match {msg_regex!r}"


def expect_reject(target: Target, arm: str, kw: dict, exc, clause: str, match: str | None):
    """Call, assert the rejection (expect_guard: type and clause; the message for production
    and reference) and that no input changed."""
    before = snapshot(kw)
    with expect_guard(target.name, exc, clause, match) as ei:
        target.launch(arm, **kw)
    assert_unchanged(kw, before)
    return ei.value


def outcome(target: Target, arm: str, kw: dict):
    """('ok', None) or (exception type, message); inputs must be unchanged when rejected."""
    before = snapshot(kw)
    try:
        target.launch(arm, **kw)
    except Exception as e:  # noqa: BLE001 - the target's own exception is the observation
        assert_unchanged(kw, before)
        return type(e), str(e)
    return "ok", None


# --------------------------------------------------------------------------- bad inputs

def _other_half(dt: torch.dtype) -> torch.dtype:
    return torch.float16 if dt == torch.bfloat16 else torch.bfloat16


def _inner_strided(t: torch.Tensor) -> torch.Tensor:
    """Same values, last dim with stride 2 (inner dims not dense)."""
    big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    v = big[..., ::2]
    v.copy_(t)
    return v


def _block_strided(t: torch.Tensor) -> torch.Tensor:
    """Same values, dense inner dims, dim-0 stride doubled (a paged pool layout)."""
    big = torch.zeros(2 * t.shape[0], *t.shape[1:], dtype=t.dtype)
    v = big[::2]
    v.copy_(t)
    return v


def _strided_1d(t: torch.Tensor) -> torch.Tensor:
    big = torch.zeros(2 * t.shape[0], dtype=t.dtype)
    v = big[::2]
    v.copy_(t)
    return v


def _ring_slots(t: torch.Tensor, n: int) -> torch.Tensor:
    """The ring with n slots instead of 32 (16: the old ring format)."""
    return t[:, :, :n].contiguous()


@dataclass(frozen=True)
class Bad:
    """One broken argument.  match: substring (regex) of the real message, None = bare assert.

    ref_bug:   the reference's exception differs from production's (strict xfail in the
               differential test; the reason is the exact difference).
    after_h15: production checks this only after the CUDA-device check (H15), so CPU tensors
               raise the H15 ValueError there instead.
    range_h11: an H11 range check, behind torch.cuda.is_current_stream_capturing(): on a
               CPU-only torch build production raises that call's RuntimeError instead.
    """

    id: str
    clause: str
    mutate: Callable[[dict, object], None]
    exc: type
    match: Callable[[object], str] | str | None
    arms: tuple[str, ...] = (ARM0,)
    ref_bug: str | None = None
    after_h15: bool = False
    range_h11: bool = False

    def pattern(self, arm) -> str | None:
        return self.match(arm) if callable(self.match) else self.match


def _set(**vals):
    def f(kw, arm):
        kw.update(vals)
    return f


def _apply(name, fn):
    def f(kw, arm):
        kw[name] = fn(kw[name], arm)
    return f


def _restart(**vals):
    """restart_hist_on_flush=True plus the given argument changes."""
    def f(kw, arm):
        kw["restart_hist_on_flush"] = True
        for n, fn in vals.items():
            kw[n] = fn(kw[n], arm) if callable(fn) else fn
    return f


def _cursor(name, row, value, restart=True, pad_row=None):
    def f(kw, arm):
        kw["restart_hist_on_flush"] = restart
        kw[name][row] = value
        if pad_row is not None:
            kw["initial_state_indices"][pad_row] = -1
    return f


def _T(T):
    def f(kw, arm):
        with_T(kw, T)
    return f


ALL = ARM_NAMES
E = re.escape

BAD: list[Bad] = [
    # ---- H1: bare asserts for q, k, v, b and the pool; None a / A_log / dt_bias -> AttributeError
    *[Bad(f"{n}=None", "H1", _set(**{n: None}), AssertionError, None)
      for n in ("q", "k", "v", "b", "initial_state_source")],
    Bad("a=None", "H1", _set(a=None), AttributeError, E("'NoneType' object has no attribute 'dtype'")),
    Bad("A_log=None", "H1", _set(A_log=None), AttributeError, E("'NoneType' object has no attribute")),
    Bad("dt_bias=None", "H1", _set(dt_bias=None), AttributeError, E("'NoneType' object has no attribute")),
    # ---- H2: NotImplementedError flags
    Bad("recovery_steps=1", "H2", _set(recovery_steps=1), NotImplementedError, E("recovery_steps>0 is not supported")),
    # recovery_steps=-1 is rejected too (the test is !=0) although the message says ">0"
    Bad("recovery_steps=-1", "H2", _set(recovery_steps=-1), NotImplementedError, E("recovery_steps>0 is not supported")),
    Bad("disable_output", "H2", _set(disable_output=True), NotImplementedError, E("disable_output=True")),
    # the message says "intermediate-state caching", not the argument's name
    Bad("intermediate_states_buffer", "H2", _set(intermediate_states_buffer=torch.zeros(1)),
        NotImplementedError, E("intermediate-state caching is not supported")),
    # accepted_steps / ssm_state_indices share a message that names neither argument
    Bad("accepted_steps", "H2", _set(accepted_steps=torch.ones(B, dtype=torch.int32)),
        NotImplementedError, E("per-request K / FLA-scatter is not supported")),
    Bad("ssm_state_indices", "H2", _set(ssm_state_indices=torch.zeros(B, dtype=torch.int32)),
        NotImplementedError, E("per-request K / FLA-scatter is not supported")),
    Bad("output_state_indices", "H2", _set(output_state_indices=torch.zeros(B, dtype=torch.int32)),
        NotImplementedError, E("split-pool (output_state_indices) is not supported")),
    # ---- H3
    Bad("softplus_beta=2", "H3", _set(softplus_beta=2.0), AssertionError, E("softplus_beta=2.0 not supported")),
    Bad("softplus_threshold=10", "H3", _set(softplus_threshold=10.0), AssertionError,
        E("softplus_threshold=10.0 not supported")),
    Bad("use_qk_l2norm_in_kernel=False", "H3", _set(use_qk_l2norm_in_kernel=False), AssertionError,
        E("use_qk_l2norm_in_kernel=False is not supported")),
    # ---- H4: pool dtype, per arm
    Bad("pool-fp32", "H4", _apply("initial_state_source", lambda t, a: t.float()), AssertionError,
        lambda a: E(f"initial_state_source must be {a.state}") + ".*" + E("got torch.float32."), arms=ALL),
    Bad("pool-other-half", "H4", _apply("initial_state_source", lambda t, a: t.to(_other_half(a.state))),
        AssertionError,
        lambda a: E(f"initial_state_source must be {a.state}") + ".*" + E(f"got {_other_half(a.state)}."), arms=ALL),
    # ---- H5
    Bad("q-K=64", "H5", _apply("q", lambda t, a: t[..., :64].contiguous()), AssertionError,
        E("this kernel requires K==V==128; got K=64, V=128.")),
    Bad("v-V=64", "H5", _apply("v", lambda t, a: t[..., :64].contiguous()), AssertionError,
        E("this kernel requires K==V==128; got K=128, V=64.")),
    # a 3-D q fails on the tuple unpack: the message does not name q
    Bad("q-3D", "H5", _apply("q", lambda t, a: t[:, :, 0].contiguous()), ValueError,
        E("not enough values to unpack (expected 4, got 3)")),
    # ---- H6: IO dtype of each of q, k, v, a, b; per arm
    *[Bad(f"{n}-{tag}", "H6", _apply(n, (lambda t, a, mk=mk: t.to(mk(a)))), AssertionError,
          (lambda a, n=n, mk=mk: E(f"module compiled for {a.io} IO") + ".*" + E(f" {n}={mk(a)} ")
           if n != "b" else E(f"module compiled for {a.io} IO") + ".*" + E(f" b={mk(a)}. ")),
          arms=ALL)
      for n in ("q", "k", "v", "a", "b")
      for tag, mk in (("fp32", lambda a: torch.float32), ("other-half", lambda a: _other_half(a.io)))],
    # ---- H7: one message for all four; it names the verify kernel, not this entry point,
    #      and does not say which argument is missing
    *[Bad(f"{n}=None", "H7", _set(**{n: None}), AssertionError,
          E("gated_delta_rule_mtp_ucache: k_cache/u_cache/g_cache/hist_len are required."))
      for n in ("k_cache", "u_cache", "g_cache", "hist_len")],
    # ---- H8: inner dims not dense (pool and rings)
    *[Bad(f"{n}-inner-strided", "H8", _apply(n, lambda t, a: _inner_strided(t)), AssertionError,
          E(f"{n}: inner dims must be dense"))
      for n in ("initial_state_source", "k_cache", "u_cache", "g_cache")],
    Bad("pool-VK-transposed", "H8", _apply("initial_state_source", lambda t, a: t.transpose(2, 3).contiguous().transpose(2, 3)),
        AssertionError, E("initial_state_source: inner dims must be dense")),
    Bad("pool-dim0-stride0", "H8", _apply("initial_state_source", lambda t, a: t[:1].expand(POOL, -1, -1, -1)),
        AssertionError, E("initial_state_source: inner dims must be dense")),
    # ---- H9: ring dtypes and shapes (only k/u dtype and k shape have messages)
    Bad("k_cache-fp32", "H9", _apply("k_cache", lambda t, a: t.float()), AssertionError,
        lambda a: E(f"k_cache must be {a.ring} (module RING dtype") + ".*" + E("got torch.float32."), arms=ALL),
    Bad("k_cache-other-half", "H9", _apply("k_cache", lambda t, a: t.to(_other_half(a.ring))), AssertionError,
        lambda a: E(f"k_cache must be {a.ring} (module RING dtype"), arms=ALL),
    Bad("u_cache-fp32", "H9", _apply("u_cache", lambda t, a: t.float()), AssertionError,
        lambda a: E(f"u_cache must be {a.ring} (module RING dtype") + ".*" + E("got torch.float32."), arms=ALL),
    Bad("u_cache-other-half", "H9", _apply("u_cache", lambda t, a: t.to(_other_half(a.ring))), AssertionError,
        lambda a: E(f"u_cache must be {a.ring} (module RING dtype"), arms=ALL),
    Bad("k_cache-16-slots", "H9", _apply("k_cache", lambda t, a: _ring_slots(t, 16)), AssertionError,
        E("k_cache must be [pool=3, H=1, 32, K=128]; got (3, 1, 16, 128)")),
    Bad("k_cache-pool+1", "H9", _apply("k_cache", lambda t, a: torch.cat([t, t[:1]])), AssertionError,
        E("k_cache must be [pool=3, H=1, 32, K=128]; got (4, 1, 32, 128)")),
    Bad("k_cache-H=2", "H9", _apply("k_cache", lambda t, a: torch.cat([t, t], 1)), AssertionError,
        E("k_cache must be [pool=3, H=1, 32, K=128]; got (3, 2, 32, 128)")),
    # bare asserts: u_cache shape, g_cache dtype and shape
    Bad("u_cache-16-slots", "H9", _apply("u_cache", lambda t, a: _ring_slots(t, 16)), AssertionError, None),
    Bad("u_cache-pool+1", "H9", _apply("u_cache", lambda t, a: torch.cat([t, t[:1]])), AssertionError, None),
    Bad("g_cache-bf16", "H9", _apply("g_cache", lambda t, a: t.to(torch.bfloat16)), AssertionError, None),
    Bad("g_cache-fp64", "H9", _apply("g_cache", lambda t, a: t.double()), AssertionError, None),
    Bad("g_cache-16-slots", "H9", _apply("g_cache", lambda t, a: _ring_slots(t, 16)), AssertionError, None),
    # ---- H10: bare asserts
    Bad("hist_len-int64", "H10", _apply("hist_len", lambda t, a: t.long()), AssertionError, None),
    Bad("hist_len-len-B+1", "H10", _apply("hist_len", lambda t, a: torch.cat([t, t[:1]])), AssertionError, None),
    Bad("hist_len-len-B-1", "H10", _apply("hist_len", lambda t, a: t[:1].clone()), AssertionError, None),
    # ---- H11: restart_hist_on_flush=True only
    Bad("restart-cache_base=None", "H11", _restart(cache_base=None), ValueError,
        E("needs a caller-owned cache_base (got None)")),
    Bad("restart-hist_len-noncontig", "H11", _restart(hist_len=lambda t, a: _strided_1d(t)), AssertionError,
        E("restart_hist_on_flush=True: hist_len and cache_base must be contiguous")),
    Bad("restart-cache_base-noncontig", "H11", _restart(cache_base=lambda t, a: _strided_1d(t)), AssertionError,
        E("restart_hist_on_flush=True: hist_len and cache_base must be contiguous")),
    Bad("restart-hist_len=17", "H11", _cursor("hist_len", 0, 17), AssertionError,
        E("hist_len out of legal range [0, 16]: min=13 max=17"), range_h11=True),
    Bad("restart-hist_len=-1", "H11", _cursor("hist_len", 0, -1), AssertionError,
        E("hist_len out of legal range [0, 16]: min=-1 max=13"), range_h11=True),
    Bad("restart-cache_base=32", "H11", _cursor("cache_base", 0, 32), AssertionError,
        E("cache_base out of legal range [0, 32): min=30 max=32"), range_h11=True),
    Bad("restart-cache_base=-1", "H11", _cursor("cache_base", 0, -1), AssertionError,
        E("cache_base out of legal range [0, 32): min=-1 max=30"), range_h11=True),
    Bad("restart-pad-row-hist_len=17", "H11", _cursor("hist_len", 1, 17, pad_row=1), AssertionError,
        E("hist_len out of legal range [0, 16]: min=3 max=17"), range_h11=True),
    # ---- H12: bare asserts (restart=False, so H11 does not run first)
    Bad("cache_base-int64", "H12", _apply("cache_base", lambda t, a: t.long()), AssertionError, None),
    Bad("cache_base-len-B+1", "H12", _apply("cache_base", lambda t, a: torch.cat([t, t[:1]])), AssertionError, None),
    # ---- H13: T not in {4, 8}; shapes consistent so that the ring checks pass first
    *[Bad(f"T={T}", "H13", _T(T), NotImplementedError, E(f"{ENTRY}: T={T} unsupported"))
      for T in (6, 1, 16)],
    # ---- H14: flush_min outside [1, 17-T]
    Bad("flush_min=0", "H14", _set(flush_min=0), AssertionError, E("flush_min=0 out of range [1, 13] for T=4")),
    Bad("flush_min=14", "H14", _set(flush_min=14), AssertionError, E("flush_min=14 out of range [1, 13] for T=4")),
    Bad("flush_min=-5", "H14", _set(flush_min=-5), AssertionError, E("flush_min=-5 out of range [1, 13] for T=4")),
    # ---- H16: block-strided (dim-0) pool/rings without SGLANG_GDN_WY_STRIDED_QKV
    *[Bad(f"{n}-block-strided", "H16", _apply(n, lambda t, a: _block_strided(t)), NotImplementedError,
          E("block-strided state pools require the static-descriptor mode"), after_h15=True)
      for n in ("initial_state_source", "k_cache", "u_cache", "g_cache")],
]

BAD_BY_CLAUSE: dict[str, list] = {}
for _b in BAD:
    for _arm in _b.arms:
        BAD_BY_CLAUSE.setdefault(_b.clause, []).append(pytest.param(_b, _arm, id=f"{_b.clause}-{_b.id}-{_arm}"))


def expected_for(target: Target, bad: Bad, arm: str):
    """(exception type, clause, regex) this target must raise for `bad` on this machine."""
    if applies_h15(target):
        if bad.after_h15:
            return ValueError, "H15", H15_MATCH
        if bad.range_h11 and CAPTURE_ERR is not None:
            return RuntimeError, bad.clause, E(str(CAPTURE_ERR))
    return bad.exc, bad.clause, bad.pattern(ARMS[arm])


def check_bad(target: Target, bad: Bad, arm: str) -> None:
    kw = valid_kwargs(arm)
    bad.mutate(kw, ARMS[arm])
    exc, clause, pattern = expected_for(target, bad, arm)
    expect_reject(target, arm, kw, exc, clause, pattern)


# --------------------------------------------------------------------------- H1 - H16

HOST_CHECKS = {  # clause -> what an illegal call raises (the contract's H clauses)
    'H1': 'None q/k/v/b/pool -> bare AssertionError (empty message, argument not named); None a / A_log / dt_bias -> AttributeError.',
    'H2': 'recovery_steps, disable_output, intermediate_states_buffer, accepted_steps, ssm_state_indices, output_state_indices -> NotImplementedError.',
    'H3': 'softplus_beta != 1, softplus_threshold != 20, use_qk_l2norm_in_kernel=False -> AssertionError.',
    'H4': "a pool not in the arm's STATE dtype -> AssertionError naming the expected dtype.",
    'H5': 'K or V != 128 -> AssertionError; non-4-D q -> ValueError from the unpack.',
    'H6': "q, k, v, a or b not in the arm's IO dtype -> AssertionError 'module compiled for <IO> IO' whose message lists the offending argument's dtype.",
    'H7': 'missing k_cache/u_cache/g_cache/hist_len -> AssertionError (one message for all four).',
    'H8': "pool or ring with non-dense inner dims (or dim-0 stride too small) -> AssertionError '<name>: inner dims must be dense'.",
    'H9': 'ring dtypes and shapes -> AssertionError (bare for u_cache shape and all g_cache checks).',
    'H10': 'hist_len not int32 or not of length B -> bare AssertionError.',
    'H11': 'restart_hist_on_flush=True: None cache_base -> ValueError, non-contiguous cursors -> AssertionError, cursor ranges -> AssertionError (pad rows included). Production on a CPU-only torch raises RuntimeError from torch.cuda.is_current_stream_capturing() before the ranges.',
    'H12': 'cache_base not int32 or not of length B -> bare AssertionError.',
    'H13': 'T not in {4, 8} -> NotImplementedError naming T.',
    'H14': 'flush_min outside [1, 17-T] -> AssertionError naming flush_min and the range.',
    'H16': 'a block-strided (dim 0) pool or ring without strided-QKV mode -> NotImplementedError. Production checks it after H15, so with CPU tensors it raises the H15 ValueError instead.',
}


@pytest.mark.parametrize("bad,arm", [p for c in HOST_CHECKS for p in BAD_BY_CLAUSE[c]])
def test_host_check_raises(target, bad, arm):
    """Each illegal call of BAD_BY_CLAUSE (ids: clause-case-arm) raises what HOST_CHECKS[clause] says: the
    same exception type and message as the released module (check_bad)."""
    check_bad(target, bad, arm)


def test_h11_ranges_unchecked_without_restart(target):
    """H11 (1.3): with restart_hist_on_flush=False the cursor values are never range checked."""
    kw = valid_kwargs(restart_hist_on_flush=False)
    kw["hist_len"][:] = torch.tensor([40, -3], dtype=torch.int32)
    kw["cache_base"][:] = torch.tensor([-7, 1000], dtype=torch.int32)
    if applies_h15(target):
        expect_reject(target, ARM0, kw, ValueError, "H15", H15_MATCH)  # H15: every host check passed
    else:
        # the reference accepts and launches (P=40 reads a full window and wraps; silent by contract)
        target.launch(ARM0, **kw)


@HYP
@given(T=st.integers(0, 24).filter(lambda t: t not in (4, 8)),
       flush_min=st.none() | st.integers(-5, 30))
def test_h13_any_T_rejected_before_flush_min(target, T, flush_min):
    """H13 (then H14): any T outside {4, 8}, with consistent shapes, raises NotImplementedError
    whatever flush_min is: H13 runs before the flush_min check."""
    kw = with_T(valid_kwargs(flush_min=flush_min), T)
    expect_reject(target, ARM0, kw, NotImplementedError, "H13", E(f"{ENTRY}: T={T} unsupported"))


@HYP
@given(T=st.sampled_from([4, 8]), data=st.data())
def test_h14_flush_min_outside_range(target, T, data):
    """H14: flush_min drawn outside [1, 17-T] is rejected with a message naming it and the range."""
    fm = data.draw(st.integers(-1000, 0) | st.integers(W_RING - T + 2, 1000), label="flush_min")
    kw = valid_kwargs(T=T, flush_min=fm)
    expect_reject(target, ARM0, kw, AssertionError, "H14",
                  E(f"flush_min={fm} out of range [1, {W_RING - T + 1}] for T={T}"))


@HYP
@given(T=st.sampled_from([4, 8]), data=st.data())
def test_h14_flush_min_inside_range_passes_host_checks(target, T, data):
    """H14 (and H15): flush_min in [1, 17-T] passes every host check: production stops at the
    CUDA-device check (ValueError), the reference (and any target without H15) runs."""
    fm = data.draw(st.integers(1, W_RING - T + 1), label="flush_min")
    kw = valid_kwargs(T=T, flush_min=fm)
    if applies_h15(target):
        expect_reject(target, ARM0, kw, ValueError, "H15", H15_MATCH)
    else:
        out = target.launch(ARM0, **kw)
        assert tuple(out.shape) == (B, T, HV, K)


@pytest.mark.parametrize("T", [4, 8])
@pytest.mark.parametrize("arm", ALL)
def test_h15_valid_cpu_call(target, arm, T):
    """H15: a fully valid call with CPU tensors ends in ValueError 'require CUDA tensors' on the
    production target (after every other host check); the reference (no H15) runs it."""
    kw = valid_kwargs(arm, T)
    if applies_h15(target):
        expect_reject(target, arm, kw, ValueError, "H15", H15_MATCH + E(", got cpu"))
    else:
        out = target.launch(arm, **kw)
        assert tuple(out.shape) == (B, T, HV, K) and out.dtype == ARMS[arm].io


def test_h15_valid_cpu_call_restart_true(target):
    """H15/H11: a valid restart_hist_on_flush=True call.  On a CPU-only torch the production
    wrapper raises RuntimeError from torch.cuda.is_current_stream_capturing() (before its range
    checks and before H15); with a CUDA build it reaches H15.  The reference (and any target
    without H15) runs and commits C2."""
    kw = valid_kwargs(restart_hist_on_flush=True)
    if applies_h15(target):
        if CAPTURE_ERR is not None:
            expect_reject(target, ARM0, kw, RuntimeError, "H11", E(str(CAPTURE_ERR)))
        else:
            expect_reject(target, ARM0, kw, ValueError, "H15", H15_MATCH)
    else:
        target.launch(ARM0, **kw)
        # C2: row 1 (P=13 >= 13) flushed: base (30+13)&31 = 11, len 0; row 0 untouched
        assert kw["hist_len"].tolist() == [3, 0] and kw["cache_base"].tolist() == [5, 11]


@pytest.mark.parametrize("what", ["k-K=64", "hist_len-2D"])
def test_host_check_gaps(target, what):
    """H5/H10 gaps: k's last dim is never checked (only q's K is), and a [B, 1] hist_len passes
    H10 (only dtype and shape[0] are checked).  Production lets both through to H15.

    These are gaps of the released module (and of its reference mirror), not contract rules:
    1.3 leaves both inputs unvalidated, so another target may reject them or not."""
    if target.name not in ("production", "reference"):
        pytest.skip(f"{what}: unvalidated by the contract (1.3); pinned for production and reference only")
    kw = valid_kwargs()
    if what == "k-K=64":
        kw["k"] = kw["k"][..., :64].contiguous()
    else:
        kw["hist_len"] = kw["hist_len"][:, None].contiguous()
    if target.name == "production":
        expect_reject(target, ARM0, kw, ValueError, "H15", H15_MATCH)
    else:
        # the reference's host checks pass too; it fails later, in its torch math
        with pytest.raises(RuntimeError):
            target.launch(ARM0, **kw)


# --------------------------------------------------------------------------- differential

def _diff_params():
    out = []
    for bad in BAD:
        for arm in bad.arms:
            marks = []
            if bad.ref_bug:
                marks.append(pytest.mark.xfail(strict=True, reason=f"reference bug ({bad.clause}): {bad.ref_bug}"))
            out.append(pytest.param(bad, arm, id=f"{bad.clause}-{bad.id}-{arm}", marks=marks))
    return out


@pytest.mark.kernel_module
@pytest.mark.parametrize("bad,arm", _diff_params())
def test_differential_same_exception(pair, bad, arm):
    """H1-H14, H16: the reference and production raise the same exception type with the same
    message for the same bad input (the reference claims identical host checks)."""
    ref, prod = pair
    if bad.after_h15:
        pytest.skip(f"{bad.clause}: production checks this after H15, so CPU tensors cannot reach it "
                    "(test_h16_block_strided_pool asserts what each target does)")
    if bad.range_h11 and CAPTURE_ERR is not None:
        pytest.skip("H11 ranges: production calls torch.cuda.is_current_stream_capturing() first, which "
                    "raises on this CPU-only torch (test_h11_restart_cursors asserts what each target does)")
    kw_r, kw_p = valid_kwargs(arm), valid_kwargs(arm)
    bad.mutate(kw_r, ARMS[arm])
    bad.mutate(kw_p, ARMS[arm])
    got_r, got_p = outcome(ref, arm, kw_r), outcome(prod, arm, kw_p)
    assert got_r == got_p, f"reference {got_r} != production {got_p}"


@pytest.mark.kernel_module
@HYP
@given(T=st.sampled_from([4, 8]), flush_min=st.none() | st.integers(-3, 20),
       hist=st.lists(st.integers(-3, 40), min_size=B, max_size=B),
       base=st.lists(st.integers(-40, 70), min_size=B, max_size=B))
def test_differential_flush_min_and_unchecked_cursors(pair, T, flush_min, hist, base):
    """H14/H15 (and 1.3): over drawn flush_min and restart=False cursor values, both targets agree:
    either the same rejection (H14: AssertionError, same message), or production reaches H15 and
    the reference returns normally.

    When production passes every host check, no H* clause applies to the call: flush_min is legal
    (H14), and with restart_hist_on_flush=False hist_len and cache_base are not range-checked (H11
    checks ranges only with restart=True).  Cursors with every P in [0, 16] (any cache_base: it is
    used mod 32, 1.3) are in-contract: the reference must return normally, and anything it raises
    is a crash.  P < 0 or P > 16 is out of contract but unvalidated (1.3: "silently wrong", no
    exception): the reference mirrors production there too and must not raise either; a host-check
    exception type would be a guard production does not have."""
    ref, prod = pair
    kws = []
    for _ in range(2):
        kw = valid_kwargs(T=T, flush_min=flush_min)
        kw["hist_len"][:] = torch.tensor(hist, dtype=torch.int32)
        kw["cache_base"][:] = torch.tensor(base, dtype=torch.int32)
        kws.append(kw)
    got_p = outcome(prod, ARM0, kws[1])
    if got_p[0] is ValueError and "require CUDA tensors" in got_p[1]:
        in_contract = all(0 <= p <= W_RING for p in hist)
        try:
            ref.launch(ARM0, **kws[0])
        except Exception as e:  # noqa: BLE001 - any exception here is the failure being reported
            what = ("in-contract cursors (every P in [0, 16]): the reference crashed" if in_contract else
                    "out-of-contract but unvalidated cursors (1.3, restart_hist_on_flush=False: silent, no "
                    "exception): the reference raised")
            pytest.fail(f"production passed every host check; with {what} {type(e).__name__}: {e} "
                        f"(T={T}, flush_min={flush_min}, hist_len={hist}, cache_base={base})")
    else:
        # the only host check these inputs can fail is H14 (AssertionError, flush_min out of range)
        legal = flush_min is None or 1 <= flush_min <= W_RING - T + 1
        assert got_p[0] is AssertionError and not legal, \
            f"production rejected a call only H14 could reject (flush_min={flush_min}, T={T}): {got_p}"
        assert outcome(ref, ARM0, kws[0]) == got_p


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


def _d1_expect(target: Target, env: dict[str, str]):
    want = d1_model(env)
    if isinstance(want, str):
        # D1: ValueError at import; production's (and the reference's) message names the offending
        # variable and its (stripped, lower-cased) value
        val = env.get(want, "").strip().lower() if want != IO_V else env.get(IO_V, "bf16").strip().lower()
        with expect_guard(target.name, ValueError, "D1", E(f"{want}={val!r}") + ".*unsupported") as ei:
            _import(target, env)
        return ("ValueError", str(ei.value))
    mod = _import(target, env)
    assert (mod.IO_TORCH, mod.ST_TORCH, mod.RING_TORCH) == want
    return want


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


@pytest.mark.parametrize("env,want", D1_CASES)
def test_d1_import_env(target, env, want):
    """D1: the dtype variables are read at import, stripped and lower-cased; anything outside the
    legal set (with a literal equality test for STATE/RING = IO) raises ValueError at import."""
    assert d1_model(env) == want  # the table states what the contract says
    _d1_expect(target, env)


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
def test_d1_differential_import(pair, io, state, ring):
    """D1: the reference and production raise the same ValueError message (or select the same
    dtypes) at import for the same environment."""
    env = {k: v for k, v in ((IO_V, io), (ST_V, state), (RG_V, ring)) if v is not None}
    res = []
    for t in pair:
        try:
            m = _import(t, env)
            res.append((m.IO_TORCH, m.ST_TORCH, m.RING_TORCH))
        except ValueError as e:
            res.append(str(e))
    assert res[0] == res[1]


@pytest.mark.parametrize("arm", ALL)
def test_d2_legal_arms_import(target, arm):
    """D2/D3: each of the five legal arms imports (through its exact env values) with IO_TORCH,
    ST_TORCH and RING_TORCH equal to the arm's dtypes, and the ring constants of the contract."""
    a = ARMS[arm]
    mod = _import(target, a.env_dict)
    assert (mod.IO_TORCH, mod.ST_TORCH, mod.RING_TORCH) == (a.io, a.state, a.ring)
    assert (mod.W_RING, mod.RING_SLOTS, mod.RING_MASK, mod.K_DIM, mod.V_DIM_C) == (16, 32, 31, 128, 128)
    assert callable(getattr(mod, ENTRY))
