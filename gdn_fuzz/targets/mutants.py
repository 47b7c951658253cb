"""Mutants: realistic kernel bugs as small text edits of a target file, applied at run time.

A Mutant names its base file ("reference": this package's torch target; "production": the
installed FlashInfer module, edited in a temporary copy and never vendored), the text to
replace (which must occur exactly once, so a stale edit fails loudly), the contract clause
it breaks and the property expected to catch it.  `get_target("mutant:NAME")` loads one.

Mutated copies are written to $GDN_FUZZ_MUTANT_DIR (default: a per-user temp folder),
named by the hash of their content, and written atomically, so concurrent workers share
them safely.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from gdn_fuzz.environment import write_atomic
from gdn_fuzz.targets.loading import PM_REFERENCE_PATH, REFERENCE_PATH, resolve_materialize_path, resolve_production_path


@dataclass(frozen=True)
class Mutant:
    name: str
    clause: str
    prop: str  # Finding.prop prefix expected to catch it
    old: str
    new: str
    doc: str
    base: str = "reference"  # "reference" | "production" | "materialize" | "materialize-reference"
    scored: bool = True  # False: a study shows it, no property can (see the note above the catalogue)
    also: tuple = ()  # further (old, new) edits, applied in turn: a mutant of several catalogued ones (get_mutant)


CATALOGUE: dict[str, Mutant] = {}


def register(*ms: Mutant) -> None:
    for m in ms:
        if m.name in CATALOGUE:
            raise ValueError(f"mutant {m.name!r} registered twice")
        CATALOGUE[m.name] = m


register(
    Mutant("fold_skipped", "M7", "oracle.fold",
           "        h0[idx[flush]] = fold[flush]", "        pass",
           "flush rows never write the folded checkpoint"),
    Mutant("no_local_g_restart", "M6", "oracle.g",
           "torch.where(flush[:, None], 0.0, GP)", "GP",
           "flush rows append G_P + G_s instead of restarting at 0"),
    Mutant("anchor_off_by_one", "M3", "oracle.y",
           "anchor_lane = (P - 1).clamp(0, W_RING - 1)", "anchor_lane = P.clamp(0, W_RING - 1)",
           "anchor G_P read from lane P instead of P - 1"),
    Mutant("flush_restart_at_zero", "M5", "writes.outside",
           "aslots = (base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
           "aslots = torch.where((P >= flush_min)[:, None], base[:, None] + torch.arange(Tq, device=dev)[None, :],"
           " base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
           "the old flush path: appends restart at the window start instead of past the window (the 16-slot race)"),
    Mutant("pad_rows_write", "M8", "writes.outside",
           "    live = idx >= 0\n", "    live = idx >= -1\n",
           "pad rows (idx = -1) are treated as slot -1 = the last pool row"),
    Mutant("flush_off_by_one", "M7", "oracle.fold",
           "    flush = (P >= flush_min) & live\n", "    flush = (P > flush_min) & live\n",
           "rows exactly at flush_min do not fold"),
    Mutant("worker_crash", "R*", "crash",
           "    # M8 output: in place",
           "    if bool(((P == W_RING) & live).any()):  # planted: a hard crash of the process\n"
           "        import os, signal\n"
           "        os.kill(os.getpid(), signal.SIGSEGV)\n"
           "    # M8 output: in place",
           "the process dies (SIGSEGV) whenever a row has a full window (P = 16): crash isolation demo"),
    Mutant("gpu_oob_full_window", "R*", "crash",
           "        initial_state_indices = initial_state_indices.contiguous()\n",
           "        initial_state_indices = initial_state_indices.contiguous()\n"
           "        if int(hist_len.max()) == W_RING:  # planted: slot index far past the pool\n"
           "            initial_state_indices = initial_state_indices + (1 << 26) * (initial_state_indices >= 0)\n",
           "the production wrapper shifts slot indices 2^26 rows past the pool when a row has P = 16: the kernel "
           "reads and writes out of bounds (illegal address, a sticky CUDA error)",
           base="production"),
)


def _mutant_dir() -> Path:
    d = os.environ.get("GDN_FUZZ_MUTANT_DIR") or os.path.join(tempfile.gettempdir(), f"gdn_fuzz_mutants_{os.getuid()}")
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p


def base_path(m: Mutant) -> Path:
    return {"reference": lambda: REFERENCE_PATH, "production": resolve_production_path,
            "materialize": resolve_materialize_path, "materialize-reference": lambda: PM_REFERENCE_PATH}[m.base]()


def apply(m: Mutant, src: str) -> str:
    for old, new in ((m.old, m.new), *m.also):
        n = src.count(old)
        if n != 1:
            raise ValueError(f"mutant {m.name!r}: each of its edits must match the {m.base} source exactly once (after "
                             f"the edits before it), found {n} matches of {old.strip()[:60]!r}; update "
                             "gdn_fuzz/targets/mutants.py (the target file changed), or combine edits that touch "
                             "other lines")
        src = src.replace(old, new)
    return src


def materialize_mutant(m: Mutant | str, directory: Path | None = None) -> Path:
    """Write the mutated copy (atomically, named by content hash) and return its path."""
    m = get_mutant(m) if isinstance(m, str) else m
    text = apply(m, base_path(m).read_text())
    d = Path(directory) if directory is not None else _mutant_dir()
    out = d / f"{m.base}_{m.name}_{hashlib.sha256(text.encode()).hexdigest()[:12]}.py"
    if not out.exists():
        write_atomic(out, text)
    return out


def get_mutant(name: str) -> Mutant:
    """The catalogued mutant `name`; "A+B": the edits of A and B in one file (two bugs at once; not scored)."""
    if "+" in name:
        parts = [get_mutant(n) for n in name.split("+")]
        bases = {m.base for m in parts}
        if len(bases) != 1:
            raise ValueError(f"mutant={name!r} combines edits of different bases ({', '.join(sorted(bases))}); "
                             "combine mutants of one base")
        first = parts[0]
        return Mutant(name, ",".join(m.clause for m in parts), first.prop, first.old, first.new,
                      " AND ".join(m.doc for m in parts), first.base, scored=False,
                      also=tuple((m.old, m.new) for m in parts[1:]))
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ValueError(f"mutant={name!r} is not in the catalogue; known: {', '.join(sorted(CATALOGUE))} (or two "
                         "joined by '+')") from None


# Retired (issue 14): softplus_threshold, softplus with torch's threshold 20, which keeps g
# finite for a + dt_bias >= 88.7 where the released kernel overflows to -inf.  N2 documents a
# hazard of the released kernel, not a requirement: that edit computes the gate correctly, and
# a property may fail only on a contract violation.
#
# Not scored (scored=False): edits that break an N3 rounding point but stay inside the oracle's
# tolerance, so that no single value can show the violation (a bf16-valued fp16 record is a
# legal single rounding of some f32 value).  Only the statistical rounding-pattern measurement
# of `gdn-fuzz precision --targets mutant:NAME` shows them; the properties cannot, by design.

# ------------------------------------------------------------------ the mutation-score catalogue
# One small realistic bug each, as an edit of the reference target.  Each doc says the bug,
# the clause it breaks, the input that exposes it and, where one exists, the shipped bug of
# docs/replayssm-serving.md ("Bugs these projects hit") it mirrors.  `prop` is the
# Finding.prop prefix expected to kill it; guard.*, commit.* and extremes.* are
# the properties of gdn_fuzz.properties.contract.  tests/test_mutants.py holds, per mutant, a hand-picked
# input on which it differs from the reference (none is equivalent).
_AP = "aslots = (base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK"
register(
    # ---- ring addressing and wrap (M3, M5)
    Mutant("window_mask_15", "M3", "oracle.y",
           "slots = (base[:, None] + lanes[None, :]) & RING_MASK  # [B, 16]",
           "slots = (base[:, None] + lanes[None, :]) & 15  # [B, 16]",
           "window read slots masked with & 15 (the old 16-slot ring) instead of & 31: a window at "
           "cache_base >= 16, or one crossing ring slot 16, replays the wrong records.  Exposed by any row "
           "with P >= 1 and base + P > 16.  Mirrors the 16 -> 32-slot ring change."),
    Mutant("window_wrap_missing", "M3", "launch",
           "slots = (base[:, None] + lanes[None, :]) & RING_MASK  # [B, 16]",
           "slots = base[:, None] + lanes[None, :]  # [B, 16]",
           "the window's ring index is not wrapped at 32: a window with base + 16 > 32 addresses past the "
           "ring (the kernel reads another head's ring or faults; here an IndexError, since all 16 "
           "lanes are addressed before masking).  Exposed by a non-pad row with cache_base >= 17, "
           "whatever P.  Mirrors the raw-offset out-of-bounds bugs."),
    Mutant("append_mask_15", "M5", "writes.outside",
           _AP, _AP.replace("& RING_MASK", "& 15"),
           "appends at (base + P + s) & 15: past ring slot 15 they wrap into the live window (the old "
           "16-slot ring).  Exposed by a row with base + P + T > 16, e.g. P = 13, base = 0 (overwrites "
           "window slot 0).  Mirrors the flush-restart race that motivated the 32-slot ring."),
    # ---- window and anchor bounds (M3)
    Mutant("window_lane_le", "M3", "oracle.y",
           "valid = (lanes[None, :] < P[:, None]) & live[:, None]",
           "valid = (lanes[None, :] <= P[:, None]) & live[:, None]",
           "window mask j <= P instead of j < P: one record past the window (a rejected draft, or a "
           "previous tenant's record) is replayed.  Exposed by any row with P < 16 (P = 0 included).  "
           "Mirrors 'ring contents left by a previous tenant must be unreachable' / stale cursors."),
    # ---- append placement (M5)
    Mutant("append_overlaps_anchor", "M5", "writes.outside",
           _AP, _AP.replace("P[:, None] + torch", "P[:, None] - 1 + torch"),
           "appends start at slot(P - 1) instead of slot(P): the first draft overwrites the last window "
           "record (the anchor) and the appends are one slot early.  Exposed by any non-pad row."),
    # ---- routing (M7)
    Mutant("flush_min_ignored", "M7", "oracle.fold",
           "    flush = (P >= flush_min) & live\n",
           "    flush = (P >= W_RING - Tq + 1) & live\n",
           "the kernel routes with the lazy default 17 - T (a compile-time constant) and ignores the "
           "caller's flush_min, which the host still validates.  Exposed by flush_min < 17 - T and a row "
           "with flush_min <= P < 17 - T (it does not fold, and stores G_P + G_s)."),
    # ---- G bookkeeping (M1, M6)
    Mutant("g_per_token", "M6", "oracle.g",
           "g_app = Gam + torch.where(", "g_app = g + torch.where(",
           "appends store the per-token g (the Triton baseline's ring format) instead of the cumulative "
           "G: mixing the backends' formats.  Exposed by any non-pad row (tokens s >= 1).  Mirrors "
           "'the backends differ in the meaning of g'."),
    Mutant("t8_scan_no_carry", "M1", "oracle.g",
           "Gam = torch.cumsum(g, dim=1)",
           "Gam = torch.cat([torch.cumsum(g[:, :4], 1), torch.cumsum(g[:, 4:], 1)], 1)",
           "T = 8 only: the inclusive scan runs in two 4-token chunks and the second does not carry the "
           "first chunk's total, so appended G of drafts 4..7 miss G_3.  Exposed by any non-pad row at "
           "T = 8; T = 4 is unaffected."),
    # ---- fold contents (M7)
    Mutant("fold_includes_drafts", "M7", "oracle.fold",
           "        h0[idx[flush]] = fold[flush]", "        h0[idx[flush]] = S.to(h0.dtype)[flush]",
           "the fold stores the state after the T drafts (rejected ones included) instead of S_h, the "
           "state after the window.  Exposed by any flush row.  Mirrors the old flush path."),
    Mutant("fold_no_bdec", "M7", "oracle.fold",
           "    fold = S.to(h0.dtype)",
           "    fold = (S0 + torch.einsum(\"bhjv,bhjk->bhvk\", wu, kw)).to(h0.dtype)",
           "the fold path forgets the checkpoint decay bdec = e^{G_P} (S0 + D instead of bdec S0 + D); "
           "y is right.  Exposed by a flush row with non-negligible G_P (normal decay, P >= 1)."),
    # ---- pad rows (M8)
    Mutant("pad_output_zeroed", "M8", "output_inplace.pad_rows",
           "        output[live] = y[live]\n",
           "        output[~live] = 0  # planted: pad rows zeroed\n        output[live] = y[live]\n",
           "pad rows zero their rows of a caller-provided output (a pad row must write nothing).  Exposed "
           "by a batch with a pad row and an in-place output.  Mirrors 'the kernel writes nothing for a "
           "pad row (its output rows are not zeroed)'."),
    # ---- slot indirection: batch row used where a pool slot is meant (C1, M5, M7)
    Mutant("g_append_by_batch_row", "M5", "oracle.g",
           "    g_cache.permute(0, 2, 1)[r, s] = g_app[live].to(g_cache.dtype)",
           "    g_cache.permute(0, 2, 1)[live.nonzero()[:, :1].expand(-1, Tq), s] = g_app[live].to(g_cache.dtype)",
           "the g appends are keyed by batch row b instead of pool slot idx[b] (request-keyed vs "
           "block-keyed, C1).  Exposed by any live row whose slot differs from its batch row (permuted "
           "indices, pad rows before it)."),
    Mutant("fold_to_batch_row", "M7", "oracle.fold",
           "        h0[idx[flush]] = fold[flush]", "        h0[flush.nonzero().flatten()] = fold[flush]",
           "the folded checkpoint is stored at pool row b instead of idx[b] (C1).  Exposed by a flush row "
           "whose slot differs from its batch row."),
    # ---- head mapping (M2)
    Mutant("head_map_mod", "M2", "oracle.y",
           "(hv // G)[None, :, None]", "(hv % H)[None, :, None]",
           "window keys read from k-head hv % H instead of hv // G (interleaved instead of grouped GQA "
           "mapping).  Exposed by H >= 2, G >= 2 and a row with P >= 1."),
    # ---- gating math (M1, M2, N2)
    Mutant("beta_no_sigmoid", "M1", "oracle.y",
           "beta = torch.sigmoid(b.float())", "beta = b.float()",
           "beta = b instead of sigmoid(b).  Exposed by any non-pad row."),
    Mutant("q_scale_missing", "M2", "oracle.y",
           "q_hat = (_l2n(q) * scale)", "q_hat = (_l2n(q))",
           "the 1/sqrt(K) scale is not applied to q_hat.  Exposed by any non-pad row."),
    Mutant("tile32_no_offset", "M8", "oracle",
           "    idx = idx.to(dev).long()\n",
           "    idx = idx.to(dev).long()\n"
           "    idx = idx[torch.arange(idx.numel(), device=dev) % 32]\n",
           "a tiled grid that drops the tile offset: batch row b reads and writes the pool slot of row b mod 32, "
           "so every row past the first 32 works on another row's checkpoint (and a pad row past 32 on a real "
           "row's slot).  Batches of <= 32 rows are unchanged, so only the batch-scale regime (buckets >= 64, "
           "issue 18) exposes it."),
    Mutant("tiny_norm_as_zero", "M2", "oracle",
           "    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + EPS)",
           "    n2 = (x * x).sum(-1, keepdim=True)\n"
           "    return torch.where(n2 < EPS, 0.0, x * torch.rsqrt(n2 + EPS))",
           "a 'skip empty keys' shortcut: keys and queries with ||x||^2 below the normalisation eps (1e-6) "
           "are normalized to zero, where the contract's x (||x||^2 + 1e-6)^{-1/2} is not (at ||x||^2 = 5e-7 "
           "it has norm 0.58).  Exact zeros and ||x||^2 >= 1e-6 are unchanged, so only the eps-scale "
           "regime (qk_scale <= 3e-5, issue 18) exposes it."),
    Mutant("pool_offset_int32", "M3", "oracle",
           "    S0 = h0[rows].float()  # [B, HV, V, K]\n",
           "    off = rows[:, None] * h0[0].numel() + torch.arange(h0[0].numel(), device=dev)  # flat offsets\n"
           "    off = (off + 2**31) % 2**32 - 2**31  # held in an int32: two's-complement wrap\n"
           "    S0 = h0.reshape(-1)[off % h0.numel()].view(B, HV, V, K).float()  # [B, HV, V, K]\n",
           "the checkpoint read with 32-bit element offsets (slot * HV * V * K + e held in an int32, emulated "
           "with an explicit two's-complement wrap): from pool slot 2^31 / (HV * V * K) on (slot 16,384 at "
           "HV = 8; 2,048 for Qwen3-Next's HV = 64) the offset wraps negative and the row replays another "
           "slot's checkpoint (here the wrapped offset modulo the pool; a GPU would read outside the "
           "allocation).  Pools below 2^31 elements are unchanged, so only the pool-scale regime (rows "
           "on the top slots of a pool past 2^31 elements, issue 18) exposes it."),
    # ---- precision of stored records (N3)
    Mutant("u_stored_io", "N3", "study:precision.u",
           "U = torch.stack(Us, 1).to(u_cache.dtype)", "U = torch.stack(Us, 1).to(q.dtype).to(u_cache.dtype)",
           "U is rounded to IO before it is stored in the RING dtype: on the bf16-IO/fp16-ring arms the u "
           "records lose 3 mantissa bits (bf16 through an fp16 ring); other arms are unaffected.  Within "
           "the oracle's u tolerance (4 u(IO)): only the rounding-pattern study sees it.", scored=False),
    Mutant("fold_double_rounding", "N3", "study:precision.fold",
           "    fold = S.to(h0.dtype)", "    fold = S.to(q.dtype).to(h0.dtype)",
           "the folded checkpoint is rounded twice, to IO then to STATE: on the bf16-IO/fp16-state arms "
           "the state loses 3 mantissa bits.  Within the fold tolerance (3 u(max(STATE, RING)), a "
           "Frobenius norm over 16,384 values): only the rounding-pattern study sees it.", scored=False),
    # ---- commit arithmetic (C2): the standalone commit at the end of the entry point
    # ---- the A_log / dt_bias cast (N5)
    Mutant("params_cast_cached_by_id", "N5", "params_inplace",
           "    return t.to(IO_TORCH).contiguous()\n",
           "    import weakref  # planted: the released wrapper's cast cache, keyed by id() of the source\n"
           "    cache = globals().setdefault(\"_PLANTED_CAST_CACHE\", {})\n"
           "    c = cache.get(id(t))\n"
           "    if c is None:\n"
           "        c = cache[id(t)] = t.to(IO_TORCH).contiguous()\n"
           "        weakref.finalize(t, cache.pop, id(t), None)\n"
           "    return c\n",
           "the cast of A_log / dt_bias to the IO dtype is cached by id() of the source tensor (evicted when the "
           "source dies), as in the released wrapper (N5): a source that is not a contiguous IO tensor (fp32, "
           "or a strided view) and is reloaded in place keeps its first cast, so the next launch uses the old "
           "weights.  Exposed by an in-place copy_ into such a source between two launches; a campaign's "
           "contiguous IO parameters never reach the cache."),
    Mutant("commit_base_slides_verify", "C2", "commit.cursors",
           "cache_base.copy_((cache_base + hist_len * flushed) & (RING_SLOTS - 1))",
           "cache_base.copy_((cache_base + hist_len) & (RING_SLOTS - 1))",
           "restart_hist_on_flush=True: cache_base slides by hist_len on verify rows too.  Exposed by a "
           "verify row with P >= 1 and restart_hist_on_flush=True.  Mirrors 'standalone-commit misuse "
           "produced well-formed wrong numbers'."),
    Mutant("commit_pad_exempt", "C2", "commit.cursors",
           "        flushed = hist_len >= flush_min\n",
           "        flushed = (hist_len >= flush_min) & (initial_state_indices >= 0)\n",
           "restart_hist_on_flush=True: pad rows are exempted from the commit (C2: they are not).  Exposed "
           "by a pad row with P >= flush_min."),
    # ---- missing host guards (H6, H11, H13, H14)
    Mutant("guard_T", "H13", "guard.H13",
           "    if Tq not in (4, 8):", "    if Tq > 8:",
           "the T check is written T <= 8: T = 5, 6, 7 run with no error.  Exposed by T = 6."),
    Mutant("guard_flush_min_zero", "H14", "guard.H14",
           "assert 1 <= flush_min <= W_RING - Tq + 1, (", "assert 0 <= flush_min <= W_RING - Tq + 1, (",
           "flush_min = 0 is accepted (every row, P = 0 included, folds).  Exposed by flush_min = 0."),
    Mutant("guard_flush_min_cap", "H14", "guard.H14",
           "assert 1 <= flush_min <= W_RING - Tq + 1, (", "assert 1 <= flush_min <= W_RING - Tq + 2, (",
           "the flush_min cap is off by one: flush_min = 18 - T is accepted, so a window of 17 - T rows "
           "plus T appends exceeds the 16-row window.  Exposed by flush_min = 18 - T.  Mirrors 'a verify "
           "window longer than the remaining buffer was silently truncated (flush rule off by one)'."),
    Mutant("guard_hist_len_range", "H11", "guard.H11",
           "assert lo >= 0 and hi <= W_RING, f\"hist_len", "assert lo >= 0 and hi <= RING_SLOTS - Tq, f\"hist_len",
           "hist_len is range-checked against the ring (32 - T) instead of the window (16): P = 17 .. 28 "
           "pass and are silently wrong (1.3).  Exposed by hist_len = 17 with restart_hist_on_flush=True.  "
           "Mirrors 'out-of-range hist_len produced well-formed wrong numbers'."),
    Mutant("guard_ab_dtype", "H6", "guard.H6",
           "            and a.dtype == IO_TORCH and b.dtype == IO_TORCH), (",
           "            ), (",
           "the IO dtype check covers q/k/v only: a and b of the other 16-bit dtype are accepted (the "
           "kernel would read their bits as IO).  Exposed by fp16 a or b in a bf16 module.  Mirrors 'fp16 "
           "activations were read as bf16 bit patterns'."),
    Mutant("guard_cache_base_none", "H11", "guard.H11",
           "    if restart_hist_on_flush and hist_len is not None:\n        if cache_base is None:",
           "    if cache_base is None:  # planted: a default temporary\n"
           "        cache_base = torch.zeros_like(hist_len)\n"
           "    if restart_hist_on_flush and hist_len is not None:\n        if cache_base is None:",
           "restart_hist_on_flush=True with cache_base=None commits into a zero temporary instead of "
           "raising ValueError.  Exposed by that call.  Mirrors 'a default cache_base committed into a "
           "temporary'."),
    # ---- strided inputs (table 1.1 a/b, H8, H16)
    Mutant("b_token_stride_hardcoded", "1.1", "metamorphic.strided_ab",
           "beta = torch.sigmoid(b.float())",
           "beta = torch.sigmoid(b.as_strided(b.shape, (b.shape[1] * b.shape[2], b.shape[2], 1)).float())",
           "b is read with a hard-coded compact token stride (HV) whatever its real strides.  Exposed by b "
           "given as a view of a fused [B, T, 2 HV + pad] tensor.  Mirrors 'a hard-coded token stride for "
           "b read the wrong values for strided inputs'."),
    Mutant("paged_pool_as_dense", "H16", "metamorphic.strided_pool",
           "    if not contig:\n        raise NotImplementedError(",
           "    if not contig:  # planted: block-strided pools accepted and addressed as dense\n"
           "        h0 = h0.as_strided(h0.shape, torch.empty(h0.shape, device=\"meta\").stride())\n"
           "    if False:\n        raise NotImplementedError(",
           "a block-strided (paged) pool is accepted without the strided mode and addressed with dense "
           "strides.  Exposed by a pool given as a dim-0 strided view.  Mirrors 'paged pools with a "
           "block stride were read as dense (NaN)'."),
)


# ---- one-line edits of the RELEASED kernel file (base="production"): applied at run time to a
# temporary copy of the installed flashinfer/gdn_kernels/gdn_decode_bf16_wy_ucache_flush.py
# (0.7.2.post1); only these edit descriptions live here.  Kernel-body edits JIT-compile on an
# SM90 GPU; wrapper edits (host Python) change what the wrapper does around the launch.
register(
    Mutant("prod_no_local_g_restart", "M6", "oracle.g",
           "f32(0.0) if P_hist >= flush_min else _gp", "_gp",
           "kernel: flush rows append G_P + Gamma_s instead of the local Gamma_s (the fold already absorbed "
           "e^{G_P}).  Exposed by any flush row with P > 0.", base="production"),
    Mutant("prod_anchor_lane_p", "M3", "oracle.y",
           "_p_src = P_hist - 1 if P_hist > 0 else Int32(0)", "_p_src = P_hist if P_hist > 0 else Int32(0)",
           "kernel: the anchor G_P is shuffled from lane P instead of lane P - 1 (an off-by-one in the window "
           "end).  Exposed by any row with 0 < P.", base="production"),
    Mutant("prod_fold_no_bdec", "M3", "oracle",
           "_bdec_v = _exp_approx_f32(_gp) if P_hist > 0 else f32(1.0)", "_bdec_v = f32(1.0)",
           "kernel: the checkpoint decay bdec = e^{G_P} is dropped, so the replayed state is S0 + window "
           "instead of e^{G_P} S0 + window: y and u of every row with P > 0 (the H200 campaign shrank it to a "
           "verify row with P = 1) and the fold of flush rows.", base="production"),
    Mutant("prod_g_append_restart", "M5", "writes.outside",
           "(ring_base + P_hist + lane_id) & Int32(RING_MASK),", "(ring_base + lane_id) & Int32(RING_MASK),",
           "kernel: the g appends land at the window start (base + s) instead of past the window "
           "(base + P + s): the old restart layout whose 16-slot race the ring removed.  Exposed by any row "
           "with P > 0.", base="production"),
    Mutant("prod_beta_no_sigmoid", "M1", "oracle.y",
           "beta_val = f32(1.0) / (f32(1.0) + _exp_approx_f32(f32(0.0) - b_val))", "beta_val = b_val",
           "kernel: beta = b instead of sigmoid(b).  Exposed by any row.", base="production"),
    Mutant("prod_lazy_flush_min", "M7", "writes.outside",
           "flush_min = W_RING - T + 1  # lazy", "flush_min = W_RING - T  # lazy",
           "wrapper: the default flush_min is 16 - T instead of 17 - T: rows at P = 16 - T fold one step early "
           "(their pool slot is written).  Exposed by flush_min=None and a row with P = 16 - T.",
           base="production"),
    Mutant("prod_commit_slides_verify", "C2", "commit",
           "cache_base.copy_((cache_base + hist_len * _flushed) & (RING_SLOTS - 1))",
           "cache_base.copy_((cache_base + hist_len) & (RING_SLOTS - 1))",
           "wrapper: the standalone commit slides every row's base by P, verify rows included.  Exposed by "
           "restart_hist_on_flush=True and a verify row with P > 0.", base="production"),
    Mutant("prod_commit_pad_exempt", "C2", "commit",
           "_flushed = hist_len >= flush_min", "_flushed = (hist_len >= flush_min) & (initial_state_indices >= 0)",
           "wrapper: the standalone commit skips pad rows (C2 commits them like any row).  Exposed by "
           "restart_hist_on_flush=True and a pad row with P >= flush_min.", base="production"),
    Mutant("prod_guard_hist_len", "H11", "guard.H11",
           "assert _hl_min >= 0 and _hl_max <= W_RING, (", "assert _hl_min >= 0 and _hl_max <= RING_SLOTS, (",
           "wrapper: hist_len is range-checked against the ring (32) instead of the window (16): P = 17 .. 32 "
           "pass and are silently wrong (1.3).  Exposed by hist_len = 17 with restart_hist_on_flush=True.",
           base="production"),
)


# ---- the prefix materializer (issue 31): edits of this package's torch reference (base
# "materialize-reference", killed on the CPU by tests/test_materialize.py) and one-line edits of the
# released flashinfer/gdn_kernels/gdn_prefix_materialize.py (base "materialize", 0.7.4; JIT-compiled on
# an SM90 GPU, killed there by tools/h200_issue31.sh).  prop is the Finding.prop prefix expected.
register(
    Mutant("pm_ref_anchor_lane", "PMM3", "pm.state",
           "        Gc = g[:, C - 1:C]\n", "        Gc = g[:, C - 1:C] if C < 2 else g[:, C - 2:C - 1]\n",
           "reference materializer: G_C read from entry C - 2 instead of C - 1 (an off-by-one in the window end). "
           "Exposed by any request with count >= 2.", base="materialize-reference"),
    Mutant("pm_ref_over_window", "PMS1", "pm.writes.state",
           "        if s < 0 or d < 0 or C < 0 or C > W_RING:  # PMS1\n            continue\n",
           "        if s < 0 or d < 0 or C < 0:  # PMS1\n            continue\n        C = min(C, W_RING)\n",
           "reference materializer: count > 16 replays the 16-entry window instead of being skipped.  Exposed by a "
           "request with count > 16.", base="materialize-reference"),
    Mutant("pm_ref_copy_arith", "PMS2", "pm.copy",
           "            results.append((d, S0.clone()))", "            results.append((d, (S0.float() * 1.0 + 0.0).to(ST_TORCH)))",
           "reference materializer: the count == 0 copy goes through f32 arithmetic (S0 * 1 + 0): -0 becomes +0.  "
           "Exposed by a copy of a checkpoint holding -0 (bits='all').", base="materialize-reference"),
    Mutant("pm_ref_num_active_short", "PMS4", "pm.state",
           "    n = max(0, min(int(num_active.reshape(-1)[0]), B))", "    n = max(0, min(int(num_active.reshape(-1)[0]) - 1, B))",
           "reference materializer: the last live entry within num_active is dropped.  Exposed by any call with a "
           "processed request.", base="materialize-reference"),
    Mutant("pm_ref_derived_positive", "PMS5", "pm.copy",
           "        live = torch.nonzero(count >= 0, as_tuple=False)", "        live = torch.nonzero(count > 0, as_tuple=False)",
           "reference materializer: the derived active list leaves out count == 0 rows, so their copies are never "
           "made.  Exposed by a copy request with the list derived.", base="materialize-reference"),
    Mutant("pm_ref_no_depth_check", "PMH9", "pm.guard",
           "    if R & (R - 1) or R < W_RING:  # PMH9", "    if False:  # PMH9",
           "reference materializer: the ring depth check is gone.  Exposed by a 24- or 8-slot ring.",
           base="materialize-reference"),
    Mutant("pm_ref_no_wrap", "PMS8", "pm.state",
           "        slots = (b + j[:C]) & (R - 1)", "        slots = ((b & (R - 1)) + j[:C]).clamp(max=R - 1)",
           "reference materializer: a window that reaches the ring's last slot does not wrap to slot 0 (it reads "
           "the last slot again).  Exposed by a window past the last slot.", base="materialize-reference"),
)
register(
    Mutant("pm_skip_over_window", "PMS1", "pm.writes.state",
           "if count > Int32(W_RING):", "if count > Int32(W_RING + 1):",
           "kernel: count = 17 is not skipped (it replays the 16 loaded rows with G_C from lane 16).  Exposed by a "
           "request with count 17.", base="materialize"),
    Mutant("pm_anchor_lane_c", "PMM3", "pm.state",
           "_c_src = count - Int32(1) if count > Int32(0) else Int32(0)", "_c_src = count if count > Int32(0) else Int32(0)",
           "kernel: G_C is shuffled from lane C instead of C - 1.  Exposed by any request with count >= 1.",
           base="materialize"),
    Mutant("pm_w_mask_off_by_one", "PMM3", "pm.state",
           "if lane_id < count", "if lane_id <= count",
           "kernel: w_j is computed for j = C too; u row C is zero, so only a NaN or Inf g at slot C leaks.  Exposed "
           "by poison (NaN outside the window).", base="materialize"),
    Mutant("pm_g_ring_mask_32", "PMS8", "pm.state",
           "(ring_base + lane_id) & ring_mask", "(ring_base + lane_id) & Int32(31)",
           "kernel: g is read mod 32 whatever the ring depth.  Exposed by a 16-slot ring with a window past slot 15.",
           base="materialize"),
    Mutant("pm_copy_bdec_zero", "PMS2", "pm.copy",
           "_bdec_v = _exp_approx_f32(_gc) if count > Int32(0) else f32(1.0)",
           "_bdec_v = _exp_approx_f32(_gc) if count > Int32(0) else f32(0.0)",
           "kernel: count == 0 scales the checkpoint by 0 instead of 1.  Exposed by any copy request.",
           base="materialize"),
    Mutant("pm_num_active_short", "PMS4", "pm.state",
           "num_items = gNumActive.iterator[0] * HV", "num_items = (gNumActive.iterator[0] - Int32(1)) * HV",
           "kernel: the last live entry within num_active is dropped.  Exposed by any call with a processed request.",
           base="materialize"),
    Mutant("pm_half0_from_dst", "PMM3", "pm.state",
           "gH_slice0 = gH_tiled[None, None, None, 0, head, src_idx]",
           "gH_slice0 = gH_tiled[None, None, None, 0, head, dst_idx]",
           "kernel: the first K half of the checkpoint is read from the destination slot.  Exposed by any request "
           "whose destination holds other values than its source.", base="materialize"),
    Mutant("pm_key_head_mod", "PMM1", "pm.state",
           "i_h = head // (HV // H)", "i_h = head % H",
           "kernel: the key head of value head hv is hv % H instead of hv // (HV / H).  Exposed by H >= 2 with "
           "HV / H >= 2.", base="materialize"),
    Mutant("pm_derived_positive", "PMS5", "pm.copy",
           "live = torch.nonzero(count >= 0, as_tuple=False)", "live = torch.nonzero(count > 0, as_tuple=False)",
           "wrapper: the derived active list leaves out count == 0 rows.  Exposed by a copy request with the list "
           "derived.", base="materialize"),
    Mutant("pm_no_depth_check", "PMH9", "pm.guard",
           "if ring_slots & (ring_slots - 1) or ring_slots < W_RING:", "if False:",
           "wrapper: the ring depth check is gone (a 24-slot ring is launched).  Exposed by pm_guards' 24- or 8-slot "
           "ring changes.", base="materialize"),
    Mutant("pm_exp_sign", "PMM3", "pm.state",
           "_exp_approx_f32(_gc - _g_hist_f32)", "_exp_approx_f32(_g_hist_f32 - _gc)",
           "kernel: w_j = e^{g_j - G_C} instead of e^{G_C - g_j}.  Exposed by any request with count >= 2.",
           base="materialize"),
)
