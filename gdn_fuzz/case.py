"""Case: a small, serializable description of one launch, and its materialization.

Hypothesis draws the structure (geometry, arm, rows, cursors, flush_min, value regime,
seed); `materialize` turns it into tensors with a seeded torch generator on the CPU and
moves them to the target's device, so the same Case gives the same bits everywhere.
A Case is what a failure prints, what the corpus stores and what `gdn-fuzz replay` re-runs.

Speed (issues 10 and 17): the float64 history recurrence that fills consistent windows runs
on the target's device (see `materialize`).  Cases with draws="cuda" draw their bulk tensors (pool,
rings, history tokens and the launch's q, k, v) with torch's counter-based CUDA generator (Philox)
seeded by the case's seed, on the device: no CPU-side tensor larger than the gates ([B, T, HV]).
Cases with draws="graph" (the default of `gdn-fuzz run` on a CUDA device since issue 32) draw every
value there, by one program of fixed shapes (graph_program) that gdn_fuzz.graphs replays as a CUDA
graph.  The bits of both are those of that generator, so such a case replays on a CUDA device only
(materialize refuses another device, saying so); see Case.draws.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import mmap
from dataclasses import dataclass, field

import torch

from gdn_fuzz import fused_oracle
from gdn_fuzz.arms import ARM_NAMES, Arm, get_arm
from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.oracles import ring as ring_oracle

CASE_VERSION = 1
RING_SLOTS = ring_oracle.RING_SLOTS  # 32 ring slots (D3; the spec's constants, oracles.ring)
W_RING = ring_oracle.W_RING  # 16: the longest window


def lazy_flush_min(T: int) -> int:
    """The lazy flush rule 17 - T (= W_RING - T + 1): fold exactly when the window could not hold
    another T records (shared/docs/replayssm-serving.md); also the largest legal flush_min (H14)."""
    return W_RING - T + 1

# Bounds of a stored or received Case (Case.validate, called by Case.from_dict): a case file
# or a message from another process is checked against them before anything is allocated.
LEGAL_T = (4, 8)  # the kernel's draft lengths (contract H13)
MAX_ROWS = 1024  # batch rows B
MAX_POOL = 2**18  # pool slots (262,144: a pool past 2^31 elements at HV = 1 needs 131,073)
MAX_CASE_BYTES = 16 * 2**30  # Case.draw_bytes(): the tensors materialize() draws, 16 GiB
MAX_ALLOC_BYTES = 64 * 2**30  # Case.alloc_bytes(): the pool and rings allocated (fill="rows": mostly untouched)
# Case.fill: "all" (the default): every pool and ring slot holds drawn values; "rows": only the slots
# of the case's rows are drawn, every other slot of the pool and the rings is zero (the pool-scale
# regime: pools of thousands of slots and past 2^31 elements, issue 18).
FILLS = ("all", "rows")
CURSOR_RANGE = (-64, 64)  # hist_len and flush_min: unguarded inputs are stored as given, within this
INT32 = (-2**31, 2**31)  # cache_base and negative (pad) slots: an int32 [lo, hi)
MAX_SCALE = 1e6  # regime qk_scale, v_scale, state_scale


def _int_or_none(x):
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _bounded(field: str, x, lo: int, hi: int | None, note: str = "") -> None:
    """ValueError unless x is an int with lo <= x <= hi (hi None: no upper bound)."""
    if _int_or_none(x) is None or x < lo or (hi is not None and x > hi):
        rng = f"an int, {lo} <= {field.rsplit('.', 1)[-1]}" + ("" if hi is None else f" <= {hi}")
        raise ValueError(f"{field}={x!r} is out of range; legal: {rng}" + (f" ({note})" if note else ""))


@functools.lru_cache(maxsize=None)
def _field_names(cls) -> tuple[frozenset, tuple]:
    """(every field name, the required ones in order) of dataclass cls: read once per class (a worker decodes a case
    per check, ten dicts each; dataclasses.fields was ~a third of that)."""
    fields = dataclasses.fields(cls)
    return (frozenset(f.name for f in fields),
            tuple(f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING))


def _check_keys(what: str, d: dict, cls) -> None:
    """ValueError naming unknown keys (and missing required ones) of a dict for dataclass cls."""
    known, required = _field_names(cls)
    if not known.issuperset(d):
        unknown = sorted(str(k) for k in d if k not in known)
        raise ValueError(f"{what} has unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{what} lacks required field(s) {', '.join(missing)}")


def case_fields(d, cls, items: str, item_cls, regime_cls) -> dict:
    """The keyword arguments of case class `cls` stored as `d` (a case's to_dict()): its version, its keys, its
    list `items` of `item_cls` objects (1 to MAX_ROWS) and its `regime_cls` regime, each checked before anything is
    built; ValueError naming the field otherwise.  The flush Case (rows) and the PrefixCase (requests) read so."""
    if not isinstance(d, dict):
        raise ValueError(f"a case must be a JSON object, got {type(d).__name__}")
    d = dict(d)
    ver = d.get("version", None)
    if ver != CASE_VERSION:
        raise ValueError(f"case version={ver!r} is not supported (this gdn_fuzz reads version {CASE_VERSION})")
    _check_keys("case", d, cls)
    seq = d[items]
    if not isinstance(seq, (list, tuple)):
        raise ValueError(f"case.{items} must be a list of {items}, got {type(seq).__name__}")
    if not 1 <= len(seq) <= MAX_ROWS:
        raise ValueError(f"case.{items} has {len(seq)} {items}; legal: 1 <= {items} <= {MAX_ROWS}")
    for i, r in enumerate(seq):
        if not isinstance(r, dict):
            names = ", ".join(f.name for f in dataclasses.fields(item_cls))
            raise ValueError(f"case.{items}[{i}] must be an object with {names}; got {r!r}")
        _check_keys(f"case.{items}[{i}]", r, item_cls)
    d[items] = tuple(item_cls(**r) for r in seq)
    reg = d.get("regime", {})
    if not isinstance(reg, dict):
        raise ValueError(f"case.regime must be an object, got {type(reg).__name__}")
    _check_keys("case.regime", reg, regime_cls)
    d["regime"] = regime_cls(**reg)
    return d


@dataclass(frozen=True)
class Row:
    """One batch row: pool slot (negative = pad row, M8), hist_len P, cache_base."""

    slot: int
    hist_len: int = 0
    cache_base: int = 0

    @property
    def pad(self) -> bool:
        return self.slot < 0


@dataclass(frozen=True)
class Regime:
    """How values are drawn.  Every field is a name a human can read in a failing case.

    qk_scale    element std of q and k before normalization ("tiny" and "huge" norms)
    v_scale     element std of v;  state_scale: element std of the checkpoints
    decay       weak | normal | strong | vanishing   (A_log, dt_bias and a together set g, M1)
    beta        near0 | mid | near1 | zero | one   (b, through the sigmoid; zero, one: exactly, in f32)
    keys        random | near_dup | zero_norm
    history     consistent (window records produced by the oracle from earlier tokens)
                | free (random normalized keys, random updates, decreasing G)
    poison      fill every ring slot outside the windows, g included, and the pool rows
                of slots no row uses, with NaN (R1: the launch must not read them)
    """

    qk_scale: float = 1.0
    v_scale: float = 1.0
    state_scale: float = 0.1
    decay: str = "normal"
    beta: str = "mid"
    keys: str = "random"
    history: str = "consistent"
    poison: bool = False


DECAYS = ("normal", "weak", "strong", "vanishing")  # first = where shrinking lands
BETAS = ("mid", "near0", "near1", "zero", "one")  # "zero", "one": beta exactly 0 / 1 in f32 (issue 18)
KEYS = ("random", "near_dup", "zero_norm")
HISTORIES = ("consistent", "free")


def check_regime_names(reg: Regime) -> Regime:
    """ValueError naming the field, its value and the legal ones, on the first of decay, beta, keys, history that
    is not a known name; else reg."""
    for name, legal in (("decay", DECAYS), ("beta", BETAS), ("keys", KEYS), ("history", HISTORIES)):
        if getattr(reg, name) not in legal:
            raise ValueError(f"case.regime.{name}={getattr(reg, name)!r} is illegal; legal: one of {', '.join(legal)}")
    return reg


@dataclass(frozen=True)
class Case:
    """One launch of the entry point.  B = len(rows); the pool has `pool` slots."""

    arm: str
    T: int
    H: int
    HV: int
    pool: int
    rows: tuple[Row, ...]
    seed: int
    flush_min: int | None = None
    restart_hist_on_flush: bool = False
    regime: Regime = field(default_factory=Regime)
    K: int = 128
    V: int = 128
    version: int = CASE_VERSION
    # How the values were drawn (corpus entries keep it, so a replay draws the same way):
    # "cpu" (default of every Case): all values from one seeded CPU generator, the same bits
    #   on every device.  Left out of to_dict().
    # "cuda": the bulk tensors (pool, rings, history tokens, the launch's q, k, v) from torch's
    #   CUDA generator (counter-based Philox) seeded with `seed`, on the CUDA device the case is
    #   launched on; the gates (A_log, dt_bias, a, b) still come from the CPU generator.  No large
    #   CPU draw or host-to-device copy (measured on an H200 at B = 64: materialize 728 ms -> 37 ms
    #   with the pool and rings on the device, docs/benchmarks.md).
    #   The bits are the CUDA generator's: materialize() refuses a non-CUDA device, and they
    #   may also differ under another torch release or GPU model (torch sizes the generator's
    #   launch by the device's multiprocessor count).
    # "device" (older entries): the bulk tensors from a generator on whatever device
    #   materialize() is given.
    # "graph" (what `gdn-fuzz run` passes on a CUDA device since issue 32): every value, the gates
    #   included, from torch's CUDA generator, by one program of fixed shapes (graph_program) that
    #   gdn_fuzz.graphs replays from a CUDA graph.  CUDA only, as "cuda".
    draws: str = "cpu"
    # How much of the pool and the rings holds drawn values (FILLS): "all", or "rows": only the slots
    # of the case's rows (their checkpoint, their rings: window and garbage around it); every other
    # slot is zero, allocated without being touched on the CPU (an untouched page costs no memory),
    # so a pool past 2^31 elements costs only the rows' slots to draw.  Left out of to_dict() when "all".
    fill: str = "all"

    @property
    def B(self) -> int:
        return len(self.rows)

    @property
    def arm_spec(self) -> Arm:
        return get_arm(self.arm)

    @property
    def fmin(self) -> int:
        """The flush threshold in force: flush_min, or the lazy default 17 - T."""
        return self.flush_min if self.flush_min is not None else lazy_flush_min(self.T)

    def row_kind(self, r: Row) -> str:
        if r.pad:
            return "pad"
        return "flush" if r.hist_len >= self.fmin else "verify"

    def to_dict(self) -> dict:
        """dataclasses.asdict(self) (rows a tuple of dicts, the regime a dict), less draws="cpu" and fill="all";
        built field by field: asdict's deep copies were most of an isolated check's round trip on the host."""
        d = {name: getattr(self, name) for name in _CASE_FIELDS}
        d["rows"] = tuple({"slot": r.slot, "hist_len": r.hist_len, "cache_base": r.cache_base} for r in self.rows)
        d["regime"] = {name: getattr(self.regime, name) for name in _REGIME_FIELDS}
        if d["draws"] == "cpu":  # stored cases keep their exact JSON
            del d["draws"]
        if d["fill"] == "all":
            del d["fill"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def record_fields(self) -> dict:
        """What a campaign's per-example record says of this case."""
        return dict(arm=self.arm, T=self.T, H=self.H, HV=self.HV, B=self.B, pool=self.pool, flush_min=self.fmin,
                    rows=[[r.slot, r.hist_len, r.cache_base] for r in self.rows], regime=self.regime.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        """The Case stored as `d` (to_dict()), validated (Case.validate) before anything is
        allocated; any problem raises ValueError with a one-line message naming the field."""
        case = cls(**case_fields(d, cls, "rows", Row, Regime))
        case.validate()
        return case

    def draw_bytes(self) -> int:
        """An estimate of the bytes materialize() draws for this case: its float32 bulk tensors
        (pool, rings, token inputs) and the float64 history of the windows.  Case.validate
        keeps it below MAX_CASE_BYTES."""
        B, T, H, HV, K, V = self.B, self.T, self.H, self.HV, self.K, self.V
        NP = self.pool if self.fill != "rows" else len(self.used_slots())
        pool = NP * HV * V * K
        rings = NP * RING_SLOTS * (H * K + HV * V + HV)
        tokens = B * T * (2 * H * K + HV * V + 2 * HV)
        history = B * W_RING * (H * K + HV * V + HV) * 2  # float64
        return 4 * (pool + rings + tokens + history)

    def pool_elements(self) -> int:
        """Elements of the state pool: pool * HV * V * K (past 2**31: int32 offsets overflow)."""
        return self.pool * self.HV * self.V * self.K

    def alloc_bytes(self) -> int:
        """Bytes of the pool and rings in their launch dtypes (what a device must hold for one copy)."""
        arm = self.arm_spec
        ring = self.pool * RING_SLOTS * (self.H * self.K + self.HV * self.V)
        return self.pool_elements() * arm.state.itemsize + ring * arm.ring.itemsize + self.pool * self.HV * RING_SLOTS * 4

    def used_slots(self) -> list[int]:
        """The pool slots the case's rows sit on, in row order (pad rows left out)."""
        return [r.slot for r in self.rows if not r.pad]

    def validate(self) -> "Case":
        """Check every field against its documented bounds; ValueError (one line naming the
        field, its value and the legal range) on the first that is out.  Returns self.

        Called by from_dict, i.e. on every case read from disk or received by a worker,
        before anything is allocated.  Not called by the constructor: properties build
        illegal cases on purpose (the guards property's T=6) with dataclasses.replace.

          version == CASE_VERSION; draws in DRAWS; arm a legal dtype arm (gdn_fuzz.arms)
          T in LEGAL_T (4, 8); K == V == 128; H >= 1, HV >= 1, HV % H == 0
          1 <= B (rows) <= MAX_ROWS; 1 <= pool <= MAX_POOL; draw_bytes() <= MAX_CASE_BYTES;
            alloc_bytes() <= MAX_ALLOC_BYTES; fill in FILLS
          rows: slot < pool (negative: a pad row), hist_len in CURSOR_RANGE, cache_base an
            int32 (the contract's unguarded inputs are legal to store, whatever they route to)
          flush_min None or in CURSOR_RANGE; seed in [0, 2**64); restart_hist_on_flush a bool
          regime: decay/beta/keys/history in DECAYS/BETAS/KEYS/HISTORIES; qk_scale, v_scale,
            state_scale finite, > 0 and <= MAX_SCALE; poison a bool
        """
        if self.version != CASE_VERSION:
            raise ValueError(f"case.version={self.version!r} is not supported; legal: {CASE_VERSION}")
        if self.draws not in DRAWS:
            raise ValueError(f"case.draws={self.draws!r} is illegal; legal: one of {', '.join(DRAWS)}")
        if self.fill not in FILLS:
            raise ValueError(f"case.fill={self.fill!r} is illegal; legal: one of {', '.join(FILLS)}")
        if not isinstance(self.arm, str) or self.arm not in ARM_NAMES:
            raise ValueError(f"case.arm={self.arm!r} is illegal; legal: one of {', '.join(ARM_NAMES)}")
        get_arm(self.arm)
        if _int_or_none(self.T) not in LEGAL_T:
            raise ValueError(f"case.T={self.T!r} is illegal; legal: one of {', '.join(map(str, LEGAL_T))}")
        for name, want in (("K", 128), ("V", 128)):
            if _int_or_none(getattr(self, name)) != want:
                raise ValueError(f"case.{name}={getattr(self, name)!r} is illegal; legal: {want}")
        _bounded("case.H", self.H, 1, None)
        _bounded("case.HV", self.HV, 1, None)
        if self.HV % self.H:
            raise ValueError(f"case.HV={self.HV} is illegal for H={self.H}; legal: a multiple of H")
        if not isinstance(self.rows, tuple) or not all(isinstance(r, Row) for r in self.rows):
            raise ValueError(f"case.rows must be a tuple of Row, got {type(self.rows).__name__}")
        if not 1 <= len(self.rows) <= MAX_ROWS:
            raise ValueError(f"case.rows has {len(self.rows)} rows; legal: 1 <= rows <= {MAX_ROWS}")
        _bounded("case.pool", self.pool, 1, MAX_POOL)
        for i, r in enumerate(self.rows):
            _bounded(f"case.rows[{i}].slot", r.slot, INT32[0], self.pool - 1,
                     f"below pool={self.pool}; negative: a pad row")
            _bounded(f"case.rows[{i}].hist_len", r.hist_len, *CURSOR_RANGE)
            _bounded(f"case.rows[{i}].cache_base", r.cache_base, INT32[0], INT32[1] - 1)
        if self.flush_min is not None:
            _bounded("case.flush_min", self.flush_min, *CURSOR_RANGE, "or null: 17 - T")
        _bounded("case.seed", self.seed, 0, 2**64 - 1)
        if not isinstance(self.restart_hist_on_flush, bool):
            raise ValueError(f"case.restart_hist_on_flush={self.restart_hist_on_flush!r} is illegal; legal: true/false")
        reg = self.regime
        if not isinstance(reg, Regime):
            raise ValueError(f"case.regime must be a Regime, got {type(reg).__name__}")
        check_regime_names(reg)
        for name in ("qk_scale", "v_scale", "state_scale"):
            x = getattr(reg, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and 0 < x <= MAX_SCALE):
                raise ValueError(f"case.regime.{name}={x!r} is illegal; legal: a finite number in (0, {MAX_SCALE:g}]")
        if not isinstance(reg.poison, bool):
            raise ValueError(f"case.regime.poison={reg.poison!r} is illegal; legal: true/false")
        nbytes = self.draw_bytes()
        if nbytes > MAX_CASE_BYTES:
            raise ValueError(f"case pool={self.pool}, HV={self.HV}, B={self.B} needs ~{nbytes / 2**30:.1f} GiB "
                             f"to materialize; legal: <= {MAX_CASE_BYTES / 2**30:g} GiB (MAX_CASE_BYTES)")
        nbytes = self.alloc_bytes()
        if nbytes > MAX_ALLOC_BYTES:
            raise ValueError(f"case pool={self.pool}, HV={self.HV} allocates ~{nbytes / 2**30:.1f} GiB of pool and "
                             f"rings; legal: <= {MAX_ALLOC_BYTES / 2**30:g} GiB (MAX_ALLOC_BYTES)")
        return self

    def describe(self) -> str:
        """A few readable lines: geometry, arm, and one line per row with its route and the
        routing or ring edges it sits on (P = flush_min, flush_min - 1, 0 or 16, a window or
        appends wrapping past slot 31), so an off-by-one reads as one.  Every row's cursors are
        those materialize() uses, pad rows' included (the host commits them with
        restart_hist_on_flush=True, C2)."""
        fm = f"{self.fmin}" + (" (17 - T)" if self.flush_min is None else "")
        lines = [f"Case(arm={self.arm}, T={self.T}, H={self.H}, HV={self.HV}, K={self.K}, V={self.V}, "
                 f"B={self.B}, pool={self.pool}, flush_min={fm}, "
                 f"restart_hist_on_flush={self.restart_hist_on_flush}, seed={self.seed}"
                 + ("" if self.draws == "cpu" else f", draws={self.draws}")
                 + ("" if self.fill == "all" else f", fill={self.fill}: slots no row uses are zero") + ")",
                 f"  regime: {self.regime}"]
        for i, r in enumerate(self.rows):
            edges = row_edges(self, i)
            lines.append(f"  row {i}: slot={r.slot:>3} P={r.hist_len:>2} base={r.cache_base:>2}  {self.row_kind(r)}"
                         + (f"  ({'; '.join(edges)})" if edges else ""))
        return "\n".join(lines)


_CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))
_REGIME_FIELDS = tuple(f.name for f in dataclasses.fields(Regime))


def row_edges(case: Case, i: int) -> list[str]:
    """The routing and ring edges row i of `case` sits on, in words (empty: none; pad rows: none):
    P = flush_min, P = flush_min - 1, P = 0, P = 16 (a full window), a window that wraps past
    ring slot 31 (base + P > 32), else appends that wrap (base + P + T > 32)."""
    r = case.rows[i]
    if r.pad:
        return []
    P, f = r.hist_len, case.fmin
    out = []
    if P == f:
        out.append(f"P = flush_min = {f}")
    if P == f - 1:
        out.append(f"P = flush_min - 1 = {P}")
    if P == 0:
        out.append("P = 0")
    if P == W_RING:
        out.append(f"P = {W_RING}: a full window")
    b = r.cache_base & (RING_SLOTS - 1)
    if P > 0 and b + P > RING_SLOTS:
        out.append(f"window wraps past slot 31: base {b} + P {P} > 32")
    elif b + max(P, 0) + case.T > RING_SLOTS:
        out.append(f"appends wrap past slot 31: base {b} + P {P} + T {case.T} > 32")
    return out


# ------------------------------------------------------------------ materialization


# decay: (low, high) of A = e^{A_log} (uniform) and the mean of the logits a (unit normal), per regime.decay
DECAY_DRAWS = {"weak": (1e-3, 1e-2, -3.0), "normal": (0.5, 4.0, -2.0), "strong": (4.0, 16.0, 0.5),
               "vanishing": (10.0, 20.0, 2.0)}
# beta: the mean of the logits b (std 1.5).  zero / one: sigma(b) is exactly 0 / 1 in f32 for |b| >~ 104 / 17
# (e^{+-b} overflows / underflows)
BETA_MU = {"near0": -8.0, "mid": 0.0, "near1": 8.0, "zero": -120.0, "one": 120.0}


def decay_params(regime: Regime, gen, B, T, HV):
    """(A_log [HV], dt_bias [HV], a [B, T, HV]) giving per-token g in the regime's range (M1).

    weak:   g ~ -1e-4 .. -1e-3 (memory kept for hundreds of tokens)
    normal: g ~ -0.05 .. -1    (Qwen3-Next-like: A = e^{A_log} in [0.5, 4])
    strong: g ~ -1 .. -8       (window contributions fall off by e^-8 per token)
    vanishing: g ~ -13 .. -61  (issue 18: mostly below -16.6, where e^g is under fp16's smallest
               subnormal 6e-8, and past a few tokens under f32's: the decays of N3's underflow note)
    """
    if regime.decay not in DECAY_DRAWS:
        raise ValueError(f"regime.decay={regime.decay!r}; use one of {DECAYS}")
    lo, hi, a_mu = DECAY_DRAWS[regime.decay]
    A = torch.empty(HV).uniform_(lo, hi, generator=gen)
    dt_bias = torch.randn(HV, generator=gen) * 0.5
    a = a_mu + torch.randn(B, T, HV, generator=gen)
    return torch.log(A), dt_bias, a


def _beta_logits(regime: Regime, gen, shape):
    mu = BETA_MU.get(regime.beta)
    if mu is None:
        raise ValueError(f"regime.beta={regime.beta!r}; use one of {BETAS}")
    return mu + torch.randn(shape, generator=gen) * 1.5


def _keys(regime: Regime, gen, shape):
    k = torch.randn(shape, generator=gen, device=gen.device)
    if regime.keys == "near_dup":  # every token's key within 1e-3 of token 0's
        k = k[:, :1] + 1e-3 * k
    elif regime.keys == "zero_norm":  # tokens 1 and T-1 carry all-zero keys
        k[:, 1] = 0
        k[:, -1] = 0
    elif regime.keys != "random":
        raise ValueError(f"regime.keys={regime.keys!r}; use one of {KEYS}")
    return k * regime.qk_scale


def draw_tokens(reg: Regime, gen, B: int, T: int, H: int, HV: int, K: int, V: int, bulk=None):
    """One launch's token inputs from `gen`, in a fixed draw order (corpus entries rely on it).

    Returns float32 tensors q, k [B, T, H, K], v [B, T, HV, V], A_log, dt_bias [HV], a, b [B, T, HV],
    on the CPU; with `bulk` (a generator, possibly on a GPU) q, k and v come from it, on its device.
    """
    big = gen if bulk is None else bulk
    q = torch.randn(B, T, H, K, generator=big, device=big.device) * reg.qk_scale
    k = _keys(reg, big, (B, T, H, K))
    v = torch.randn(B, T, HV, V, generator=big, device=big.device) * reg.v_scale
    A_log, dt_bias, a = decay_params(reg, gen, B, T, HV)
    b = _beta_logits(reg, gen, (B, T, HV))
    return q, k, v, A_log, dt_bias, a, b


DRAWS = ("cpu", "cuda", "device", "graph")


def draws_for(device: str | torch.device) -> str:
    """The draws of a campaign on `device`: "graph" on a CUDA device (every value drawn there, by the draw program
    a CUDA graph replays), else "cpu"."""
    return "graph" if torch.device(device).type == "cuda" else "cpu"


def materialize(case: Case, device: str | torch.device = "cpu", *,
                history_device: str | torch.device | None = None) -> dict:
    """The keyword arguments of one entry-point call, generated from case.seed.

    Values come from a generator seeded with case.seed, in a fixed draw order (corpus
    entries rely on it): one CPU generator for everything (case.draws == "cpu", the
    default: the same bits on every device), or for case.draws == "cuda" (and the legacy
    "device") the bulk tensors from a generator on `device` (see Case.draws; draws="cuda"
    needs a CUDA `device`: ValueError otherwise).
    They are rounded to the arm's dtypes, then moved to `device`.  Slots of the pool that
    no row uses, and ring slots outside every window, hold random values (or NaN with
    regime.poison).

    The float64 history recurrence that fills consistent windows, the window writes and
    the poison run on `history_device` (default: `device`), vectorized over rows and
    heads.  On a GPU that float64 arithmetic (exp, log, the reductions) may round
    differently from the CPU's in the last float64 bit; the records are stored in float32
    or narrower, so the stored bits are almost always the CPU's (a flip needs a value
    within ~2^-29 of a float32 rounding boundary).  history_device="cpu" gives exactly the
    CPU bits on any device, at the cost of running the recurrence on the CPU.  On a CUDA
    device the recurrence is one Triton kernel (fused_oracle.history: the fused oracle's
    kernel without window or magnitudes) wherever GDN_FUZZ_ORACLE picks the fused oracle, else
    oracles.gdn.sequential; the two differ in float64 rounding only (tests/test_fused_oracle.py).
    """
    if case.draws not in DRAWS:
        raise ValueError(f"case.draws={case.draws!r}; use one of {DRAWS}")
    if case.fill == "rows":
        return _materialize_rows(case, device, history_device)
    arm = case.arm_spec
    dev = torch.device(device)
    if case.draws == "graph":
        if dev.type != "cuda":
            raise ValueError(
                f"case.draws='graph': this case's values were drawn by torch's CUDA generator, and on "
                f"device={str(device)!r} they would be other values (another launch than the one that was found); "
                "replay it on a CUDA device (--device cuda)")
        if history_device is not None and torch.device(history_device) != dev:
            raise ValueError(f"history_device={str(history_device)!r}: a draws='graph' case fills its windows on "
                             f"its launch's device ({dev}); leave history_device out")
        return _materialize_graph(case, dev)
    if case.draws == "cuda" and dev.type != "cuda":
        raise ValueError(
            f"case.draws='cuda': this case's pool, rings and history were drawn by torch's CUDA generator, "
            f"and on device={str(device)!r} they would be other values (another launch than the one that "
            "was found); replay it on a CUDA device (--device cuda)")
    hdev = dev if history_device is None else torch.device(history_device)
    gen = torch.Generator().manual_seed(case.seed)
    bulk = gen if case.draws == "cpu" else torch.Generator(device=dev).manual_seed(case.seed)  # cuda, device
    B, T, H, HV, K, V, NP = case.B, case.T, case.H, case.HV, case.K, case.V, case.pool
    reg = case.regime
    # draws="cuda": the value-sized token inputs (q, k, v) on the device too; "device" (legacy): on the CPU
    q, k, v, A_log, dt_bias, a, b = draw_tokens(reg, gen, B, T, H, HV, K, V,
                                                bulk=bulk if case.draws == "cuda" else None)
    bd = bulk.device
    pool = torch.randn(NP, HV, V, K, generator=bulk, device=bd) * reg.state_scale
    # ring garbage everywhere, then each row's window
    k_cache = gdn_oracle.l2norm(torch.randn(NP, H, RING_SLOTS, K, generator=bulk, device=bd)).float()
    u_cache = torch.randn(NP, HV, RING_SLOTS, V, generator=bulk, device=bd) * reg.v_scale
    g_cache = -torch.rand(NP, HV, RING_SLOTS, generator=bulk, device=bd) * 4.0
    pool, k_cache, u_cache, g_cache = (x.to(hdev) for x in (pool, k_cache, u_cache, g_cache))
    A_io = A_log.to(arm.io)
    dt_io = dt_bias.to(arm.io)
    _fill_windows(case, gen, bulk, pool.to(arm.state), k_cache, u_cache, g_cache, A_io, dt_io)
    if reg.poison:
        _poison(case, pool, k_cache, u_cache, g_cache)
    idx = torch.tensor([r.slot for r in case.rows], dtype=torch.int32)
    return dict(
        A_log=A_io.to(dev), dt_bias=dt_io.to(dev),
        a=a.to(arm.io).to(dev), b=b.to(arm.io).to(dev),
        q=q.to(arm.io).to(dev), k=k.to(arm.io).to(dev), v=v.to(arm.io).to(dev),
        initial_state_source=pool.to(arm.state).to(dev),
        initial_state_indices=idx.to(dev),
        k_cache=k_cache.to(arm.ring).to(dev), u_cache=u_cache.to(arm.ring).to(dev),
        g_cache=g_cache.float().to(dev),
        hist_len=torch.tensor([r.hist_len for r in case.rows], dtype=torch.int32).to(dev),
        cache_base=torch.tensor([r.cache_base for r in case.rows], dtype=torch.int32).to(dev),
        flush_min=case.flush_min,
        restart_hist_on_flush=case.restart_hist_on_flush,
    )


# ------------------------------------------------------------------ draws="graph"
#
# One program of fixed shapes: every value from one generator on the launch's device, the rows' cursors and the
# regime as device data.  Its tensor shapes depend only on graph_dims (arm, B, T, H, HV, K, V, the pool rounded up,
# poison), so gdn_fuzz.graphs captures it once per such key as a CUDA graph and replays it with the next case's seed, rows and regime: one
# replay instead of ~150 small operations, each ~10-20 us of host time (docs/benchmarks.md, issue 32).  What it
# draws is what materialize() draws for the other modes, structure for structure (the same regimes, windows,
# history and poison); the values are this program's own.

GRAPH_REGIME = ("qk_scale", "v_scale", "state_scale", "A_low", "A_high", "a_mu", "b_mu", "near_dup", "zero_norm",
                "free")


GRAPH_POOL_STEP = 8  # the draw program draws the pool and rings at graph_pool_rows(pool) rows: one key per 8 sizes
GRAPH_POOL_MIN = 16  # (a campaign's small pools, a bucket of 4 or 8 rows + up to 6 spare, share one key)


def graph_pool_rows(pool: int) -> int:
    """The rows the draw program draws the pool and rings at, for a case of `pool` slots (the first `pool` are
    the case's): pool rounded up to a multiple of GRAPH_POOL_STEP, at least GRAPH_POOL_MIN."""
    return max(GRAPH_POOL_MIN, -(-int(pool) // GRAPH_POOL_STEP) * GRAPH_POOL_STEP)


def graph_dims(case: Case) -> tuple:
    """What the draw program's shapes depend on, and the poison (without it the program skips four passes over the
    pool and rings): its graph key (gdn_fuzz.graphs.draw)."""
    return case.arm, case.B, case.T, case.H, case.HV, case.K, case.V, graph_pool_rows(case.pool), case.regime.poison


def graph_data(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The draw program's per-case inputs, on the CPU: rows [3, B] int32 (slot, hist_len, cache_base; a pad row's
    negative slot as given) and the regime [len(GRAPH_REGIME)] float32."""
    reg = check_regime_names(case.regime)  # a case built with dataclasses.replace is not validated
    rows = torch.tensor([[r.slot for r in case.rows], [r.hist_len for r in case.rows],
                         [r.cache_base for r in case.rows]], dtype=torch.int32)
    lo, hi, a_mu = DECAY_DRAWS[reg.decay]
    named = dict(qk_scale=reg.qk_scale, v_scale=reg.v_scale, state_scale=reg.state_scale, A_low=lo, A_high=hi,
                 a_mu=a_mu, b_mu=BETA_MU[reg.beta], near_dup=reg.keys == "near_dup",
                 zero_norm=reg.keys == "zero_norm", free=reg.history == "free")
    return rows, torch.tensor([float(named[n]) for n in GRAPH_REGIME], dtype=torch.float32)


def _graph_keys(k, near_dup, zero_norm):
    """_keys' regimes as device data: near_dup (every key within 1e-3 of token 0's), zero_norm (tokens 1 and T-1
    all zero)."""
    k = torch.where(near_dup, k[:, :1] + 1e-3 * k, k)
    t = torch.arange(k.shape[1], device=k.device)
    zero = zero_norm & ((t == 1) | (t == k.shape[1] - 1))
    return torch.where(zero[None, :, None, None], 0.0, k)


def graph_program(rows: torch.Tensor, regime: torch.Tensor, gen: torch.Generator, dims: tuple) -> dict:
    """The tensors of one launch (materialize()'s, less flush_min and restart_hist_on_flush; the pool and rings at
    graph_pool_rows(pool) rows), from `gen` and the device data of graph_data(), on gen's device.  No host
    synchronization and no shape that depends on a value, so a CUDA graph captures it.

      tokens   q, k, v ~ N(0, 1) scaled as the regime says, A_log, dt_bias, a, b as decay_params and _beta_logits
      pool     N(0, state_scale^2); rings: normalized random keys, random updates, decreasing G (garbage)
               (drawn at graph_pool_rows(pool) rows, the first `pool` kept)
      windows  every row's 16 history tokens are drawn, pad rows' too; the records j < hist_len of a real row go
               to ring slot (cache_base + j) & 31 of its pool row (consistent: the float64 recurrence from its
               checkpoint; free: random), the others to a scratch pool row past the last, cut off
      poison   NaN outside the windows of the rows' pool rows and in pool rows no real row uses (R1)
    """
    arm_name, B, T, H, HV, K, V, R, poison = dims
    arm = get_arm(arm_name)
    dev = gen.device
    qk, vs, ss, A_lo, A_hi, a_mu, b_mu, near_dup, zero_norm, free = regime.unbind(0)  # GRAPH_REGIME's order
    near_dup, zero_norm, free = near_dup != 0, zero_norm != 0, free != 0

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=dev)

    q = randn(B, T, H, K) * qk
    k = _graph_keys(randn(B, T, H, K), near_dup, zero_norm) * qk
    v = randn(B, T, HV, V) * vs
    A_log = torch.log(A_lo + (A_hi - A_lo) * torch.rand(HV, generator=gen, device=dev))
    dt_bias = randn(HV) * 0.5
    a = a_mu + randn(B, T, HV)
    b = b_mu + randn(B, T, HV) * 1.5
    # R = graph_pool_rows(pool) rows (materialize keeps the first `pool`), and a scratch row past them, where the
    # records of rows that write none go
    pool = randn(R, HV, V, K) * ss
    k_buf = gdn_oracle.l2norm(randn(R + 1, H, RING_SLOTS, K)).float()
    u_buf = randn(R + 1, HV, RING_SLOTS, V) * vs
    g_buf = -torch.rand(R + 1, HV, RING_SLOTS, generator=gen, device=dev) * 4.0
    hk = _graph_keys(randn(B, W_RING, H, K), near_dup, zero_norm) * qk
    hv = randn(B, W_RING, HV, V) * vs
    ha = a_mu + randn(B, W_RING, HV)
    hb = b_mu + randn(B, W_RING, HV) * 1.5

    A_io, dt_io, hv_io = A_log.to(arm.io), dt_bias.to(arm.io), hv.to(arm.io)
    g, beta = gdn_oracle.gates(ha.to(arm.io), dt_io, A_io, hb.to(arm.io))
    hk_io = hk.to(arm.io)
    _, k_hat = gdn_oracle.normalized_qk(hk_io, hk_io, HV, 1.0)
    slot, P, base = rows.long().unbind(0)
    real = slot >= 0
    at = torch.where(real, slot, 0)  # a pad row's history starts from row 0's checkpoint and is never written
    U = window_history(pool.to(arm.state), at, g, beta, k_hat, hv_io)
    kw = torch.where(free, gdn_oracle.l2norm(hk), k_hat[:, :, :: HV // H])  # [B, 16, H, K]
    U = torch.where(free, hv.double() * 0.5, U)
    Gc = torch.cumsum(g, 1)

    def window(n):  # ring slots of records j < n, and the pool row each goes to (R: the scratch row)
        j = torch.arange(n, device=dev)
        inside = real[:, None] & (j[None, :] < P[:, None])
        return torch.where(inside, at[:, None], R), (base[:, None] + j[None, :]) & (RING_SLOTS - 1)

    to, s = window(W_RING)
    k_buf.permute(0, 2, 1, 3)[to, s] = kw.float()
    u_buf.permute(0, 2, 1, 3)[to, s] = U.float()
    g_buf.permute(0, 2, 1)[to, s] = Gc.float()

    if poison:
        to, s = window(RING_SLOTS)  # a window past 32 records keeps every slot
        true = torch.ones((), dtype=torch.bool, device=dev)  # a device value: `t[i] = True` copies one from the host
        keep = torch.zeros(R + 1, RING_SLOTS, dtype=torch.bool, device=dev).index_put_((to, s), true)
        used = torch.zeros(R + 1, dtype=torch.bool, device=dev).index_put_((torch.where(real, slot, R),), true)
        nan = float("nan")
        pool = pool.masked_fill(~used[:R, None, None, None], nan)
        k_buf = k_buf.masked_fill(~keep[:, None, :, None], nan)
        u_buf = u_buf.masked_fill(~keep[:, None, :, None], nan)
        g_buf = g_buf.masked_fill(~keep[:, None, :], nan)
    return dict(
        A_log=A_io, dt_bias=dt_io, a=a.to(arm.io), b=b.to(arm.io),
        q=q.to(arm.io), k=k.to(arm.io), v=v.to(arm.io),
        initial_state_source=pool.to(arm.state), initial_state_indices=rows[0],
        k_cache=k_buf[:R].to(arm.ring), u_cache=u_buf[:R].to(arm.ring), g_cache=g_buf[:R],
        hist_len=rows[1], cache_base=rows[2],
    )


def _materialize_graph(case: Case, dev: torch.device) -> dict:
    """materialize() of a draws="graph" case: graph_program, replayed from a CUDA graph where gdn_fuzz.graphs
    allows (the same bits as run eagerly: tests/test_graphs.py on a GPU)."""
    from gdn_fuzz import graphs  # graphs imports nothing of this module's; lazily, for the import time of --help

    rows, regime = graph_data(case)
    out = graphs.draw(graph_program, graph_dims(case), rows, regime, case.seed, dev, pool=case.pool)
    return dict(out, flush_min=case.flush_min, restart_hist_on_flush=case.restart_hist_on_flush)


def compact(case: Case) -> Case:
    """A fill="rows" case's rows renumbered onto a pool of just their slots, in row order (fill="all"): what
    materialize draws a fill="rows" case from (a row's values depend on the seed and the row order, not on the
    pool size), and the launch check_launch judges the rows of a fill="rows" launch against."""
    renum = {s: i for i, s in enumerate(case.used_slots())}
    return dataclasses.replace(case, pool=max(len(renum), 1), fill="all",
                               rows=tuple(r if r.pad else dataclasses.replace(r, slot=renum[r.slot]) for r in case.rows))


def spread_rows(case: Case, small: dict, at: torch.Tensor | None = None) -> dict:
    """The inputs of the fill="rows" case `case` from those of compact(case) (`small`, left as it is): its pool and
    rings of case.pool slots, zero everywhere but the rows' slots, which hold small's rows (lazy_zeros: on the CPU,
    memory no one writes is never allocated), and its slot indices; every other entry is small's own.  at: the
    rows' slots (case.used_slots()) as an int64 tensor on small's device, where the caller has them already."""
    from gdn_fuzz import graphs  # lazily, as in _materialize_graph

    used = case.used_slots()
    inputs = dict(small)
    dev = small["initial_state_source"].device
    at = torch.tensor(used, dtype=torch.long, device=dev) if at is None else at
    for name in graphs.POOL_BUFFERS:
        t = small[name]
        big = lazy_zeros((case.pool, *t.shape[1:]), t.dtype, dev)
        big[at] = t[:len(used)]
        inputs[name] = big
    inputs["initial_state_indices"] = torch.tensor([r.slot for r in case.rows], dtype=torch.int32).to(dev)
    return inputs


def _materialize_rows(case: Case, device, history_device) -> dict:
    """materialize() of a fill="rows" case: compact(case) materialized, then spread onto the case's pool
    (spread_rows)."""
    return spread_rows(case, materialize(compact(case), device, history_device=history_device))


def lazy_zeros(shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """A zero tensor; on the CPU backed by a fresh anonymous mapping, which the OS fills with
    zeros page by page on first touch, so pages no one writes cost no memory (a pool past 2^31
    elements with a few rows on it).  Elsewhere torch.zeros."""
    dev = torch.device(device)
    if dev.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=dev)
    n = math.prod(shape)
    buf = mmap.mmap(-1, max(n, 1) * dtype.itemsize)
    return torch.frombuffer(buf, dtype=dtype, count=max(n, 1))[:n].view(shape)


def _windows(rows, max_len: int | None = None):
    """(row, j, slot) index triples of every window record j < P of `rows` (CPU int64).

    row: position in `rows`; slot: ring slot (base + j) & 31.  No Python loop over rows.
    """
    P = torch.tensor([r.hist_len for r in rows], dtype=torch.long)
    base = torch.tensor([r.cache_base for r in rows], dtype=torch.long)
    n = max([r.hist_len for r in rows] + [0]) if max_len is None else max_len
    j = torch.arange(n)
    m_, j_ = (j[None, :] < P[:, None]).nonzero(as_tuple=True)
    return m_, j_, (base[m_] + j_) & (RING_SLOTS - 1)


def window_history(pool_state, slots, g, beta, k_hat, v):
    """U [n, 16, HV, V] float64: the corrected updates of the history tokens from the checkpoints pool_state[slots]
    (oracles.gdn.sequential), as one Triton kernel (fused_oracle.history) on a CUDA device where GDN_FUZZ_ORACLE
    picks the fused oracle; the two differ in float64 rounding only."""
    dev = k_hat.device
    if dev.type == "cuda" and fused_oracle.oracle_for(dev) is fused_oracle.launch:
        return fused_oracle.history(pool_state, slots, g, beta, k_hat, v)
    return gdn_oracle.sequential(pool_state[slots].double(), k_hat, k_hat, v, g, beta, keep_states=False)[1]


def _fill_windows(case: Case, gen, bulk, pool_state, k_cache, u_cache, g_cache, A_io, dt_io):
    """Write each non-pad row's P window records at slot (base + j) & 31, j < P.

    consistent: run W_RING history tokens through the float64 recurrence from the row's
    checkpoint and record (k_hat, U, G cumulative from the checkpoint), as earlier launches
    would have; free: random normalized keys, random updates, decreasing G.
    History keys and values come from `bulk` (= gen when case.draws == "cpu"), decay
    and beta from gen.  Everything after the draws runs on the caches' device, with one
    indexed write per buffer for all rows.
    """
    arm = case.arm_spec
    live = [r for r in case.rows if not r.pad and r.hist_len > 0]
    n = len(live)
    H, HV, K, V = case.H, case.HV, case.K, case.V
    reg = case.regime
    # drawn for every case (even with no window) so that a row's values depend on the seed only
    hk = _keys(reg, bulk, (max(n, 1), W_RING, H, K))
    hv_ = torch.randn(max(n, 1), W_RING, HV, V, generator=bulk, device=bulk.device) * reg.v_scale
    _, _, ha = decay_params(reg, gen, max(n, 1), W_RING, HV)
    hb = _beta_logits(reg, gen, (max(n, 1), W_RING, HV))
    if n == 0:
        return
    dev = k_cache.device
    ha, hb = ha.to(arm.io).to(dev), hb.to(arm.io).to(dev)
    A_io, dt_io = A_io.to(dev), dt_io.to(dev)
    if reg.history == "consistent":
        g, beta = gdn_oracle.gates(ha, dt_io, A_io, hb)
        hk_io = hk.to(arm.io).to(dev)
        _, k_hat = gdn_oracle.normalized_qk(hk_io, hk_io, HV, 1.0)
        slots = torch.tensor([r.slot for r in live], device=dev)
        U = window_history(pool_state, slots, g, beta, k_hat, hv_.to(arm.io).to(dev))
        kw = k_hat[:, :, :: HV // H]  # [n, 16, H, K]
        Gc = torch.cumsum(g, 1)  # [n, 16, HV]
    elif reg.history == "free":
        kw = gdn_oracle.l2norm(hk).to(dev)
        U = hv_.double().to(dev) * 0.5
        g, _ = gdn_oracle.gates(ha, dt_io, A_io, hb)
        Gc = torch.cumsum(g, 1)
    else:
        raise ValueError(f"regime.history={reg.history!r}; use one of {HISTORIES}")
    m_, j_, s_ = _windows(live, W_RING)
    row_ = torch.tensor([r.slot for r in live], dtype=torch.long)[m_]
    m_, j_, s_, row_ = (x.to(dev) for x in (m_, j_, s_, row_))
    # rows sit on distinct slots and a window holds distinct ring slots: no write collides
    k_cache.permute(0, 2, 1, 3)[row_, s_] = kw[m_, j_].float()  # [n_records, H, K]
    u_cache.permute(0, 2, 1, 3)[row_, s_] = U[m_, j_].float()  # [n_records, HV, V]
    g_cache.permute(0, 2, 1)[row_, s_] = Gc[m_, j_].float()  # [n_records, HV]


def _poison(case: Case, pool, k_cache, u_cache, g_cache):
    """NaN in every ring slot outside the windows and in pool rows no batch row uses (R1)."""
    nan = float("nan")
    real = [r for r in case.rows if not r.pad]
    keep = torch.zeros(case.pool, RING_SLOTS, dtype=torch.bool)  # window slots of used pool rows
    used = torch.zeros(case.pool, dtype=torch.bool)
    if real:
        slot = torch.tensor([r.slot for r in real], dtype=torch.long)
        used[slot] = True
        m_, _, s_ = _windows(real)
        keep[slot[m_], s_] = True
    keep, used = keep.to(k_cache.device), used.to(pool.device)
    pool.masked_fill_(~used[:, None, None, None], nan)
    k_cache.masked_fill_(~keep[:, None, :, None], nan)
    u_cache.masked_fill_(~keep[:, None, :, None], nan)
    g_cache.masked_fill_(~keep[:, None, :], nan)


def default_scale(case: Case) -> float:
    return 1.0 / math.sqrt(case.K)
