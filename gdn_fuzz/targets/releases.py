"""What each supported FlashInfer release promises at the host, as data: one model per release.

A release model says, per entry point, which parameters the function takes, which host checks it
runs **in which order**, the exception type of each and whether its message names the argument it
rejects; which changes of a valid call each check catches where that differs from the check's
own clause; which dtype arms and T each backend serves; and, per backend, which known bugs the
code has (seen on a GPU, or read from the source).  Nothing here is code about a version: the
host-check tests, the `guards` property and `gdn-fuzz diff` read these tables
(gdn_fuzz.properties.hostchecks interprets them), so a new release is a new table.

Which model applies to a target is get_target(name, release=VERSION) where a caller gives one, else
detected from its file (detect()):
  1. the file's SHA-256 is one a model lists (the released file itself): that model, exactly;
  2. the file declares ``GDN_FUZZ_RELEASE_MODEL = "VERSION"`` at module level (the reference target
     does; so can a user's kernel that follows a release's host checks);
  3. GDN_FUZZ_RELEASE=VERSION (`gdn-fuzz run --release`, pytest --gdn-release set it): that model, for
     every file rules 1 and 2 do not place (a user's kernel, an edited or a newer release);
  4. the file lies inside an installed flashinfer-python: that distribution's version (an edited
     install is modelled by its version, with a warning); a version newer than the newest model is
     modelled by the newest one, with one warning line, and a check that moved shows up as a
     contract change (tests/test_host_checks.py, `gdn-fuzz diff`), not as a wall of failures;
  5. otherwise the entry point's parameters (read with ast, nothing imported): the newest model
     whose parameters the function has, with a warning.
Mutants of the released file are modelled by their base file.

Release files that are not installed (an older release next to the installed one) are found in
$GDN_FUZZ_RELEASES (folders, os.pathsep-separated), ~/.cache/gdn_fuzz/releases and any
``releases/`` folder beside a sys.path entry (the GPU bundle's layout), each holding
``VERSION/flashinfer/gdn_kernels/*.py``; `gdn-fuzz release fetch VERSION` puts them in the cache.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from gdn_fuzz.arms import ARM_NAMES

RELEASE_ENV = "GDN_FUZZ_RELEASE"
RELEASES_DIRS_ENV = "GDN_FUZZ_RELEASES"
DIST = "flashinfer-python"
KERNELS = ("flashinfer", "gdn_kernels")
FLUSH_FILE = "gdn_decode_bf16_wy_ucache_flush.py"
UMMA_FILE = "gdn_replay_mtp_umma.py"
PM_FILE = "gdn_prefix_materialize.py"
DECLARE = "GDN_FUZZ_RELEASE_MODEL"  # a module-level string a target file may set (step 3 above)


class ReleaseModelWarning(UserWarning):
    """The release model of a file was not matched exactly (an edited or newer release, a user's file)."""


@dataclass(frozen=True)
class Check:
    """One host check of an entry point.

    id      unique within the entry ("H13", "H11.range", "H19.device", "U.T")
    clause  the contract clause it implements (kernel-contract.md, kernel-contract-0.7.4.md)
    exc     the exception type's name; "" for a check that does not raise: with `route` it hands the call on,
            without one the call returns there (the materializer's B == 0, PMS6)
    names   the message names the argument it rejects (False: a bare assert or a generic message)
    when    environment conditions (gdn_fuzz.properties.hostchecks.CONDITIONS) under which the check
            fires on *any* call that reaches it, whatever the arguments: the device probe on CPU
            tensors, the CUDA-graph capture probe on a CPU build of torch.  () = it fires only on the
            changes that it catches.
    route   an environment check that hands the call to another entry point of the release (H19 on
            an SM100 GPU routes eligible calls to the UMMA entry, whose own checks apply from there)
    gate    conditions without which the check does not run at all (0.7.4's H11 block runs only when
            hist_len is given)
    """

    id: str
    clause: str
    exc: str
    doc: str
    names: bool = True
    when: tuple[str, ...] = ()
    route: str | None = None
    gate: tuple[str, ...] = ()


@dataclass(frozen=True)
class EntryModel:
    """One entry point of one release: its parameters, its host checks in order, what they catch.

    catches maps a change id (gdn_fuzz.properties.hostchecks.CHANGES) to the check that rejects it,
    or None where this entry accepts the change; a change not listed is caught by the check whose id
    is the change's own `check`, when this entry has one (else it is not modelled for this entry)."""

    name: str  # "flush" | "umma" | "materialize"
    file: str
    function: str
    params: tuple[str, ...]
    order: tuple[Check, ...]
    catches: Mapping[str, str | None] = field(default_factory=dict)
    arms: tuple[str, ...] = ARM_NAMES

    def has(self, check_id: str) -> bool:
        return any(c.id == check_id for c in self.order)


@dataclass(frozen=True)
class Backend:
    """A kernel behind the flush entry point: where it runs and what it serves."""

    name: str  # "hmma" | "umma"
    sm_major: tuple[int, ...]  # GPU majors it launches on
    arms: tuple[str, ...]
    Ts: tuple[int, ...]
    heads_per_key: tuple[int, int] | None = None  # (min, max) HV / H it serves; None: any
    contiguous_pools: bool = False  # only contiguous pools (TMA descriptors)
    pdl: bool = True  # serves pdl_trigger=True
    doc: str = ""

    def serves(self, arm: str, T: int, H: int, HV: int, sm_major: int | None, contiguous: bool = True,
               pdl: bool = False, HK: int | None = None) -> bool:
        """This backend can run a launch of this shape on a GPU of this major (None: no GPU)."""
        if sm_major is None or sm_major not in self.sm_major or arm not in self.arms or T not in self.Ts:
            return False
        if self.heads_per_key is not None:
            lo, hi = self.heads_per_key
            if (HK if HK is not None else H) != H or H <= 0 or HV % H or not lo <= HV // H <= hi:
                return False
        if self.contiguous_pools and not contiguous:
            return False
        return self.pdl or not pdl


@dataclass(frozen=True)
class KnownBug:
    """A known bug of the released code, per backend: 'seen ...' (reproduced on a GPU: a corpus entry
    holds the case), 'src ...' (read from the source, not yet seen on that backend's GPU), or
    'absent ...' (the backend's code cannot show it, and why).  A finding with this signature is a
    known outcome on a backend whose evidence is seen or src, and a new finding on one where it is
    absent."""

    signature: str
    clause: str
    backends: Mapping[str, str]

    def present_on(self, backend: str) -> bool:
        ev = self.backends.get(backend)
        return ev is not None and not ev.startswith("absent")


@dataclass(frozen=True)
class Release:
    version: str
    files: Mapping[str, str]  # file name in flashinfer/gdn_kernels -> sha256 (files this model covers)
    entries: Mapping[str, EntryModel]
    backends: tuple[Backend, ...]
    known_bugs: tuple[KnownBug, ...] = ()

    def entry(self, name: str) -> EntryModel:
        try:
            return self.entries[name]
        except KeyError:
            raise KeyError(f"release {self.version} has no entry point {name!r} "
                           f"(it has {', '.join(self.entries)})") from None

    def known_on(self, backend: str) -> dict[str, KnownBug]:
        """{signature: KnownBug} of the bugs present on `backend`."""
        return {k.signature: k for k in self.known_bugs if k.present_on(backend)}

    def absent_on(self, backend: str) -> set[str]:
        return {k.signature for k in self.known_bugs if backend in k.backends and not k.present_on(backend)}


def _c(id, clause, exc, doc, names=True, when=(), route=None, gate=()) -> Check:
    return Check(id, clause, exc, doc, names, tuple(when), route, tuple(gate))


# ------------------------------------------------------------------ flush entry: checks shared by both releases

_FLUSH_PARAMS_072 = (
    "A_log", "a", "dt_bias", "softplus_beta", "softplus_threshold", "q", "k", "v", "b",
    "initial_state_source", "initial_state_indices", "output_state_indices", "intermediate_states_buffer",
    "accepted_steps", "ssm_state_indices", "disable_state_update", "use_qk_l2norm_in_kernel", "scale",
    "output", "disable_output", "recovery_steps", "k_cache", "u_cache", "g_cache", "hist_len", "cache_base",
    "flush_min", "restart_hist_on_flush", "pdl_trigger")
_FLUSH_PARAMS_074 = _FLUSH_PARAMS_072 + ("backend", "stochastic_rounding", "rand_seed", "philox_rounds")

SIGNATURE = _c("signature", "1.1", "TypeError", "a keyword argument the function does not take")
_HEAD = (
    SIGNATURE,
    _c("H1", "H1", "AssertionError", "q, k, v, b or the state pool is None (bare assert)", names=False),
    _c("H2", "H2", "NotImplementedError", "recovery_steps != 0, disable_output, intermediate_states_buffer, "
       "accepted_steps / ssm_state_indices, output_state_indices"),
    _c("H3", "H3", "AssertionError", "softplus_beta != 1, softplus_threshold != 20, use_qk_l2norm_in_kernel=False"),
    _c("H4", "H4", "AssertionError", "the state pool is not the module's STATE dtype"),
    _c("H5.unpack", "H5", "ValueError", "q is not 4-D (the shape unpack fails)", names=False),
    _c("H5", "H5", "AssertionError", "K or V != 128", names=False),
    _c("H6.none", "H1", "AttributeError", "a is None (its .dtype is read by the H6 assert)", names=False),
    _c("H6", "H6", "AssertionError", "q, k, v, a or b not in the module's IO dtype (the message lists all five)"),
)
_CAST = _c("N5.cast", "H1", "AttributeError", "A_log or dt_bias is None (the cast cache reads .dtype)", names=False)


def _h11(gate=()):
    return (
        _c("H11.none", "H11", "ValueError", "restart_hist_on_flush=True with cache_base=None", gate=gate),
        _c("H11.contig", "H11", "AssertionError", "restart_hist_on_flush=True with non-contiguous cursors", gate=gate),
        _c("H11.capture", "H11", "RuntimeError", "torch.cuda.is_current_stream_capturing() on a CPU build of torch, "
           "before the range checks", names=False, when=("restart_cursors", "cpu_torch"), gate=gate),
        _c("H11.range", "H11", "AssertionError", "restart_hist_on_flush=True: hist_len outside [0, 16] or cache_base "
           "outside [0, 32) (pad rows included)", gate=gate),
    )


_RINGS = (
    _c("H7", "H7", "AssertionError", "k_cache, u_cache, g_cache or hist_len is None (one message names all four)"),
    _c("H8.pool", "H8", "AssertionError", "state pool inner dims not dense"),
    _c("H9.k_dtype", "H9", "AssertionError", "k_cache not the RING dtype"),
    _c("H8.k", "H8", "AssertionError", "k_cache inner dims not dense"),
    _c("H9.k_shape", "H9", "AssertionError", "k_cache not [pool, H, 32, 128]"),
    _c("H9.u_dtype", "H9", "AssertionError", "u_cache not the RING dtype"),
    _c("H8.u", "H8", "AssertionError", "u_cache inner dims not dense"),
    _c("H9.u_shape", "H9", "AssertionError", "u_cache not [pool, HV, 32, 128] (bare assert)", names=False),
    _c("H9.g_dtype", "H9", "AssertionError", "g_cache not float32 (bare assert)", names=False),
    _c("H8.g", "H8", "AssertionError", "g_cache inner dims not dense"),
    _c("H9.g_shape", "H9", "AssertionError", "g_cache not [pool, HV, 32] (bare assert)", names=False),
    _c("H10", "H10", "AssertionError", "hist_len not int32 or not of length B (bare assert)", names=False),
)
_H12 = _c("H12", "H12", "AssertionError", "cache_base not int32 or not of length B (bare assert)", names=False)
_TAIL = (
    _c("H13", "H13", "NotImplementedError", "T not in {4, 8}"),
    _c("H14", "H14", "AssertionError", "flush_min outside [1, 17 - T]"),
    _c("H15", "H15", "ValueError", "the device probe (gdn_device_target): tensors not on a CUDA device",
       names=False, when=("no_device",)),
    _c("H16", "H16", "NotImplementedError", "a block-strided (paged) pool or ring without the strided-QKV mode",
       names=False),
)

FLUSH_072 = EntryModel(
    name="flush", file=FLUSH_FILE, function="gated_delta_rule_mtp_ucache_flush", params=_FLUSH_PARAMS_072,
    order=_HEAD + (_CAST,) + _RINGS + _h11() + (_H12,) + _TAIL,
    catches={
        # a [pool, 1, HV, V, K] (uGPU, one die) pool passes every 0.7.2.post1 host check (seen on CPU: the
        # call reaches the device probe): unvalidated there
        "pool-5d": None,
    },
)

FLUSH_074 = EntryModel(
    name="flush", file=FLUSH_FILE, function="gated_delta_rule_mtp_ucache_flush", params=_FLUSH_PARAMS_074,
    order=_HEAD + _h11(gate=("hist_len_given",)) + (  # H11 moved before the cast and the ring checks
        _c("H17", "H17", "ValueError", "a 5-D (uGPU) state pool with backend 'auto' or 'umma' where the Rubin build "
           "cannot run (on CPU tensors: the device probe inside it)", names=False),
        _c("H17.backend", "H17", "ValueError", "a 5-D (uGPU) state pool with backend other than 'auto' or 'umma'"),
        _CAST,
    ) + _RINGS + (
        _H12,
        _c("H18", "H18", "ValueError", "backend not one of 'auto', 'umma', 'hmma' (case-sensitive)"),
        _c("H19.route", "H19", "", "SM100-class GPU, fp16-state arm, 1 <= T <= 8, HV/H in 1..4, contiguous pools, "
           "no pdl_trigger: the call runs the UMMA entry", when=("not_hmma", "umma_module", "umma_eligible"),
           route="umma"),
        _c("H19.device", "H19", "ValueError", "backend 'auto'/'umma' with the UMMA module imported: the device probe "
           "(gdn_device_target) runs here, before H21, H22, H13 and H14", names=False,
           when=("not_hmma", "umma_module", "no_device")),
        _c("H20", "H20", "ValueError", "backend='umma' where the UMMA backend cannot serve the call"),
        _c("H21", "H21", "ValueError", "an fp16 u_cache beside bf16 rings on the HMMA path"),
        _c("H22", "H22", "NotImplementedError", "stochastic_rounding other than None/'none' on the HMMA path "
           "(the message says 'stochastic rounding', not the argument)", names=False),
    ) + _TAIL,
    catches={
        # H9': an fp16 u ring beside bf16 rings passes the dtype assert; the HMMA path rejects it at H21
        "u_cache-fp16-beside-bf16-ring": "H21",
        "pool-5d": "H17", "pool-5d-hmma": "H17.backend",
        # legal values of the new arguments (H18 accepts them; rand_seed and philox_rounds are never read on HMMA)
        "backend=auto": None, "backend=hmma": None, "stochastic_rounding=none": None,
        "rand_seed=garbage": None, "philox_rounds=0": None,
        # any rounding mode is refused on HMMA, seeded or not, before its seed or rounds are looked at
        "philox-seeded": "H22", "philox_rounds=0-seeded": "H22", "lcg-seed-int32": "H22",
    },
)

# The UMMA entry point (U 1364-1475 of 0.7.4): bare asserts first, then the device probe, then the
# options that need the device's target (heads_per_cta, stochastic rounding, the seed).
_UMMA_PARAMS = (
    "A_log", "a", "dt_bias", "softplus_beta", "softplus_threshold", "q", "k", "v", "b", "initial_state_source",
    "initial_state_indices", "use_qk_l2norm_in_kernel", "scale", "output", "k_cache", "u_cache", "g_cache",
    "hist_len", "cache_base", "flush_min", "restart_hist_on_flush", "row_order", "heads_per_cta",
    "stochastic_rounding", "rand_seed", "philox_rounds")
UMMA_074 = EntryModel(
    name="umma", file=UMMA_FILE, function="gated_delta_rule_mtp_ucache_flush_umma", params=_UMMA_PARAMS,
    order=(
        SIGNATURE,
        _c("U.softplus", "H3", "AssertionError", "softplus_beta != 1 or softplus_threshold != 20 (bare)", names=False),
        _c("U.l2norm", "H3", "AssertionError", "use_qk_l2norm_in_kernel=False (bare)", names=False),
        _c("U.none", "H1", "AssertionError", "q, k, v or b is None (bare)", names=False),
        _c("U.state", "H4", "AssertionError", "the state pool is None or not fp16 ('fp16 state pool required')",
           names=False),
        _c("U.unpack", "H5", "ValueError", "q is not 4-D", names=False),
        _c("U.KV", "H5", "AssertionError", "K or V != 128", names=False),
        _c("U.heads", "M9", "AssertionError", "HV % H != 0 or HV / H outside 1..4", names=False),
        _c("U.T", "H13", "AssertionError", "T outside 1..8"),
        _c("U.io", "H6", "AssertionError", "q, k or v not bf16 (bare; a and b are converted, not checked)",
           names=False),
        _c("U.rings", "H7", "AssertionError", "k_cache, u_cache, g_cache or hist_len is None (bare)", names=False),
        _c("U.k_dtype", "H9", "AssertionError", "k_cache not bf16 ('bf16 k ring required')", names=False),
        _c("U.u_dtype", "H9", "AssertionError", "u_cache neither bf16 nor fp16", names=False),
        _c("U.k_shape", "H9", "AssertionError", "k_cache not [pool, H, 32, 128] (bare)", names=False),
        _c("U.u_shape", "H9", "AssertionError", "u_cache not [pool, HV, 32, 128] (bare)", names=False),
        _c("U.g", "H9", "AssertionError", "g_cache not [pool, HV, 32] float32 (bare)", names=False),
        _c("U.flush_min", "H14", "AssertionError", "flush_min outside [1, 17 - T] (bare)", names=False),
        _c("U.cache_base", "H11", "AssertionError", "restart_hist_on_flush=True with cache_base=None"),
        _c("U.ab", "H1", "AttributeError", "a or b is None (a.contiguous() is called on it)", names=False),
        _c("U.device", "H15", "ValueError", "the device probe (gdn_device_target of q's device)", names=False,
           when=("no_device",)),
        _c("U.hpc", "M9", "ValueError", "heads_per_cta does not divide HV / H"),
        _c("U.sr", "N6", "ValueError", "stochastic_rounding not None, 'none', 'philox' or 'lcg'"),
        _c("U.philox_seed", "N6", "ValueError", "stochastic_rounding='philox' without rand_seed"),
        _c("U.cvt_rs", "N6", "NotImplementedError", "stochastic rounding on a GPU without cvt.rs", names=False,
           when=("rounding_requested", "no_cvt_rs")),
        _c("U.philox_rounds", "N6", "ValueError", "philox_rounds <= 0 with 'philox'"),
        _c("U.seed", "N6", "ValueError", "rand_seed not a one-element int64 CUDA tensor (philox or lcg); a CPU seed "
           "always (so on the SM100 stand-in of the tests, every seeded rounding call)", when=("seeded_off_cuda",)),
        _c("U.cast", "H1", "AttributeError", "A_log or dt_bias is None (_cached_f32 reads .dtype, after the device "
           "probe)", names=False),
    ),
    catches={
        # what U does not validate (it converts a/b, never reads the rest): accepted here
        "a-fp32": None, "a-other-half": None, "b-fp32": None, "b-other-half": None, "a=None": "U.ab",
        "hist_len-int64": None, "hist_len-len-B+1": None, "hist_len-len-B-1": None,
        "cache_base-int64": None, "cache_base-len-B+1": None,
        "restart-hist_len-noncontig": None, "restart-cache_base-noncontig": None,
        "restart-hist_len=17": None, "restart-hist_len=-1": None, "restart-cache_base=32": None,
        "restart-cache_base=-1": None, "restart-pad-row-hist_len=17": None,
        "initial_state_source-inner-strided": None, "k_cache-inner-strided": None, "u_cache-inner-strided": None,
        "g_cache-inner-strided": None, "pool-VK-transposed": None, "pool-dim0-stride0": None,
        "initial_state_source-block-strided": None, "k_cache-block-strided": None,
        "u_cache-block-strided": None, "g_cache-block-strided": None,
        # the checks U does have, by change
        "q=None": "U.none", "k=None": "U.none", "v=None": "U.none", "b=None": "U.none",
        "initial_state_source=None": "U.state", "A_log=None": "U.cast", "dt_bias=None": "U.cast",
        "softplus_beta=2": "U.softplus", "softplus_threshold=10": "U.softplus",
        "use_qk_l2norm_in_kernel=False": "U.l2norm",
        "pool-fp32": "U.state", "pool-other-half": "U.state", "q-K=64": "U.KV", "v-V=64": "U.KV",
        "q-3D": "U.unpack", "q-fp32": "U.io", "q-other-half": "U.io", "k-fp32": "U.io", "k-other-half": "U.io",
        "v-fp32": "U.io", "v-other-half": "U.io",
        "k_cache=None": "U.rings", "u_cache=None": "U.rings", "g_cache=None": "U.rings", "hist_len=None": "U.rings",
        "k_cache-fp32": "U.k_dtype", "k_cache-other-half": "U.k_dtype", "u_cache-fp32": "U.u_dtype",
        "u_cache-fp16-beside-bf16-ring": None,
        "k_cache-16-slots": "U.k_shape", "k_cache-pool+1": "U.k_shape", "k_cache-H=2": "U.k_shape",
        "u_cache-16-slots": "U.u_shape", "u_cache-pool+1": "U.u_shape", "g_cache-bf16": "U.g",
        "g_cache-fp64": "U.g", "g_cache-16-slots": "U.g",
        "restart-cache_base=None": "U.cache_base",
        "T=6": None, "T=1": None, "T=16": "U.T", "T=9": "U.T", "T=0": "U.T",
        "flush_min=0": "U.flush_min", "flush_min=14": "U.flush_min", "flush_min=-5": "U.flush_min",
        "flush_min=18-T": "U.flush_min", "pdl_trigger": "signature",
        "heads_per_cta=3": "U.hpc", "heads_per_cta=1": None,
        "stochastic_rounding=none": None, "stochastic_rounding=philox": "U.philox_seed",
        "stochastic_rounding=lcg": None, "stochastic_rounding=garbage": "U.sr",
        "philox-seeded": None, "philox_rounds=0-seeded": "U.philox_rounds", "lcg-seed-int32": "U.seed",
        "rand_seed=garbage": None, "philox_rounds=0": None,
    },
    arms=("bf16-state16",),
)

# The prefix materializer (PF 618-884 of 0.7.4, kernel-contract-0.7.4.md 2.2): every check a ValueError
# unless noted, in this order; PMS6 (B == 0) returns after PMH15, before the device probe.
_PM_PARAMS = ("state", "src_slots", "dst_slots", "k_cache", "u_cache", "g_cache", "cache_base", "count",
              "active_request_indices", "num_active", "min_blocks_per_mp")
MATERIALIZE_074 = EntryModel(
    name="materialize", file=PM_FILE, function="gdn_prefix_materialize", params=_PM_PARAMS,
    order=(
        SIGNATURE,
        _c("PMH1", "PMH1", "ValueError", "state not 4-D ('state must be [pool, HV, V, K]')"),
        _c("PMH2", "PMH2", "ValueError", "k_cache or u_cache not 4-D, or g_cache not 3-D (one message names all three)"),
        _c("PMH3", "PMH3", "ValueError", "state K or V != 128 ('this kernel is fixed at K == V == 128')", names=False),
        _c("PMH4.zero", "PMH4", "ZeroDivisionError", "k_cache with H = 0: HV % H raises, unguarded", names=False),
        _c("PMH4", "PMH4", "ValueError", "HV % H != 0 ('HV must be a multiple of H')", names=False),
        _c("PMH5", "PMH5", "ValueError", "a ring feature dim != the state's ('ring feature dims must match')",
           names=False),
        _c("PMH6", "PMH6", "ValueError", "u_cache or g_cache head dim != HV"),
        _c("PMH7", "PMH7", "ValueError", "k_cache or u_cache dtype != RING"),
        _c("PMH8", "PMH8", "ValueError", "the three ring depths disagree (the message lists all three)"),
        _c("PMH9", "PMH9", "ValueError", "ring depth R not a power of two, or R < 16", names=False),
        _c("PMH10", "PMH10", "ValueError", "g_cache not float32"),
        _c("PMH11", "PMH11", "ValueError", "src_slots, dst_slots, cache_base or count not a 1-D int32 tensor"),
        _c("PMH12", "PMH12", "ValueError", "dst_slots, cache_base or count not of length B ('per-request tensors')",
           names=False),
        _c("PMH13", "PMH13", "ValueError", "num_active not a one-element CUDA int32 tensor; on CPU tensors every call "
           "stops here (the derived num_active lives on count's device)", when=("pm_num_active_off_cuda",)),
        _c("PMH14", "PMH14", "ValueError", "active_request_indices not a 1-D int32 tensor of length B"),
        _c("PMH15", "PMH15", "ValueError", "state dtype != STATE"),
        _c("PMS6", "PMS6", "", "B == 0: returns state at once, before the device probe and the layout checks",
           when=("pm_empty",)),
        _c("PMH16", "PMH16", "ValueError", "the device probe (gdn_device_target): state not on a CUDA device",
           names=False, when=("no_device",)),
        _c("PMH17", "PMH17", "ValueError", "a non-contiguous pool tensor with an inner dim not dense, an overlapping "
           "slot stride, or (16-bit tensors) a slot stride that is not a multiple of 16 bytes"),
        _c("PMH18", "PMH18", "ValueError", "a non-contiguous metadata tensor"),
        _c("PMH19", "PMH19", "ValueError", "a data_ptr not 16-byte aligned (the message names no tensor)",
           names=False),
    ),
)

HMMA = Backend("hmma", sm_major=(9, 10, 11, 12), arms=ARM_NAMES, Ts=(4, 8),
               doc="the CuTe DSL mma.sync kernel (GdnDecodeUCacheFlushKernel); byte-identical in 0.7.2.post1 and 0.7.4")
UMMA = Backend("umma", sm_major=(10,), arms=("bf16-state16",), Ts=(1, 2, 3, 4, 5, 6, 7, 8),
               heads_per_key=(1, 4), contiguous_pools=True, pdl=False,
               doc="the tcgen05/TMEM kernel of gdn_replay_mtp_umma (SM100-class GPUs; fp16-state arm; a fp16 u ring "
                   "beside the bf16 k ring too); routed by backend='auto' (H19) or forced by 'umma'")

_SIG_STRIDED_AB = ("metamorphic.strided_ab.launch [H*] raised RuntimeError: The stride_order is not consistent "
                   "with the layout")
_SIG_STRIDED_POOL = ("metamorphic.strided_pool.launch [H*] raised RuntimeError: The stride_order is not consistent "
                     "with the layout")
_SIG_OUTPUT = ("output_inplace.strided.launch [H*] raised RuntimeError: The stride_order is not consistent with "
               "the deduced stride_order.")
_SIG_N5 = "params_inplace.oracle [N5] out of tolerance"

KNOWN_BUGS = (
    KnownBug(_SIG_STRIDED_AB, "1.1", {
        "hmma": "seen: 0.7.2.post1 and 0.7.4 on the H200 (corpus metamorphic-ed17efd4cd0e8e1c; F 3717-3731: the "
                "native-a/b test never asks a's token stride to be HV)",
        "umma": "absent (src): U 1465 copies a and b (.contiguous()) before the launch"}),
    KnownBug(_SIG_STRIDED_POOL, "H16", {
        "hmma": "seen (corpus metamorphic-45ca9f360f024946; _inner_dense returns is_contiguous(), True for a size-1 "
                "pool whatever its slot stride)",
        "umma": "src: the same _pools_contig flag makes such a pool UMMA-eligible; U builds TMA descriptors from "
                "it (behaviour on an SM100 GPU not seen)"}),
    KnownBug(_SIG_OUTPUT, "M8", {
        "hmma": "seen (corpus output_inplace-febd6b125224bd46; the alias branch keys on is_contiguous())",
        "umma": "absent (src): U writes `output` as given with no alias branch (U 1466-1467); a strided output is "
                "then written through compact strides, which the output_inplace property reports as another "
                "signature"}),
    KnownBug(_SIG_N5, "N5", {
        "hmma": "seen (corpus params_inplace-7e4dd41125537382; _cached_bf16 keys the cast by id(), F 3226-3248)",
        "umma": "src: _cached_f32 (U 1310-1322) reads fp32-contiguous sources fresh but caches every other source "
                "by id(), so an in-place reload of a bf16 or strided source is not seen"}),
)

_SIG_PM_ZERO = "pm.copy.zero_sign [PMS2] bits differ"
_SIG_PM_NAN = "pm.copy.nan [PMS2] bits differ"
_PM_COPY_SRC = ("PF 428-432 compute a count == 0 'copy' as fma.rn.f32(S0, bdec = 1.0, D = +0) then cvt.rn to STATE "
                "(_fold_fma_bf16x2, F 586-617)")
PM_KNOWN_BUGS = (
    KnownBug(_SIG_PM_ZERO, "PMS2", {
        "materialize": "seen: H200, 2026-12-03 (docs/h200-results.md run 44): -0 (0x8000) is stored as +0; "
                       + _PM_COPY_SRC + ", and (-0) * 1 + (+0) = +0 in round-to-nearest; every other non-NaN "
                       "pattern (subnormals and Inf included) survives"}),
    KnownBug(_SIG_PM_NAN, "PMS2", {
        "materialize": "seen: H200, 2026-12-03 (run 44): every NaN becomes the canonical 0x7fff (bf16), sign and "
                       "payload lost; " + _PM_COPY_SRC + ", and a NaN operand of fma.rn.f32 gives the canonical NaN"}),
)

R_072 = Release(
    version="0.7.2.post1",
    files=MappingProxyType({
        FLUSH_FILE: "f60e00d20a48e24be976d75a26250c05b837721a56bd82c0354f2fe8989188a4",
        "gdn_decode_bf16_wy_ucache.py": "e6e6c1118ee11b44213496de1bd973676a6d356a43dc95fb91db613c12e707d3",
    }),
    entries=MappingProxyType({"flush": FLUSH_072}),
    backends=(HMMA,),
    known_bugs=KNOWN_BUGS,
)

R_074 = Release(
    version="0.7.4",
    files=MappingProxyType({
        FLUSH_FILE: "ef69d82fa78899483bc0c6c0dbf8ccb26be89496fcaf77cc3fc49f07c24198bf",
        "gdn_decode_bf16_wy_ucache.py": "e6e6c1118ee11b44213496de1bd973676a6d356a43dc95fb91db613c12e707d3",
        UMMA_FILE: "05d67caf2961463ad329c71866cc3d8edc53ccb8b18101469af291b698718227",
        "gdn_replay_mtp_umma_rubin.py": "ad42bf71c1f53d2f14c4b47da6476516262a91598721b0247d5e45e1852bf9ef",
        "gdn_prefix_materialize.py": "fbbc6c67c02b28ddabacb11ac71b144d0265dda979a2a1427589ee313e84e368",
    }),
    entries=MappingProxyType({"flush": FLUSH_074, "umma": UMMA_074, "materialize": MATERIALIZE_074}),
    backends=(UMMA, HMMA),  # the order backend='auto' tries them (H19)
    known_bugs=KNOWN_BUGS + PM_KNOWN_BUGS,  # the materializer's under its one kernel, "materialize" (Target.backend_for)
)

RELEASES: dict[str, Release] = {r.version: r for r in (R_072, R_074)}
NEWEST = R_074
DEFAULT = R_074  # the pins of [gpu] and [kernel-cpu]


def _vkey(v: str) -> tuple:
    """A sortable key of a release version ("0.7.2.post1" < "0.7.4" < "0.7.10")."""
    out = []
    for part in v.replace("-", ".").split("."):
        num = "".join(ch for ch in part if ch.isdigit())
        out.append((0, int(num), part) if part.isdigit() else (1 if part.startswith("post") else -1, int(num or 0), part))
    return tuple(out)


def get_release(version: str) -> Release:
    try:
        return RELEASES[version]
    except KeyError:
        raise ValueError(f"release={version!r} has no model; modelled releases: {', '.join(RELEASES)} "
                         "(gdn_fuzz.targets.releases)") from None


# ------------------------------------------------------------------ detection

@dataclass(frozen=True)
class Detected:
    """The model that applies to a file, how it was chosen and whether it is an exact match."""

    release: Release
    how: str
    exact: bool
    warning: str | None = None

    def __str__(self) -> str:
        return f"{self.release.version} ({self.how})"


def gpu_major(device) -> int | None:
    """The compute-capability major of a CUDA `device`, None for other devices or where it cannot be told.
    A process that has not initialized CUDA does not start now (a campaign's driver forks its workers
    later, and they would inherit a broken context): it asks nvidia-smi instead, once per device."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    if torch.cuda.is_initialized():
        return torch.cuda.get_device_capability(torch.device(device))[0]
    return _smi_major(torch.device(device).index or 0, os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.lru_cache(maxsize=None)
def _smi_major(index: int, visible: str | None) -> int | None:
    ids = [v.strip() for v in visible.split(",")] if visible else None
    if ids is not None:
        if index >= len(ids) or not ids[index].isdigit():
            return None  # a UUID or MIG name: not mapped here
        index = int(ids[index])
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        return int(float(out[index]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _by_hash(digest: str) -> tuple[Release, str] | None:
    for r in sorted(RELEASES.values(), key=lambda r: _vkey(r.version), reverse=True):
        for fname, h in r.files.items():
            if h == digest:
                return r, fname
    return None


def _module_ast(path: Path) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def declared_model(path: Path) -> str | None:
    """The file's module-level GDN_FUZZ_RELEASE_MODEL string, if it sets one."""
    tree = _module_ast(path)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == DECLARE for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def function_params(path: Path, function: str) -> tuple[str, ...] | None:
    """The parameter names of `function` defined at module level in the file (read with ast)."""
    tree = _module_ast(path)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == function:
            a = node.args
            return tuple(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs))
    return None


def _installed_version_for(path: Path) -> str | None:
    """The flashinfer-python version when `path` lies in that installed distribution's package."""
    import importlib.metadata as md

    try:
        dist = md.distribution(DIST)
    except md.PackageNotFoundError:
        return None
    try:
        root = Path(dist.locate_file("flashinfer")).resolve()
        Path(path).resolve().relative_to(root)
    except (ValueError, OSError, TypeError):
        return None
    return dist.version


_WARNED: set = set()


def _warn_once(key: str, text: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(text, ReleaseModelWarning, stacklevel=3)


def detect(path: Path, entry: str = "flush", *, base: Path | None = None, warn: bool = True) -> Detected:
    """The release model for the target file `path` (its entry point `entry`); `base`: the file a mutant
    was made from (modelled as that file).  See the module docstring for the order of the rules."""
    path = Path(path)
    got = _detect(Path(base) if base is not None else path, entry)
    if got.warning and warn:
        _warn_once(f"{path}:{got.release.version}", got.warning)
    return got


def _detect(path: Path, entry: str) -> Detected:
    try:
        digest = sha256(path)
    except OSError:
        digest = ""
    hit = _by_hash(digest)
    if hit is not None:
        return Detected(hit[0], f"sha256 of {path.name} is flashinfer-python {hit[0].version}'s {hit[1]}", exact=True)
    declared = declared_model(path)
    if declared is not None:
        return Detected(get_release(declared), f"{path.name} declares {DECLARE} = {declared!r}", exact=True)
    forced = os.environ.get(RELEASE_ENV, "").strip()
    if forced:
        return Detected(get_release(forced), f"{RELEASE_ENV}={forced} (for {path.name})", exact=True)
    installed = _installed_version_for(path)
    if installed is not None:
        if installed in RELEASES:
            return Detected(RELEASES[installed], f"installed {DIST} {installed}, {path.name} edited (sha256 differs)",
                            exact=False,
                            warning=f"gdn_fuzz: {path} is not the file {DIST} {installed} ships (sha256 differs): "
                                    f"modelled as {installed}")
        newest = max(RELEASES.values(), key=lambda r: _vkey(r.version))
        if _vkey(installed) > _vkey(newest.version):
            return Detected(newest, f"installed {DIST} {installed}, newer than the newest model", exact=False,
                            warning=f"gdn_fuzz: {DIST} {installed} is newer than the newest release model "
                                    f"({newest.version}): its host checks are modelled as {newest.version}'s, and a "
                                    "check that moved is reported as a contract change (`gdn-fuzz diff "
                                    f"{newest.version} {installed}`)")
    # by the entry point's parameters
    candidates = sorted((r for r in RELEASES.values() if entry in r.entries), key=lambda r: _vkey(r.version),
                        reverse=True)
    fn = candidates[0].entries[entry].function if candidates else None
    params = function_params(path, fn) if fn else None
    if params is not None:
        for r in candidates:
            if tuple(r.entries[entry].params) == params:
                return Detected(r, f"{path.name}: the parameters of {fn} are {r.version}'s", exact=False,
                                warning=f"gdn_fuzz: {path} is no released file; its host checks are modelled as "
                                        f"{r.version}'s (same parameters); set {RELEASE_ENV} or {DECLARE} to choose")
        for r in candidates:
            if set(r.entries[entry].params) <= set(params):
                return Detected(r, f"{path.name}: {fn} takes every parameter of {r.version}'s", exact=False,
                                warning=f"gdn_fuzz: {path} is no released file and its {fn} has parameters no "
                                        f"release has: modelled as {r.version}")
    r = candidates[0] if candidates else NEWEST
    return Detected(r, f"{path.name}: no release matches, the newest model", exact=False,
                    warning=f"gdn_fuzz: {path}: no release model matches; modelled as {r.version}")


# ------------------------------------------------------------------ release files

def release_dirs() -> list[Path]:
    """Folders that may hold VERSION/flashinfer/gdn_kernels/*.py (see the module docstring)."""
    dirs = [Path(p) for p in os.environ.get(RELEASES_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    dirs.append(cache_dir())
    for p in sys.path:
        if p and (Path(p) / "releases").is_dir():
            dirs.append(Path(p) / "releases")
    return dirs


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gdn_fuzz" / "releases"


def installed_file(fname: str = FLUSH_FILE) -> Path | None:
    """The installed flashinfer's gdn_kernels/<fname> (no package imported)."""
    from gdn_fuzz.targets.loading import _module_file

    return _module_file("flashinfer.gdn_kernels." + fname[:-3])


def release_file(version: str, fname: str = FLUSH_FILE) -> Path:
    """The file `fname` of release `version`: the installed one when its sha256 is that release's, else
    one in the release folders (checked against the model's sha256 where it lists the file)."""
    rel = get_release(version)
    want = rel.files.get(fname)
    inst = installed_file(fname)
    if inst is not None and want is not None and sha256(inst) == want:
        return inst
    looked = []
    for d in release_dirs():
        p = d / version / Path(*KERNELS) / fname
        looked.append(str(d))
        if p.is_file():
            if want is not None and sha256(p) != want:
                raise ReleaseFileError(f"{p}: sha256 {sha256(p)[:12]}... is not flashinfer-python {version}'s "
                                       f"{fname} ({want[:12]}...); delete the folder and fetch it again "
                                       f"(`gdn-fuzz release fetch {version}`)")
            return p
    from gdn_fuzz.targets.loading import TargetUnavailable

    raise TargetUnavailable(f"flashinfer-python=={version}'s {fname} is not here (installed: "
                            f"{installed_version() or 'none'}; looked in {', '.join(looked) or 'no folder'}); "
                            f"`gdn-fuzz release fetch {version}` puts it in {cache_dir()}")


class ReleaseFileError(ValueError):
    """A release file that is not what its model says (the wrong bytes under a version's folder)."""


def installed_version() -> str | None:
    import importlib.metadata as md

    try:
        return md.version(DIST)
    except md.PackageNotFoundError:
        inst = installed_file()
        if inst is not None:  # a trimmed install (the GPU bundle): no dist-info; name it by its hash
            hit = _by_hash(sha256(inst))
            return hit[0].version if hit else None
        return None


def fetch(version: str, dest: Path | None = None, python: str = sys.executable) -> Path:
    """Download flashinfer-python==version (no dependencies) with pip and keep its
    flashinfer/gdn_kernels/*.py under dest/VERSION (default: the cache folder).  Returns that folder.
    The files are written to a temporary folder and moved into place, so an interrupted fetch leaves
    nothing half written; each file the model lists is checked against its sha256 first."""
    rel_files = RELEASES[version].files if version in RELEASES else {}
    dest = Path(dest) if dest is not None else cache_dir()
    final = dest / version
    if (final / Path(*KERNELS) / FLUSH_FILE).is_file():
        return final
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        whl_dir = Path(tmp) / "whl"
        r = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            f"{DIST}=={version}", "-d", str(whl_dir)], capture_output=True, text=True)
        wheels = sorted(whl_dir.glob("*.whl")) if whl_dir.is_dir() else []
        if r.returncode != 0 or not wheels:
            raise ReleaseFileError(f"pip download {DIST}=={version} failed (exit {r.returncode}): "
                                   + (r.stderr.strip().splitlines() or ["no output"])[-1])
        stage = Path(tmp) / version
        kdir = stage / Path(*KERNELS)
        kdir.mkdir(parents=True)
        (stage / KERNELS[0] / "__init__.py").write_text("")
        with zipfile.ZipFile(wheels[0]) as z:
            for n in z.namelist():
                parts = n.split("/")
                if len(parts) == 3 and tuple(parts[:2]) == KERNELS and n.endswith(".py"):
                    (kdir / parts[2]).write_bytes(z.read(n))
        for fname, want in rel_files.items():
            p = kdir / fname
            if p.is_file() and sha256(p) != want:
                raise ReleaseFileError(f"{DIST}=={version}'s {fname} has sha256 {sha256(p)[:12]}..., the model says "
                                       f"{want[:12]}...; the index served another file")
        os.replace(stage, final)
    return final
