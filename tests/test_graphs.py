"""check_launch's device half replayed as a CUDA graph (gdn_fuzz.graphs, issue 32).

On CUDA: a replay gives the eager verdict's bits on every case of a captured key (a graph reads the
static copies of the observation, so a stale pointer or a baked-in value of the first case would show
as a difference on the next ones), and check_launch reports the same findings and metrics with graphs
on and off, on the reference target and on mutants whose bugs it finds.  On a CPU: the choice of
GDN_FUZZ_GRAPHS is validated, and run() is eager (nothing to capture).
"""

from __future__ import annotations

import dataclasses
import traceback

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from gdn_fuzz import checks, graphs
from gdn_fuzz.case import BETAS, DECAYS, KEYS, Case, Regime, Row, graph_data, graph_dims, graph_program
from gdn_fuzz.observation import observe
from gdn_fuzz.targets import get_target
from gdn_fuzz.oracles import ring

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (gdn_fuzz.graphs "
                          "captures only there; on a CPU check_launch runs eagerly, which the other tests cover)")

# one key: fixed arm, T, geometry, pool, flush_min; the rows (slots, windows, cursors), seeds and regimes vary
ROWS = st.lists(st.tuples(st.integers(0, 16), st.integers(0, 31)), min_size=3, max_size=3)


@st.composite
def same_key_cases(draw):
    """One key (graphs.key): the pool (3..12 rows: one padded key), flush_min (legal for T = 4: 1..13), rows,
    seeds and poison vary."""
    pool = draw(st.integers(3, 12))
    slots = draw(st.permutations(range(pool)))[:3]
    rows = tuple(Row(s, p, c) for s, (p, c) in zip(slots, draw(ROWS)))
    if draw(st.booleans()):
        rows = (Row(-1, draw(st.integers(0, 16)), 0),) + rows[1:]
    return Case(arm="bf16", T=4, H=2, HV=4, pool=pool, flush_min=draw(st.integers(1, 13)), rows=rows,
                seed=draw(st.integers(0, 2**31 - 1)), draws="cuda", regime=Regime(poison=draw(st.booleans())))


def CURSORS(obs):  # what check_observed passes: the host cursor check a replay skips
    checks._check_case_cursors(obs.case)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int64)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv(graphs.ENV, "auto")
    graphs.reset()
    yield
    graphs.reset()


@cuda
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=same_key_cases(), name=st.sampled_from(("reference", "mutant:fold_skipped", "mutant:pad_rows_write")))
def test_replay_gives_the_eager_bits(fresh, case, name):
    """graphs.run(checks.verdict, obs, CURSORS) equals checks.verdict(obs), bit for bit, whether the key's graph was just
    captured, replayed with another case's tensors (another pool size and flush_min: the padded rows and the
    flush_min tensor), or not yet captured (first sighting)."""
    obs = observe(get_target(name), case, "cuda")
    assert obs.error is None, obs.error
    want = checks.verdict(obs).clone()
    for _ in range(graphs.CAPTURE_AT + 1):
        got = graphs.run(checks.verdict, obs, CURSORS)
        assert torch.equal(bits(got), bits(want)), (got - want).abs().max()
    s = graphs.stats()
    assert not s.failed, s.failed
    assert s.replays >= 1


@cuda
def test_a_graph_replays_for_the_next_case(fresh):
    """One key, many cases: after the capture every check is a replay (no new capture), and each replay gives
    that case's eager verdict (a graph that kept its first case's values would fail here).  The pools shrink
    from 12 rows to 4 after launches that wrote rows 11 and 9 (flush rows): rows past a pool must read as
    unchanged, not as the previous launch's writes."""
    target = get_target("reference")
    base = Case(arm="bf16", T=4, H=2, HV=4, pool=12, flush_min=9, draws="cuda",
                rows=(Row(11, 16, 20), Row(0, 9, 30), Row(3, 3, 1)), seed=0)
    for seed, (pool, top) in enumerate(((12, 11), (12, 9), (10, 9), (4, 2), (4, 2), (6, 5))):
        case = dataclasses.replace(base, seed=seed, pool=pool, rows=(Row(top, 16, 20),) + base.rows[1:])
        obs = observe(target, case, "cuda")
        want = checks.verdict(obs).clone()
        assert torch.equal(bits(graphs.run(checks.verdict, obs, CURSORS)), bits(want))
    s = graphs.stats()
    assert (s.captures, s.replays, s.eager) == (1, 6 - graphs.CAPTURE_AT + 1, graphs.CAPTURE_AT - 1), s


@st.composite
def same_dims_cases(draw, poison: bool):
    """One draw-graph key (case.graph_dims: arm, B, T, geometry, rounded pool, poison): the pool (6-16 slots), rows
    (pad rows, windows past 16 and 32, negative cache_base), seeds and every other regime field vary."""
    pool = draw(st.integers(6, 16))  # one rounded pool size (case.graph_pool_rows): one key
    slots = draw(st.permutations(range(pool)))[:4]
    rows = tuple(Row(s if draw(st.integers(0, 3)) else -1 - draw(st.integers(0, 2)), draw(st.integers(0, 40)),
                     draw(st.integers(-40, 40))) for s in slots)
    regime = Regime(decay=draw(st.sampled_from(DECAYS)), beta=draw(st.sampled_from(BETAS)),
                    keys=draw(st.sampled_from(KEYS)), history=draw(st.sampled_from(("consistent", "free"))),
                    poison=poison, qk_scale=draw(st.sampled_from((1.0, 1e-3, 30.0))),
                    v_scale=draw(st.sampled_from((1.0, 1e-2))), state_scale=draw(st.sampled_from((0.1, 10.0))))
    return Case(arm="bf16", T=4, H=2, HV=4, pool=pool, rows=rows, seed=draw(st.integers(0, 2**64 - 1)), draws="graph",
                regime=regime)


def eager_draw(case):
    rows, regime = graph_data(case)
    gen = torch.Generator(device="cuda").manual_seed(case.seed)
    return graphs._owned(graph_program(rows.cuda(), regime.cuda(), gen, graph_dims(case)), case.pool)


@cuda
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.booleans().flatmap(lambda poison: st.lists(same_dims_cases(poison), min_size=graphs.CAPTURE_AT + 2,
                                                            max_size=graphs.CAPTURE_AT + 4)))
def test_a_draw_replay_gives_the_eager_bits(fresh, cases):
    """materialize of draws="graph" cases of one key: the first sightings run the program eagerly, then one capture,
    then replays with each case's seed, rows and regime; every tensor equals the program run eagerly from that
    case's seed, bit for bit (a replay that kept a value of the captured case, or drew from another Philox offset,
    would differ)."""
    from gdn_fuzz.case import materialize

    graphs.reset()
    for case in cases:
        got, want = materialize(case, "cuda"), eager_draw(case)
        for k, v in want.items():
            assert torch.equal(bits8(got[k]), bits8(v)), k
    s = graphs.draw_stats()
    assert not s.failed, s.failed
    assert (s.captures, s.eager, s.replays) == (1, graphs.CAPTURE_AT - 1, len(cases) - graphs.CAPTURE_AT + 1), s


def bits8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_the_draw_program_reads_nothing_on_the_host():
    """What makes case.graph_program capturable: no op in it reads a device value on the host or copies Python
    data to the device (run on the CPU, where every tensor is a CPU tensor)."""
    case = Case(arm="bf16", T=4, H=2, HV=4, pool=6, seed=3, draws="graph", regime=Regime(poison=True),
                rows=(Row(2, 20, -3), Row(-1, 9, 30), Row(0, 40, 1)))
    rows, regime = graph_data(case)
    gen = torch.Generator().manual_seed(case.seed)
    with _HostReads() as reads:
        graph_program(rows, regime, gen, graph_dims(case))
    assert not reads.seen, reads.seen


@cuda
@pytest.mark.parametrize("draws", ("cuda", "graph"))
@pytest.mark.parametrize("name", ("reference", "mutant:fold_skipped", "mutant:anchor_off_by_one",
                                  "mutant:no_local_g_restart", "mutant:pad_rows_write"))
def test_check_launch_same_with_and_without_graphs(fresh, monkeypatch, name, draws):
    """Property strength unchanged: check_launch's findings and per-row metrics are the same with the check
    replayed from a graph (auto) and run eagerly (off), on the same observed launches (a launch of
    pad_rows_write is not deterministic: its pad row and a live row write one pool row, a torch index_put
    with a repeated index, whose winner may change from launch to launch)."""
    target = get_target(name)
    cases = [Case(arm="bf16", T=4, H=2, HV=4, pool=4, flush_min=fm, draws=draws, seed=s, rows=rows)
             for fm in (9, 3) for s in range(3)
             for rows in ((Row(2, 16, 20), Row(0, 9, 30), Row(3, 3, 1)),  # a pad row (pad_rows_write writes it)
                          (Row(2, 16, 20), Row(-1, 9, 30), Row(3, 3, 1)))]

    observed = [observe(target, c, "cuda") for c in cases]

    def run_all():
        out = []
        for obs in observed:
            f = checks.check_observed(obs)
            out.append(([str(x) for x in f], f.metrics))
        return out

    monkeypatch.setenv(graphs.ENV, "off")
    eager = run_all()
    monkeypatch.setenv(graphs.ENV, "auto")
    graphed = run_all()
    assert graphed == eager
    assert graphs.stats().replays >= 2
    if name != "reference":
        assert any(f for f, _ in eager), f"{name}: no finding on these cases (the test would be vacuous)"


@cuda
@pytest.mark.parametrize("name", ("reference", "mutant:fold_skipped"))
def test_a_case_drawn_ahead_changes_no_verdict(fresh, name):
    """What an isolated worker does with a case sent ahead (gdn_fuzz.engine.isolation, $GDN_FUZZ_DRAW_AHEAD): each
    launch begun (checks.begin_launch: its verdict and transfer queued), the next case drawn (prepare_launch: a
    replay of the same draw graph, which rewrites the outputs it holds, while the verdict is still queued), then the
    launch finished.  The same findings and metric bits as check_launch of each case alone, on replayed graphs."""
    target = get_target(name)
    cases = [Case(arm="bf16", T=4, H=2, HV=4, pool=4, flush_min=fm, draws="graph", seed=s,
                  rows=(Row(2, 16, 20), Row(0, 9, 30), Row(3, 3, 1))) for fm in (9, 3) for s in range(4)]

    def said(f):
        return [str(x) for x in f], f.metrics

    alone = [said(checks.check_launch(target, c, "cuda")) for c in cases]  # the keys' captures happen here
    replays, draws = graphs.stats().replays, graphs.draw_stats().replays
    ahead, ready = [], checks.prepare_launch(cases[0], "cuda")
    for c, nxt in zip(cases, [*cases[1:], None]):
        finish = checks.begin_launch(target, c, "cuda", ready)
        ready = None if nxt is None else checks.prepare_launch(nxt, "cuda")
        ahead.append(said(finish()))
    assert ahead == alone
    assert graphs.stats().replays - replays == len(cases) and graphs.draw_stats().replays - draws == len(cases)
    if name != "reference":
        assert any(f for f, _ in alone), f"{name}: no finding on these cases (the test would be vacuous)"


@settings(max_examples=6, deadline=None)
@given(cases=st.lists(same_key_cases(), min_size=2, max_size=3))
def test_static_copies_give_the_eager_bits(cases):
    """On any device: a graph's static copies (pool-indexed buffers padded to graphs.pool_rows, flush_min as a
    0-d tensor, rows past a smaller pool zeroed again), with the verdict run on them eagerly (no capture), give
    each case's own verdict bit for bit -- the padding and the flush_min tensor change nothing.  On CUDA the
    tests above add the capture."""
    target = get_target("reference")
    cases = [dataclasses.replace(c, draws="cpu") for c in cases]
    obs = [observe(target, c) for c in cases]
    g = graphs._Graph(checks.verdict, obs[0], capture=False)
    for o in obs:
        assert graphs.key(o) == graphs.key(obs[0])
        assert torch.equal(bits(g.run(o)), bits(checks.verdict(o)))


COPY_DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.bool, torch.uint8)


@st.composite
def copy_lists(draw):
    """Pairs (dst, src) of one dtype each, the dtypes mixed across the list as a check's buffers are; some pairs a
    dim-0 slice of a bigger destination (a static buffer padded past the pool) or empty, a device copy where CUDA is."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    pairs = []
    for _ in range(draw(st.integers(0, 9))):
        dtype = draw(st.sampled_from(COPY_DTYPES))
        shape = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
        dev = draw(st.sampled_from(devices))
        src = (torch.randint(-3, 4, shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
               .to(dtype).to(dev))
        extra = draw(st.integers(0, 2))
        dst = torch.full([shape[0] + extra, *shape[1:]], 7, dtype=dtype, device=dev)
        pairs.append((dst, src, extra))
    return pairs


@settings(max_examples=60, deadline=None)
@given(pairs=copy_lists())
def test_copy_all_is_each_copy(pairs):
    """graphs.copy_all groups its pairs by dtype and device and copies each group in one torch._foreach_copy_: the
    same bits as dst.copy_(src) pair by pair, the rows past a slice untouched."""
    dst = [d[:s.shape[0]] for d, s, _ in pairs]
    want = [d.clone() for d, _, _ in pairs]
    for w, (_, s, _) in zip(want, pairs):
        w[:s.shape[0]].copy_(s)
    graphs.copy_all(dst, [s for _, s, _ in pairs])
    from gdn_fuzz.observation import bits as element_bits  # (this module's bits() reads 8-byte words)
    for (d, _, _), w in zip(pairs, want):
        assert d.dtype == w.dtype and torch.equal(element_bits(d), element_bits(w))


@settings(max_examples=30, deadline=None)
@given(pairs=copy_lists())
def test_zero_all_is_each_zero(pairs):
    """graphs.zero_all (the stale rows of a static buffer, zeroed again): every tensor all zero bits, nothing else."""
    from gdn_fuzz.observation import bits as element_bits  # (this module's bits() reads 8-byte words)
    rest = [d[s.shape[0]:].clone() for d, s, _ in pairs]
    graphs.zero_all([d[:s.shape[0]] for d, s, _ in pairs])
    for (d, s, _), r in zip(pairs, rest):
        assert not element_bits(d[:s.shape[0]]).any() and torch.equal(element_bits(d[s.shape[0]:]), element_bits(r))


def test_copy_all_names_a_length_mismatch():
    with pytest.raises(ValueError):
        graphs.copy_all([torch.zeros(2)], [])


class _HostReads(TorchDispatchMode):
    """Records the ops that read a tensor's value on the host (.item(), bool(), indexing by a tensor, nonzero) or
    make a tensor from Python data (torch.tensor, `t[i] = True`: a host-to-device copy on a GPU), with the
    innermost gdn_fuzz / oracles frame that asked."""

    WATCH = ("aten._local_scalar_dense.default", "aten.lift_fresh.default", "aten.nonzero.default",
             "aten.item.default", "aten.masked_select.default")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in self.WATCH:
            frames = [f for f in traceback.extract_stack() if "/gdn_fuzz/" in f.filename or "/oracles/" in f.filename]
            self.seen.append((str(func), frames[-1].name if frames else "?"))
        return func(*args, **(kwargs or {}))


def test_the_verdict_reads_nothing_on_the_host():
    """What makes checks.verdict capturable (and keeps an eager check from waiting for the GPU): no op in it reads
    a device value on the host or copies Python data to the device.  The cursor check of a launch materialized
    from its Case reads the Case's rows as Python integers (graphs.run calls it before each replay), no tensor.
    Run on the CPU, where every tensor is a CPU tensor: each watched op is a failure.  The tensor form of the
    cursor check, run in the same watch, shows that the watch sees such reads.  The tolerance coefficients are
    copied to the device once per (arm, shape) and cached (checks._coefficients, which refuses to be first asked
    inside a capture; a key's first sightings run eagerly): a first verdict outside the watch makes them, as the
    eager sightings before a capture do."""
    case = Case(arm="bf16", T=4, H=2, HV=4, pool=4, flush_min=9, rows=(Row(2, 16, 20), Row(0, 9, 30), Row(3, 3, 1)),
                seed=0)
    obs = observe(get_target("reference"), case)
    checks._coefficients.cache_clear()
    with _HostReads() as reads:
        checks.verdict(obs)
    assert {where for _, where in reads.seen} == {"_coefficients"}, reads.seen  # the first verdict of its key
    with _HostReads() as reads:
        checks.verdict(obs)
    assert reads.seen == [], reads.seen
    with _HostReads() as reads:
        ring.check_cursors(obs.before["initial_state_indices"], obs.before["hist_len"])
    assert reads.seen and {where for _, where in reads.seen} == {"check_cursors"}, \
        "the tensor cursor check was not seen: the watch list does not see what it should"


def test_static_bytes_counts_the_padded_copies():
    """A graph's static copies are counted with the pool-indexed buffers padded (pool 3 -> 16 rows): what
    MAX_STATIC_BYTES bounds before a capture."""
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=3, seed=5, rows=(Row(2, 6, 30), Row(0, 16, 3)))
    obs = observe(get_target("reference"), case)
    plain = sum(v.numel() * v.element_size() for d in (obs.before, obs.after) for v in d.values()
                if isinstance(v, torch.Tensor)) + obs.output.numel() * obs.output.element_size()
    pooled = sum(v.numel() * v.element_size() for d in (obs.before, obs.after) for k, v in d.items()
                 if k in graphs.POOL_BUFFERS)
    assert graphs.static_bytes(obs) == plain + pooled * (16 - 3) // 3


def test_graphs_choice_is_validated(monkeypatch):
    monkeypatch.setenv(graphs.ENV, "sometimes")
    with pytest.raises(ValueError, match="GDN_FUZZ_GRAPHS='sometimes'.*auto, off"):
        graphs.choice()


def test_on_cpu_the_verdict_is_eager(fresh):
    """Nothing is captured for CPU tensors: run() calls the function and counts an eager run."""
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=3, seed=5, rows=(Row(2, 6, 30), Row(0, 16, 3)))
    obs = observe(get_target("reference"), case)
    for _ in range(3):
        assert torch.equal(bits(graphs.run(checks.verdict, obs, CURSORS)), bits(checks.verdict(obs)))
    assert (graphs.stats().eager, graphs.stats().replays, graphs.stats().captures) == (3, 0, 0)


def test_the_key_holds_what_the_verdict_reads():
    """Another arm, cursor mode or output presence gives another key (the graph bakes those in); another seed,
    flush_min (a tensor of the graph) or pool size up to 16 rows (padded) the same key; a pool of 17 another."""
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=3, seed=5, rows=(Row(2, 6, 30), Row(0, 16, 3)))
    obs = observe(get_target("reference"), case)
    k = graphs.key(obs)
    for same in (dataclasses.replace(case, seed=6), dataclasses.replace(case, flush_min=3),
                 dataclasses.replace(case, pool=16)):
        assert graphs.key(observe(get_target("reference"), same)) == k, same
    assert graphs.key(observe(get_target("reference"), dataclasses.replace(case, pool=17))) != k
    assert graphs.key(dataclasses.replace(obs, case=dataclasses.replace(case, restart_hist_on_flush=True))) != k
    assert graphs.key(dataclasses.replace(obs, output=None)) != k
    fp16 = observe(get_target("reference"), dataclasses.replace(case, arm="fp16"))
    assert graphs.key(fp16) != k


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 5), st.integers(-3, 20)), min_size=1, max_size=9))
def test_row_cursor_check_is_the_tensor_one(rows):
    """ring.check_row_cursors (a Case's rows as integers, what a check runs per launch) refuses exactly what
    ring.check_cursors (the tensor form) refuses, with the same message."""
    slots, lens = [s for s, _ in rows], [p for _, p in rows]
    errs = []
    for check, args in ((ring.check_cursors, (torch.tensor(slots), torch.tensor(lens))),
                        (ring.check_row_cursors, (slots, lens))):
        try:
            check(*args)
            errs.append(None)
        except ValueError as e:
            errs.append(str(e))
    assert errs[0] == errs[1]
    assert (errs[0] is None) == all(0 <= p <= 16 for s, p in rows if s >= 0)


@st.composite
def buffers_and_masks(draw):
    """A pool-like or ring-like buffer before and after (bf16, float32 or int32, NaNs and signed zeros among the
    values), some elements' bits changed, and a write-set mask of the forms ring.write_set makes: a [P, X] map
    with size-1 trailing dims (the pool's), or a [P, 1, S] map expanded along dim 1 (stride 0: the rings')."""
    dtype = draw(st.sampled_from((torch.bfloat16, torch.float32, torch.int32)))
    P, X, S = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    last = draw(st.sampled_from((1, 2, 3, 4, 8, 12)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shape = (P, X, S, last) if draw(st.booleans()) else (P, X, S)
    b = torch.randint(-2**15, 2**15, shape, generator=g).to(torch.int32)
    b = b.view(torch.float32).to(dtype) if dtype != torch.int32 else b
    if dtype != torch.int32:  # NaN payloads and signed zeros: bits, not values
        b.view(-1)[:: max(1, b.numel() // 3)] = float("nan") if draw(st.booleans()) else -0.0
    a = b.clone()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[b.element_size()]
    for i in draw(st.lists(st.integers(0, b.numel() - 1), max_size=4)):
        a.view(ints).view(-1)[i] ^= draw(st.sampled_from((1, -1, 1 << (8 * b.element_size() - 2))))
    if draw(st.booleans()):  # the pool's form: [P, X] then size-1 dims
        mask = (torch.rand(P, X, generator=g) < 0.5).reshape(P, X, *(1,) * (b.dim() - 2))
    else:  # the rings' form: one [P, S] map expanded along X (and a size-1 trailing dim where b has one)
        ring = torch.rand(P, S, generator=g) < 0.5
        mask = ring[:, None, :].expand(P, X, S)
        mask = mask[..., None] if b.dim() == 4 else mask
    if draw(st.booleans()) and b.dim() == 4 and last > 1:  # not contiguous, or not 8-byte aligned: the plain path
        b, a, mask = b[..., 1:], a[..., 1:], mask
    return b, a, mask


@settings(max_examples=300, deadline=None)
@given(buffers_and_masks())
def test_changed_outside_is_the_elementwise_flag(bam):
    """The verdict's one flag per buffer (checks._changed_outside: 8-byte words, reduced over the mask's constant
    dims) is the elementwise comparison's, torch.where(mask, False, differ_bits(b, a)).any(), for every change."""
    from gdn_fuzz.observation import differ_bits

    b, a, mask = bam
    want = bool(torch.where(mask, False, differ_bits(b, a)).any())
    assert bool(checks._changed_outside(b, a, mask)) == want
