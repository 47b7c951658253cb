"""Host checks by release: what a call with some arguments changed must raise, read from the release model.

The vocabulary
--------------
A *change* (CHANGES) is one edit of a valid call, release-independent: an argument set to None, given
the wrong dtype, shape, strides or value, a flag passed, a new keyword (backend=..., stochastic_rounding=...)
given a legal or an illegal value.  Each names the check that catches it in the flush entry's vocabulary
(`check`), the argument a rejection message should name (`named`, None where the message names none),
the arms it applies to and the arguments it touches (two changes of one argument never combine).

A release model (gdn_fuzz.targets.releases) lists each entry point's checks in order and, where a
release differs, which check catches which change (or that the change is legal there).  expect() walks
that order for a call carrying one or more changes and returns the first check that fires: a check that
catches one of the changes, or an environment check whose conditions hold for this call (CONDITIONS:
the device probe on CPU tensors, the capture probe on a CPU build of torch, the UMMA routing on an SM100
GPU).  That is the whole model of "which error comes first": the host-check tests, the `guards` property
and `gdn-fuzz diff` use nothing else.

judge() compares what a target raised with the expectation, by clause: the exception type, and that the
message names the argument where the model says it does; never a message's wording.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from gdn_fuzz.arms import ARM_NAMES, ARMS, Arm, get_arm
from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.prefix_case import PrefixCase, Request, materialize_prefix
from gdn_fuzz.targets.releases import Check, EntryModel, Release, UMMA

# ------------------------------------------------------------------ changes of a valid call

B, H, HV, POOL = 2, 1, 2, 3  # the valid base call: K = V = 128, row 0 verify (P=3, base 5), row 1 flush (P=13, base 30)


def base_call(arm: str = "bf16", T: int = 4, device="cpu", heads: tuple[int, int] = (H, HV)) -> dict:
    """The keyword arguments of a valid call (materialize of a two-row case; fresh tensors each time);
    heads: (H, HV)."""
    case = Case(arm=arm, T=T, H=heads[0], HV=heads[1], pool=POOL, rows=(Row(0, 3, 5), Row(2, 13, 30)), seed=11)
    return materialize(case, device)


def _other_half(dt: torch.dtype) -> torch.dtype:
    return torch.float16 if dt == torch.bfloat16 else torch.bfloat16


def _inner_strided(t: torch.Tensor) -> torch.Tensor:
    """Same values, last dim with stride 2 (inner dims not dense)."""
    big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    v = big[..., ::2]
    v.copy_(t)
    return v


def _block_strided(t: torch.Tensor) -> torch.Tensor:
    """Same values, dense inner dims, dim-0 stride doubled (a paged pool layout)."""
    big = torch.zeros(2 * t.shape[0], *t.shape[1:], dtype=t.dtype, device=t.device)
    v = big[::2]
    v.copy_(t)
    return v


def _strided_1d(t: torch.Tensor) -> torch.Tensor:
    big = torch.zeros(2 * t.shape[0], dtype=t.dtype, device=t.device)
    v = big[::2]
    v.copy_(t)
    return v


def with_T(kw: dict, T: int) -> dict:
    """Give q, k, v, a, b a token dim of T (consistent shapes; values do not matter)."""
    for n in ("q", "k", "v", "a", "b"):
        x = kw.get(n)
        if isinstance(x, torch.Tensor) and x.dim() >= 2:
            idx = torch.arange(T, device=x.device) % x.shape[1]
            kw[n] = x[:, idx].contiguous()
    return kw


@dataclass(frozen=True)
class Change:
    """One edit of a valid call.

    check:    the check that catches it in the flush entry's vocabulary (a release's `catches` may say
              otherwise, or None: legal there); "" for a change that is legal everywhere it is a parameter
    named:    the argument a rejection message should name (None: the messages name no argument)
    touches:  the arguments it changes (changes that share one do not combine)
    arms:     the arms it applies to
    restart:  it needs restart_hist_on_flush=True
    order:    changes are applied in this order (shape changes first)
    """

    id: str
    check: str
    apply: Callable[[dict, Arm], None]
    named: str | None = None
    touches: tuple[str, ...] = ()
    arms: tuple[str, ...] = ARM_NAMES
    restart: bool = False
    order: int = 1
    doc: str = ""
    entries: tuple[str, ...] = ("flush", "umma")  # the entry points whose call it edits

    @property
    def legal(self) -> bool:
        return self.check == ""


def _set(**vals):
    def f(kw, arm):
        kw.update(vals)
    return f


def _map(name, fn):
    def f(kw, arm):
        kw[name] = fn(kw[name], arm)
    return f


def _cursor(name, row, value, pad_row=None):
    def f(kw, arm):
        kw[name] = kw[name].clone()
        kw[name][row] = value
        if pad_row is not None:
            kw["initial_state_indices"] = kw["initial_state_indices"].clone()
            kw["initial_state_indices"][pad_row] = -1
    return f


def _T(T):
    def f(kw, arm):
        with_T(kw, T)
    return f


def _five_d(backend=None):
    def f(kw, arm):
        s = kw["initial_state_source"]
        kw["initial_state_source"] = s.reshape(s.shape[0], 1, *s.shape[1:]).contiguous()  # [pool, dies=1, HV, V, K]
        if backend is not None:
            kw["backend"] = backend
    return f


def _seed(dtype=torch.int64):
    def f(kw, arm):
        kw["rand_seed"] = torch.tensor([12345], dtype=dtype, device=kw["initial_state_indices"].device)
    return f


def _both(*fs):
    def f(kw, arm):
        for g in fs:
            g(kw, arm)
    return f


_RING_BF16 = tuple(a for a in ARM_NAMES if ARMS[a].ring == torch.bfloat16)
_RING_FP16 = tuple(a for a in ARM_NAMES if ARMS[a].ring == torch.float16)


def _changes() -> list[Change]:
    C = Change
    out = [
        *[C(f"{n}=None", "H1", _set(**{n: None}), None, (n,)) for n in ("q", "k", "v", "b", "initial_state_source")],
        C("a=None", "H6.none", _set(a=None), None, ("a",)),
        C("A_log=None", "N5.cast", _set(A_log=None), None, ("A_log",)),
        C("dt_bias=None", "N5.cast", _set(dt_bias=None), None, ("dt_bias",)),
        C("recovery_steps=1", "H2", _set(recovery_steps=1), "recovery_steps", ("recovery_steps",)),
        C("recovery_steps=-1", "H2", _set(recovery_steps=-1), "recovery_steps", ("recovery_steps",),
          doc="the test is != 0 although the message says '>0'"),
        C("disable_output", "H2", _set(disable_output=True), "disable_output", ("disable_output",)),
        C("intermediate_states_buffer", "H2", _set(intermediate_states_buffer=torch.zeros(1)), None,
          ("intermediate_states_buffer",), doc="the message says 'intermediate-state caching'"),
        C("accepted_steps", "H2", lambda kw, a: kw.update(accepted_steps=torch.ones(B, dtype=torch.int32)), None,
          ("accepted_steps",), doc="one message for accepted_steps and ssm_state_indices names neither"),
        C("ssm_state_indices", "H2", lambda kw, a: kw.update(ssm_state_indices=torch.zeros(B, dtype=torch.int32)),
          None, ("ssm_state_indices",)),
        C("output_state_indices", "H2", lambda kw, a: kw.update(output_state_indices=torch.zeros(B, dtype=torch.int32)),
          "output_state_indices", ("output_state_indices",)),
        C("softplus_beta=2", "H3", _set(softplus_beta=2.0), "softplus_beta", ("softplus_beta",)),
        C("softplus_threshold=10", "H3", _set(softplus_threshold=10.0), "softplus_threshold", ("softplus_threshold",)),
        C("use_qk_l2norm_in_kernel=False", "H3", _set(use_qk_l2norm_in_kernel=False), "use_qk_l2norm_in_kernel",
          ("use_qk_l2norm_in_kernel",)),
        C("pool-fp32", "H4", _map("initial_state_source", lambda t, a: t.float()), "initial_state_source",
          ("initial_state_source",)),
        C("pool-other-half", "H4", _map("initial_state_source", lambda t, a: t.to(_other_half(a.state))),
          "initial_state_source", ("initial_state_source",)),
        C("q-K=64", "H5", _map("q", lambda t, a: t[..., :64].contiguous()), None, ("q",)),
        C("v-V=64", "H5", _map("v", lambda t, a: t[..., :64].contiguous()), None, ("v",)),
        C("q-3D", "H5.unpack", _map("q", lambda t, a: t[:, :, 0].contiguous()), None, ("q",),
          doc="a 3-D q fails on the tuple unpack: the message does not name q"),
        *[C(f"{n}-{tag}", "H6", _map(n, (lambda t, a, mk=mk: t.to(mk(a)))), n, (n,))
          for n in ("q", "k", "v", "a", "b")
          for tag, mk in (("fp32", lambda a: torch.float32), ("other-half", lambda a: _other_half(a.io)))],
        *[C(f"{n}=None", "H7", _set(**{n: None}), n, (n,)) for n in ("k_cache", "u_cache", "g_cache", "hist_len")],
        *[C(f"{n}-inner-strided", chk, _map(n, lambda t, a: _inner_strided(t)), n, (n,))
          for n, chk in (("initial_state_source", "H8.pool"), ("k_cache", "H8.k"), ("u_cache", "H8.u"),
                         ("g_cache", "H8.g"))],
        C("pool-VK-transposed", "H8.pool",
          _map("initial_state_source", lambda t, a: t.transpose(2, 3).contiguous().transpose(2, 3)),
          "initial_state_source", ("initial_state_source",)),
        C("pool-dim0-stride0", "H8.pool", _map("initial_state_source", lambda t, a: t[:1].expand(POOL, -1, -1, -1)),
          "initial_state_source", ("initial_state_source",)),
        C("k_cache-fp32", "H9.k_dtype", _map("k_cache", lambda t, a: t.float()), "k_cache", ("k_cache",)),
        C("k_cache-other-half", "H9.k_dtype", _map("k_cache", lambda t, a: t.to(_other_half(a.ring))), "k_cache",
          ("k_cache",)),
        C("u_cache-fp32", "H9.u_dtype", _map("u_cache", lambda t, a: t.float()), "u_cache", ("u_cache",)),
        C("u_cache-fp16-beside-bf16-ring", "H9.u_dtype", _map("u_cache", lambda t, a: t.half()), "u_cache",
          ("u_cache",), arms=_RING_BF16, doc="D5: the UMMA backend's mixed ring (vLLM's u-cache dtype)"),
        C("u_cache-bf16-beside-fp16-ring", "H9.u_dtype", _map("u_cache", lambda t, a: t.bfloat16()), "u_cache",
          ("u_cache",), arms=_RING_FP16),
        C("k_cache-16-slots", "H9.k_shape", _map("k_cache", lambda t, a: t[:, :, :16].contiguous()), "k_cache",
          ("k_cache",)),
        C("k_cache-pool+1", "H9.k_shape", _map("k_cache", lambda t, a: torch.cat([t, t[:1]])), "k_cache", ("k_cache",)),
        C("k_cache-H=2", "H9.k_shape", _map("k_cache", lambda t, a: torch.cat([t, t], 1)), "k_cache", ("k_cache",)),
        C("u_cache-16-slots", "H9.u_shape", _map("u_cache", lambda t, a: t[:, :, :16].contiguous()), None, ("u_cache",)),
        C("u_cache-pool+1", "H9.u_shape", _map("u_cache", lambda t, a: torch.cat([t, t[:1]])), None, ("u_cache",)),
        C("g_cache-bf16", "H9.g_dtype", _map("g_cache", lambda t, a: t.to(torch.bfloat16)), None, ("g_cache",)),
        C("g_cache-fp64", "H9.g_dtype", _map("g_cache", lambda t, a: t.double()), None, ("g_cache",)),
        C("g_cache-16-slots", "H9.g_shape", _map("g_cache", lambda t, a: t[:, :, :16].contiguous()), None,
          ("g_cache",)),
        C("hist_len-int64", "H10", _map("hist_len", lambda t, a: t.long()), None, ("hist_len",)),
        C("hist_len-len-B+1", "H10", _map("hist_len", lambda t, a: torch.cat([t, t[:1]])), None, ("hist_len",)),
        C("hist_len-len-B-1", "H10", _map("hist_len", lambda t, a: t[:1].clone()), None, ("hist_len",)),
        C("restart-cache_base=None", "H11.none", _set(cache_base=None), "cache_base", ("cache_base",), restart=True),
        C("restart-hist_len-noncontig", "H11.contig", _map("hist_len", lambda t, a: _strided_1d(t)), "hist_len",
          ("hist_len",), restart=True),
        C("restart-cache_base-noncontig", "H11.contig", _map("cache_base", lambda t, a: _strided_1d(t)), "cache_base",
          ("cache_base",), restart=True),
        C("restart-hist_len=17", "H11.range", _cursor("hist_len", 0, 17), "hist_len", ("hist_len",), restart=True),
        C("restart-hist_len=-1", "H11.range", _cursor("hist_len", 0, -1), "hist_len", ("hist_len",), restart=True),
        C("restart-cache_base=32", "H11.range", _cursor("cache_base", 0, 32), "cache_base", ("cache_base",),
          restart=True),
        C("restart-cache_base=-1", "H11.range", _cursor("cache_base", 0, -1), "cache_base", ("cache_base",),
          restart=True),
        C("restart-pad-row-hist_len=17", "H11.range", _cursor("hist_len", 1, 17, pad_row=1), "hist_len",
          ("hist_len", "initial_state_indices"), restart=True, doc="pad rows are range-checked too"),
        C("cache_base-int64", "H12", _map("cache_base", lambda t, a: t.long()), None, ("cache_base",)),
        C("cache_base-len-B+1", "H12", _map("cache_base", lambda t, a: torch.cat([t, t[:1]])), None, ("cache_base",)),
        *[C(f"T={T}", "H13", _T(T), "T", ("T",), order=0) for T in (0, 1, 6, 9, 16)],
        *[C(f"flush_min={v}", "H14", _set(flush_min=v), "flush_min", ("flush_min",)) for v in (0, 14, -5)],
        C("flush_min=18-T", "H14", lambda kw, a: kw.update(flush_min=18 - kw["q"].shape[1]), "flush_min",
          ("flush_min", "q"), doc="one past the cap 17 - T, for any T"),
        *[C(f"{n}-block-strided", "H16", _map(n, lambda t, a: _block_strided(t)), None, (n,))
          for n in ("initial_state_source", "k_cache", "u_cache", "g_cache")],
        # 0.7.4's new arguments (H17-H22); in 0.7.2.post1 each is a keyword the function does not take
        C("pool-5d", "H17", _five_d(), None, ("initial_state_source", "backend"), doc="a uGPU pool, backend 'auto'"),
        C("pool-5d-hmma", "H17.backend", _five_d("hmma"), "backend", ("initial_state_source", "backend")),
        C("pdl_trigger", "", _set(pdl_trigger=True), None, ("pdl_trigger",),
          doc="legal on HMMA; UMMA does not serve it (H19 keeps the call on HMMA)"),
        C("backend=auto", "", _set(backend="auto"), None, ("backend",)),
        C("backend=hmma", "", _set(backend="hmma"), None, ("backend",)),
        C("backend=garbage", "H18", _set(backend="mma"), "backend", ("backend",)),
        C("backend=UMMA", "H18", _set(backend="UMMA"), "backend", ("backend",), doc="case-sensitive"),
        C("backend=umma", "H20", _set(backend="umma"), "backend", ("backend",)),
        C("stochastic_rounding=none", "", _set(stochastic_rounding="none"), None, ("stochastic_rounding",)),
        C("stochastic_rounding=philox", "H22", _set(stochastic_rounding="philox"), "stochastic_rounding",
          ("stochastic_rounding",)),
        C("stochastic_rounding=lcg", "H22", _set(stochastic_rounding="lcg"), "stochastic_rounding",
          ("stochastic_rounding",)),
        C("stochastic_rounding=garbage", "H22", _set(stochastic_rounding="Philox"), "stochastic_rounding",
          ("stochastic_rounding",)),
        C("rand_seed=garbage", "", _set(rand_seed="not a tensor"), None, ("rand_seed",),
          doc="never read unless the mode is philox or lcg"),
        C("philox_rounds=0", "", _set(philox_rounds=0), None, ("philox_rounds",),
          doc="read only with 'philox'"),
        # the UMMA entry's own options (a keyword the flush entry does not take)
        C("heads_per_cta=3", "signature", _set(heads_per_cta=3), "heads_per_cta", ("heads_per_cta",)),
        C("heads_per_cta=1", "signature", _set(heads_per_cta=1), None, ("heads_per_cta",)),
        C("philox-seeded", "H22", _both(_set(stochastic_rounding="philox"), _seed()), None,
          ("stochastic_rounding", "rand_seed")),
        C("philox_rounds=0-seeded", "H22", _both(_set(stochastic_rounding="philox", philox_rounds=0),
                                                             _seed()), "philox_rounds",
          ("stochastic_rounding", "rand_seed", "philox_rounds")),
        C("lcg-seed-int32", "H22", _both(_set(stochastic_rounding="lcg"), _seed(torch.int32)), "rand_seed",
          ("stochastic_rounding", "rand_seed")),
    ]
    return out


CHANGES: dict[str, Change] = {c.id: c for c in _changes()}


# ------------------------------------------------------------------ the prefix materializer's call (PMH1-PMH19)

PM_POOL = 4  # the valid base call of gdn_prefix_materialize: request 0 folds 3 entries from slot 0 into slot 1,
# request 1 folds 13 entries (its window wraps past ring slot 31) from slot 2 into slot 3; H = 1, HV = 2, R = 32


def pm_base_call(arm: str = "bf16", device="cpu", heads: tuple[int, int] = (H, HV)) -> dict:
    """The keyword arguments of a valid gdn_prefix_materialize call (fresh tensors each time)."""
    case = PrefixCase(arm=arm, H=heads[0], HV=heads[1], pool=PM_POOL, ring=32, seed=11,
                      requests=(Request(0, 1, 5, 3, 3), Request(2, 3, 30, 13, 13)))
    return materialize_prefix(case, device)


def _rings(fn):
    def f(kw, arm):
        for n in ("k_cache", "u_cache", "g_cache"):
            kw[n] = fn(kw[n])
    return f


def _slots(t: torch.Tensor, R: int) -> torch.Tensor:
    """The ring t with R slots (dim 2): cut or repeated."""
    idx = torch.arange(R, device=t.device) % t.shape[2]
    return t[:, :, idx].contiguous()


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    idx = torch.arange(n, device=t.device) % max(t.shape[1], 1)
    return t[:, idx].contiguous()


def _slot_stride(t: torch.Tensor, extra: int) -> torch.Tensor:
    """Same values, dense inner dims, slot stride = dense size + extra elements (a paged pool when extra keeps
    16-byte slots; misaligned slots otherwise)."""
    dense = t[0].numel()
    big = torch.zeros(t.shape[0] * (dense + extra) + extra, dtype=t.dtype, device=t.device)
    v = big.as_strided(t.shape, (dense + extra, *t.stride()[1:]))
    v.copy_(t)
    return v


def _overlapping(t: torch.Tensor) -> torch.Tensor:
    return t.as_strided(t.shape, (t[0].numel() // 2, *t.stride()[1:]))


def _offset(t: torch.Tensor) -> torch.Tensor:
    """Same values, contiguous, at a data_ptr one element past a 16-byte boundary."""
    big = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = big[1:].view(t.shape)
    v.copy_(t)
    return v


def _active(num_active: bool = False, dtype=torch.int32, length: int = 0, strided: bool = False, na_dtype=torch.int32,
            na_len: int = 1):
    def f(kw, arm):
        cnt = kw["count"]
        live = [i for i, c in enumerate(cnt.tolist()) if c >= 0]
        lst = torch.tensor(live + [-1] * (cnt.shape[0] - len(live) + length), dtype=dtype, device=cnt.device)
        kw["active_request_indices"] = _strided_1d(lst) if strided else lst
        if num_active:
            kw["num_active"] = torch.tensor([len(live)] * na_len, dtype=na_dtype, device=cnt.device)
    return f


def _empty(kw, arm):
    for n in ("src_slots", "dst_slots", "cache_base", "count"):
        kw[n] = kw[n][:0].clone()


def _pm_changes() -> list[Change]:
    C = Change
    M = ("materialize",)
    meta = ("src_slots", "dst_slots", "cache_base", "count")
    out = [
        C("pm.state-3d", "PMH1", _map("state", lambda t, a: t[:, 0].contiguous()), "state", ("state",)),
        *[C(f"pm.{n}-{d}d", "PMH2", _map(n, fn), n, (n,)) for n, d, fn in (
            ("k_cache", 3, lambda t, a: t[:, 0].contiguous()), ("u_cache", 3, lambda t, a: t[:, 0].contiguous()),
            ("g_cache", 4, lambda t, a: t[..., None].contiguous()))],
        C("pm.state-K=64", "PMH3", _map("state", lambda t, a: t[..., :64].contiguous()), None, ("state",)),
        C("pm.k_cache-H=0", "PMH4.zero", _map("k_cache", lambda t, a: t[:, :0].contiguous()), None, ("k_cache",),
          doc="HV % 0: the ZeroDivisionError PMH4 leaves unguarded"),
        C("pm.k_cache-H=3", "PMH4", _map("k_cache", lambda t, a: _heads(t, 3)), None, ("k_cache",)),
        C("pm.k_cache-K=64", "PMH5", _map("k_cache", lambda t, a: t[..., :64].contiguous()), None, ("k_cache",)),
        C("pm.u_cache-V=64", "PMH5", _map("u_cache", lambda t, a: t[..., :64].contiguous()), None, ("u_cache",)),
        C("pm.u_cache-HV+1", "PMH6", _map("u_cache", lambda t, a: _heads(t, t.shape[1] + 1)), "u_cache", ("u_cache",)),
        C("pm.g_cache-HV+1", "PMH6", _map("g_cache", lambda t, a: _heads(t, t.shape[1] + 1)), "g_cache", ("g_cache",)),
        *[C(f"pm.{n}-{tag}", "PMH7", _map(n, (lambda t, a, mk=mk: t.to(mk(a)))), n, (n,))
          for n in ("k_cache", "u_cache")
          for tag, mk in (("fp32", lambda a: torch.float32), ("other-half", lambda a: _other_half(a.ring)))],
        C("pm.u_cache-16-slots", "PMH8", _map("u_cache", lambda t, a: _slots(t, 16)), "u_cache", ("u_cache",)),
        C("pm.g_cache-16-slots", "PMH8", _map("g_cache", lambda t, a: _slots(t, 16)), "g_cache", ("g_cache",)),
        C("pm.rings-24-slots", "PMH9", _rings(lambda t: _slots(t, 24)), None, ("k_cache", "u_cache", "g_cache")),
        C("pm.rings-8-slots", "PMH9", _rings(lambda t: _slots(t, 8)), None, ("k_cache", "u_cache", "g_cache")),
        C("pm.rings-16-slots", "", _rings(lambda t: _slots(t, 16)), None, ("k_cache", "u_cache", "g_cache"),
          doc="the STP ring (PMS8)"),
        C("pm.rings-64-slots", "", _rings(lambda t: _slots(t, 64)), None, ("k_cache", "u_cache", "g_cache"),
          doc="accepted: any power of two >= 16 (PMH9)"),
        C("pm.g_cache-bf16", "PMH10", _map("g_cache", lambda t, a: t.to(torch.bfloat16)), "g_cache", ("g_cache",)),
        C("pm.g_cache-fp64", "PMH10", _map("g_cache", lambda t, a: t.double()), "g_cache", ("g_cache",)),
        *[C(f"pm.{n}-int64", "PMH11", _map(n, lambda t, a: t.long()), n, (n,)) for n in meta],
        C("pm.src_slots-2d", "PMH11", _map("src_slots", lambda t, a: t[:, None].contiguous()), "src_slots",
          ("src_slots",)),
        *[C(f"pm.{n}-len-B+1", "PMH12", _map(n, lambda t, a: torch.cat([t, t[:1]])), None, (n,))
          for n in ("dst_slots", "cache_base", "count")],
        C("pm.num_active-int64", "PMH13", _active(True, na_dtype=torch.int64), "num_active",
          ("active_request_indices", "num_active")),
        C("pm.num_active-2el", "PMH13", _active(True, na_len=2), "num_active", ("active_request_indices", "num_active")),
        C("pm.num_active-cpu", "", lambda kw, a: kw.update(num_active=torch.tensor([2], dtype=torch.int32)),
          None, ("num_active",), doc="a CPU num_active: legal by its value; PMH13's device condition "
          "(pm_num_active_off_cuda) rejects it where the module probes devices"),
        C("pm.active-int64", "PMH14", _active(True, dtype=torch.int64), "active_request_indices",
          ("active_request_indices", "num_active")),
        C("pm.active-len-B+1", "PMH14", _active(True, length=1), "active_request_indices",
          ("active_request_indices", "num_active")),
        C("pm.state-other-half", "PMH15", _map("state", lambda t, a: t.to(_other_half(a.state))), "state", ("state",)),
        C("pm.state-fp32", "PMH15", _map("state", lambda t, a: t.float()), "state", ("state",)),
        C("pm.empty", "", _empty, None, meta, doc="B = 0: a no-op after PMH15 (PMS6)"),
        *[C(f"pm.{n}-inner-strided", "PMH17", _map(n, lambda t, a: _inner_strided(t)), n, (n,))
          for n in ("state", "k_cache", "u_cache")],
        C("pm.state-overlapping", "PMH17", _map("state", lambda t, a: _overlapping(t)), "state", ("state",)),
        C("pm.k_cache-misaligned-slots", "PMH17", _map("k_cache", lambda t, a: _slot_stride(t, 1)), "k_cache",
          ("k_cache",), doc="a slot stride that is not a multiple of 16 bytes"),
        C("pm.state-paged", "", _map("state", lambda t, a: _slot_stride(t, 64)), None, ("state",),
          doc="a paged pool: slot stride padded by 128 bytes (PMH17 accepts it)"),
        C("pm.g_cache-odd-slot-stride", "", _map("g_cache", lambda t, a: _slot_stride(t, 1)), None, ("g_cache",),
          doc="fp32 g is exempt from the 16-byte slot rule (PMH17)"),
        *[C(f"pm.{n}-strided", "PMH18", _map(n, lambda t, a: _strided_1d(t)), n, (n,))
          for n in ("src_slots", "count")],
        C("pm.active-strided", "PMH18", _active(True, strided=True), "active_request_indices",
          ("active_request_indices", "num_active")),
        C("pm.count-offset", "PMH19", _map("count", lambda t, a: _offset(t)), None, ("count",)),
        C("pm.state-offset", "PMH19", _map("state", lambda t, a: _offset(t)), None, ("state",)),
        C("pm.active-given", "", _active(False), None, ("active_request_indices",),
          doc="the list given, num_active left to the wrapper ([B])"),
        C("pm.active-and-num_active", "", _active(True), None, ("active_request_indices", "num_active"),
          doc="both given: the CUDA-graph path"),
        C("pm.min_blocks_per_mp=4", "", _set(min_blocks_per_mp=4), None, ("min_blocks_per_mp",)),
        C("pm.pdl_trigger", "", _set(pdl_trigger=True), None, ("pdl_trigger",),
          doc="a keyword the materializer does not take"),
    ]
    return [dataclasses.replace(c, entries=M) for c in out]


PM_CHANGES: dict[str, Change] = {c.id: c for c in _pm_changes()}


def changes_of(entry: str) -> dict[str, Change]:
    """The changes written for an entry point's call: the materializer's own (PM_CHANGES), else the flush call's."""
    return PM_CHANGES if entry == "materialize" else CHANGES


def base_call_for(entry: str, arm: str, device="cpu", heads: tuple[int, int] = (H, HV)) -> dict:
    """The valid base call of an entry point (T = 4 for the flush entries: the flush_min changes are written for it)."""
    if entry == "materialize":
        return pm_base_call(arm, device, heads)
    return base_call(arm, 4, device, heads)


def get_change(cid: str) -> Change:
    try:
        return CHANGES[cid] if cid in CHANGES else PM_CHANGES[cid]
    except KeyError:
        raise ValueError(f"change={cid!r} is unknown; see gdn_fuzz.properties.hostchecks.CHANGES and PM_CHANGES") from None


def apply_changes(kw: dict, arm: Arm | str, changes: Iterable[Change]) -> dict:
    arm = get_arm(arm) if isinstance(arm, str) else arm
    chs = sorted(changes, key=lambda c: c.order)
    if any(c.restart for c in chs):
        kw["restart_hist_on_flush"] = True
    for c in chs:
        c.apply(kw, arm)
    return kw


def compatible(changes: Iterable[Change]) -> bool:
    seen: set = set()
    for c in changes:
        if seen & set(c.touches):
            return False
        seen |= set(c.touches)
    return True


# ------------------------------------------------------------------ the environment of a call


@functools.lru_cache(maxsize=None)
def capture_probe_raises() -> bool:
    """torch.cuda.is_current_stream_capturing() raises here (a CPU build of torch).  Asked on first use,
    never at import: on a CUDA build the call initializes CUDA, and a process that forks campaign workers
    afterwards would hand them a broken CUDA context."""
    try:
        torch.cuda.is_current_stream_capturing()
    except RuntimeError:
        return True
    return False


CVT_RS_CC = ((10, 0), (10, 3), (10, 7))  # U _CVT_RS_CC: archs whose ptxas takes cvt.rs


@dataclass(frozen=True)
class Env:
    """Where a call runs, as far as host checks see it.

    capture_raises: torch.cuda.is_current_stream_capturing() raises (a CPU build of torch)
    cc:             the compute capability the device probe reports (None: the probe rejects the call's
                    device): the CUDA tensors' GPU, or an SM100 stand-in's that answers the probe for CPU
                    tensors (tests/sm100.py), so that the checks after it run on the CPU
    A module with no device probe (the reference, a user's CPU kernel: probes_device() is False) has
    no device or capture probe: ANY_DEVICE.
    """

    capture_raises: bool | None = None  # None: capture_probe_raises(), asked when a condition needs it
    cc: tuple[int, int] | None = None

    @staticmethod
    def for_call(kw: dict, module=None, standin_cc: tuple[int, int] | None = None) -> "Env":
        if module is not None and not probes_device(module):
            return ANY_DEVICE
        if standin_cc is not None:
            return Env(cc=tuple(standin_cc))
        q = kw.get("q", kw.get("state"))  # the materializer has no q: its state pool
        if isinstance(q, torch.Tensor) and q.device.type == "cuda":
            return Env(cc=tuple(torch.cuda.get_device_capability(q.device)))
        return Env()


def probes_device(module) -> bool:
    """The module resolves its device like FlashInfer's GDN kernels do (it imports gdn_device_target): then
    the device and capture probes of the model apply to it; the reference target has neither."""
    return callable(getattr(module, "gdn_device_target", None))


@dataclass
class Call:
    """One call as the conditions see it: its keyword arguments, its arm, the module, the environment."""

    kw: dict
    arm: Arm
    env: Env
    module: object = None


def _t(x) -> bool:
    return isinstance(x, torch.Tensor)


def _restart_cursors(c: Call) -> bool:
    kw = c.kw
    hl, cb = kw.get("hist_len"), kw.get("cache_base")
    return bool(kw.get("restart_hist_on_flush", True)) and _t(hl) and _t(cb) and hl.is_contiguous() and cb.is_contiguous()


def _no_device(c: Call) -> bool:
    return c.env.cc is None


def _umma_eligible(c: Call, backend=UMMA) -> bool:
    """The conditions of _umma_unavailable_reason (F 3251-3277), as the UMMA Backend's data states them."""
    kw = c.kw
    q, k, v = kw.get("q"), kw.get("k"), kw.get("v")
    if c.env.cc is None or not (_t(q) and _t(k) and _t(v)) or q.dim() != 4:
        return False
    pools = [kw.get(n) for n in ("initial_state_source", "k_cache", "u_cache", "g_cache")]
    return backend.serves(c.arm.name, q.shape[1], q.shape[2], v.shape[2], c.env.cc[0],
                          all(_t(p) and p.is_contiguous() for p in pools), bool(kw.get("pdl_trigger", False)),
                          HK=k.shape[2])


def _rounding(c: Call) -> bool:
    return c.kw.get("stochastic_rounding") not in (None, "none")


def _seeded_off_cuda(c: Call) -> bool:
    s = c.kw.get("rand_seed")
    return c.kw.get("stochastic_rounding") in ("philox", "lcg") and _t(s) and not s.is_cuda


def _pm_num_active_off_cuda(c: Call) -> bool:
    """PMH13 of a module that probes devices: the num_active it is given, or derives on count's device (or
    [B] beside a given list), is not a CUDA tensor."""
    if c.module is not None and not probes_device(c.module):
        return False
    na = c.kw.get("num_active")
    t = na if _t(na) else c.kw.get("count")
    return _t(t) and not t.is_cuda


ANY_DEVICE = Env(capture_raises=False, cc=(0, 0))  # probes that never refuse; no GPU generation to route on

CONDITIONS: dict[str, Callable[[Call], bool]] = {
    "restart_cursors": _restart_cursors,
    "cpu_torch": lambda c: capture_probe_raises() if c.env.capture_raises is None else c.env.capture_raises,
    "no_device": _no_device,
    "not_hmma": lambda c: c.kw.get("backend", "auto") != "hmma",
    "umma_module": lambda c: getattr(c.module, "_UMMA", None) is not None,
    "umma_eligible": _umma_eligible,
    "rounding_requested": _rounding,
    "no_cvt_rs": lambda c: c.env.cc not in CVT_RS_CC,
    "seeded_off_cuda": _seeded_off_cuda,
    "hist_len_given": lambda c: c.kw.get("hist_len") is not None,
    "pm_num_active_off_cuda": _pm_num_active_off_cuda,
    "pm_empty": lambda c: _t(c.kw.get("src_slots")) and c.kw["src_slots"].shape[0] == 0,
}


# ------------------------------------------------------------------ the expectation


class NotModelled(LookupError):
    """The release model says nothing about this change at this entry point."""


@dataclass(frozen=True)
class Expected:
    """What a call must do: raise at `check` of entry `entry` (None: pass every host check)."""

    release: str
    entry: str
    check: Check | None
    named: tuple[str, ...] = ()  # the message must name one of these
    route: tuple[str, ...] = ()  # entries walked ("flush", "umma")

    @property
    def exc(self) -> str | None:
        return self.check.exc if self.check else None

    def describe(self) -> str:
        if self.check is None:
            return "passes every host check"
        named = f", naming {' or '.join(self.named)}" if self.named else ""
        return f"{self.check.exc} at {self.check.id} [{self.check.clause}]{named}"


def catch(entry: EntryModel, change: Change) -> str | None:
    """The check of `entry` that rejects `change`, None where it is legal; NotModelled otherwise.
    A change of an argument the entry does not take is caught by its signature."""
    if change.id in entry.catches:
        return entry.catches[change.id]
    if any(t not in entry.params for t in change.touches if t != "T"):
        return "signature"
    if change.legal:
        return None
    if entry.has(change.check):
        return change.check
    raise NotModelled(f"change {change.id!r} is not modelled for the {entry.name} entry")


def expect(release: Release, entry: str, changes: Iterable[Change], call: Call) -> Expected:
    """Walk the entry's checks in order; the first that fires is the expectation (module docstring)."""
    changes = list(changes)
    route = []
    name = entry
    while True:
        em = release.entry(name)
        route.append(name)
        # a routed call gets the keywords the router passes on, all of them parameters there
        unknown = [k for k in call.kw if k not in em.params] if len(route) == 1 else []
        tripped: dict[str, list[Change]] = {}
        for ch in changes:
            cid = catch(em, ch)
            if cid is not None:
                tripped.setdefault(cid, []).append(ch)
        nxt = None
        for chk in em.order:
            if chk.gate and not all(CONDITIONS[g](call) for g in chk.gate):
                continue
            if chk.id == "signature":
                if unknown:
                    return Expected(release.version, name, chk, tuple(unknown), tuple(route))
                continue
            if chk.id in tripped:
                # the message names the argument of whichever of these it reports: ask for one of them only
                # when each of them would be named
                names = [c.named for c in tripped[chk.id]]
                named = tuple(names) if chk.names and all(names) else ()
                return Expected(release.version, name, chk, named, tuple(route))
            if chk.when and all(CONDITIONS[w](call) for w in chk.when):
                if chk.route:
                    nxt = chk.route
                    break
                if not chk.exc:  # the call returns here, without an error (the materializer's B == 0, PMS6)
                    return Expected(release.version, name, None, (), tuple(route))
                return Expected(release.version, name, chk, (), tuple(route))
        if nxt is None:
            return Expected(release.version, name, None, (), tuple(route))
        name = nxt


def expect_for(release: Release, entry: str, changes: Iterable[Change], kw: dict, arm: Arm | str, module,
               standin_cc: tuple[int, int] | None = None) -> Expected:
    """expect() of the call `kw` (changes applied) to `module` in its own environment (Env.for_call)."""
    arm = get_arm(arm) if isinstance(arm, str) else arm
    return expect(release, entry, changes, Call(kw, arm, Env.for_call(kw, module, standin_cc), module))


# ------------------------------------------------------------------ what a target did, judged


@dataclass(frozen=True)
class Observed:
    exc: str | None  # None: returned normally
    message: str = ""

    def describe(self) -> str:
        return "returned normally" if self.exc is None else f"{self.exc}: {self.message.splitlines()[0][:160] if self.message else '(empty message)'}"


def observe_call(fn: Callable[..., object], kw: dict) -> Observed:
    try:
        fn(**kw)
    except Exception as e:  # noqa: BLE001 - the exception is the observation
        return Observed(type(e).__name__, str(e))
    return Observed(None)


def names_argument(message: str, arg: str) -> bool:
    """The message names `arg` as a word of its own (q in 'q=torch.float32', not in 'require')."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(arg)}(?![A-Za-z0-9_])", message) is not None


def judge(expected: Expected, observed: Observed) -> str | None:
    """None when the target did what the model says (type; named argument), else what differs."""
    if expected.check is None:
        if observed.exc is None:
            return None
        return f"expected to pass every host check, raised {observed.describe()}"
    if observed.exc is None:
        return f"expected {expected.describe()}, returned normally"
    if observed.exc != expected.check.exc:
        return f"expected {expected.describe()}, raised {observed.describe()}"
    if expected.named and not any(names_argument(observed.message, a) for a in expected.named):
        return (f"expected {expected.describe()}: the message does not name {' or '.join(expected.named)}: "
                f"{observed.message[:200]!r}")
    return None


def applies(change: Change, arm: str) -> bool:
    return arm in change.arms


def changes_for(entry: EntryModel, arm: str | None = None, legal: bool | None = None) -> list[Change]:
    """The changes the entry's model covers (those catch() can place), optionally for one arm."""
    out = []
    for c in changes_of(entry.name).values():
        if arm is not None and not applies(c, arm):
            continue
        if legal is not None and c.legal != legal:
            continue
        try:
            catch(entry, c)
        except NotModelled:
            continue
        out.append(c)
    return out


@dataclass
class Probe:
    """One call of one target with some changes: its expectation and what it did."""

    changes: tuple[str, ...]
    arm: str
    expected: Expected
    observed: Observed
    problem: str | None = None
    inputs_changed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.inputs_changed


def probe(fn: Callable[..., object], module, release: Release, entry: str, arm: str, changes: Iterable[Change],
          device="cpu", extra: dict | None = None, standin_cc=None, heads: tuple[int, int] = (H, HV),
          observe: Callable[[Callable[..., object], dict], Observed] | None = None) -> Probe:
    """Build the base call on `device`, apply the changes (and `extra` keyword arguments), predict it from the
    release model, call `fn` (through `observe`, default observe_call), judge.  A rejected call must leave
    every input tensor bitwise unchanged."""
    from gdn_fuzz.observation import clone_inputs, same_bits

    changes = list(changes)
    kw = base_call_for(entry, arm, device, heads)
    if extra:
        kw.update(extra)
    apply_changes(kw, arm, changes)
    exp = expect_for(release, entry, changes, kw, arm, module, standin_cc)
    before = {k: v for k, v in clone_inputs(kw).items() if isinstance(v, torch.Tensor)}
    obs = (observe or observe_call)(fn, kw)
    changed = ()
    if obs.exc is not None:
        changed = tuple(n for n, old in before.items()
                        if not (isinstance(kw.get(n), torch.Tensor) and kw[n].shape == old.shape
                                and kw[n].dtype == old.dtype and bool(same_bits(old, kw[n]).all())))
    return Probe(tuple(c.id for c in changes), arm, exp, obs, judge(exp, obs), changed)


def unvalidated_on_device(module, release: Release, entry: str, arm: str, change: Change, device,
                          extra: dict | None = None) -> bool:
    """The change is illegal but the release model says the call passes every host check on `device`: an
    input the release does not validate.  On a GPU such a call would launch the kernel on garbage, so the
    CUDA-tensor probes (tests, `gdn-fuzz diff`) do not make it."""
    if change.legal:
        return False
    kw = apply_changes(base_call_for(entry, arm, device) | (extra or {}), arm, [change])
    return expect_for(release, entry, [change], kw, arm, module).check is None


def single_calls(entry: EntryModel, change: Change, extras: Iterable[dict] = ({},), arms: Iterable[str] | None = None):
    """(arm, extra) of every call a single-change probe of `change` makes: each arm the change applies to and
    the entry serves (or of `arms`), with each extra keyword set that does not touch what the change touches."""
    for extra in extras:
        if extra and set(extra) & set(change.touches):
            continue
        for arm in change.arms:
            if arm in entry.arms and (arms is None or arm in arms):
                yield arm, extra


def single_change_table(fn_for: Callable[[str], Callable[..., object]], module_for: Callable[[str], object],
                        release: Release, entry: str, device="cpu", arms: Iterable[str] | None = None,
                        extras: Iterable[dict] = ({},), standin_cc=None) -> list[Probe]:
    """Every single change the entry's model covers, on every arm it applies to (or `arms`), with each of
    `extras` (e.g. {} and {"backend": "hmma"}): the probes a release differential tabulates."""
    em = release.entry(entry)
    return [probe(fn_for(arm), module_for(arm), release, entry, arm, [c], device, extra, standin_cc)
            for c in changes_for(em) for arm, extra in single_calls(em, c, extras, arms)]


__all__ = ["Change", "CHANGES", "get_change", "apply_changes", "compatible", "Env", "Call", "CONDITIONS",
           "Expected", "NotModelled", "catch", "expect", "expect_for", "Observed", "observe_call", "judge", "names_argument",
           "changes_for", "probe", "Probe", "base_call", "with_T", "single_calls", "single_change_table",
           "unvalidated_on_device", "PM_CHANGES", "changes_of", "base_call_for", "pm_base_call"]
