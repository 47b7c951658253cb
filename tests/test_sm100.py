"""SM100 readiness (no B200 here): 0.7.4's routing to UMMA and the UMMA entry's host checks, on a CPU.

How this file tests
-------------------
FlashInfer 0.7.4's wrapper decides on the host which backend runs a call (H19: an SM100-class GPU,
the fp16-state arm, 1 <= T <= 8, HV / H in 1..4, contiguous pools, no pdl_trigger route to UMMA)
and the UMMA entry checks its options after its own device probe (heads_per_cta, stochastic
rounding, rand_seed, philox_rounds).  tests/sm100.py answers the device probe as an SM100 GPU would
and stops each call where it would launch, so that released host code runs here unchanged; every
expectation comes from the 0.7.4 release model (gdn_fuzz.targets.releases: the UMMA backend's data
and the umma entry's checks), through gdn_fuzz.properties.hostchecks.expect, including which
backend the call reaches.

Also here: the known bugs per backend (the release model's KnownBug data against the corpus), and
the stochastic-rounding properties of SM100, written for a B200 and skipped elsewhere with the reason.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_fuzz.arms import ARM_NAMES, ARMS
from gdn_fuzz.engine import corpus
from gdn_fuzz.properties import hostchecks as hc
from gdn_fuzz.targets import Target, TargetMismatch, TargetUnavailable, get_target, releases

from . import sm100

HYP = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
R074 = releases.R_074


def _load(name, arm):
    try:
        t = get_target(name)
        if t.release.release.version != "0.7.4":
            pytest.skip(f"target {name} is modelled as {t.release}; these tests read 0.7.4's UMMA routing")
        return t, t.module(arm)
    except (TargetUnavailable, TargetMismatch, ImportError) as e:
        pytest.skip(f"target {name!r} is not importable here ({type(e).__name__}: {e})")


def test_the_standin_reaches_each_backend_and_is_undone():
    """A valid fp16-state call reaches UMMA, a valid bf16 call reaches HMMA (HV/H = 2, T = 4), and once the
    stand-in is gone the real device probe refuses CPU tensors again."""
    t, mod16 = _load("production", "bf16-state16")
    _, mod = _load("production", "bf16")
    if sm100.umma_module_of(mod16) is None:
        pytest.skip("the installed flush module has no UMMA backend")
    for m, arm, want in ((mod16, "bf16-state16", "reached umma"), (mod, "bf16", "reached hmma")):
        with sm100.standin(m):
            got = sm100.observe(m.gated_delta_rule_mtp_ucache_flush, hc.base_call(arm))
        assert (got.exc, got.message) == (None, want), got
        after = hc.observe_call(m.gated_delta_rule_mtp_ucache_flush, hc.base_call(arm))
        assert after.exc == "ValueError" and "CUDA" in after.message, after


HEADS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 16))  # HV/H 1, 2, 4, 8: 8 is past UMMA's 4
CCS = ((10, 0), (10, 3), (9, 0), (12, 0))  # (10, 7) would run the Rubin build, which is not modelled here


@HYP
@given(arm=st.sampled_from(ARM_NAMES), heads=st.sampled_from(HEADS), cc=st.sampled_from(CCS),
       backend=st.sampled_from([None, "auto", "umma", "hmma"]), pdl=st.booleans(), data=st.data())
def test_routing_follows_the_release_model(arm, heads, cc, backend, pdl, data):
    """H19/H20 and M9: on a stand-in GPU of compute capability `cc`, the flush entry with up to two changes
    raises what the 0.7.4 model says (through the UMMA entry's checks where H19 routes there) or reaches
    the backend the model says: UMMA exactly where the UMMA backend's data says it serves the call."""
    t, mod = _load("production", arm)
    if sm100.umma_module_of(mod) is None:
        pytest.skip("the installed flush module has no UMMA backend")
    em = R074.entry("flush")
    pool = [c for c in hc.changes_for(em, arm) if not c.touches or not {"backend", "pdl_trigger"} & set(c.touches)]
    # H16 and later are after the stand-in's stop (the HMMA device probe): block-strided pools stop there too
    pool = [c for c in pool if hc.catch(em, c) not in ("H16",)]
    chosen = data.draw(st.lists(st.sampled_from(pool), max_size=2, unique_by=lambda c: c.id).filter(hc.compatible),
                       label="changes")
    chosen += [hc.get_change(f"backend={backend}")] if backend else []
    chosen += [hc.get_change("pdl_trigger")] if pdl else []
    with sm100.standin(mod, cc=cc):
        pr = hc.probe(mod.gated_delta_rule_mtp_ucache_flush, mod, R074, "flush", arm, chosen, standin_cc=cc,
                      heads=heads, observe=sm100.observe)
    where = f"{arm} heads={heads} cc={cc} {[c.id for c in chosen]}"
    assert pr.problem is None, f"{where}: {pr.problem}"
    if pr.expected.check is None:
        want = sm100.BACKEND_OF_ENTRY[pr.expected.route[-1]]
        assert pr.observed.message == f"reached {want}", f"{where}: model routes to {want}, got {pr.observed.message}"


@pytest.mark.parametrize("cc", [(10, 0), (12, 0)])
def test_umma_entry_checks_after_its_device_probe(cc):
    """The UMMA entry on a stand-in GPU: every single change the 0.7.4 umma model covers (heads_per_cta,
    stochastic_rounding, the seed and philox_rounds among them) raises what the model says or reaches the
    launch; on (12, 0), which has no cvt.rs, any rounding mode is NotImplementedError (U.cvt_rs)."""
    t, mod = _load("sm100", "bf16-state16")
    em = R074.entry("umma")
    problems = []
    n = 0
    for c in hc.changes_for(em, "bf16-state16"):
        with sm100.standin(umma_module=mod, cc=cc):
            pr = hc.probe(mod.gated_delta_rule_mtp_ucache_flush_umma, mod, R074, "umma", "bf16-state16", [c],
                          standin_cc=cc, heads=(1, 4), observe=sm100.observe)
        n += 1
        if not pr.ok:
            problems.append(f"{c.id}: {pr.problem or pr.inputs_changed}")
        if pr.expected.check is None:
            assert pr.observed.message == "reached umma", (c.id, pr.observed)
    assert n > 60 and not problems, "\n".join(problems)


def test_routed_call_gives_umma_the_callers_fp32_parameters():
    """M9: on the UMMA route the wrapper hands UMMA the caller's A_log and dt_bias objects (read in fp32
    there), not the IO-dtype cast the HMMA kernel gets (N5 applies to HMMA only)."""
    t, mod = _load("production", "bf16-state16")
    if sm100.umma_module_of(mod) is None:
        pytest.skip("the installed flush module has no UMMA backend")
    seen = {}

    def record(*args, **kw):
        seen["args"], seen["kw"] = args, kw
        return "umma ran"

    kw = hc.base_call("bf16-state16")
    kw["A_log"], kw["dt_bias"] = kw["A_log"].float(), kw["dt_bias"].float()
    saved = mod._UMMA
    try:
        with sm100.standin(mod):
            mod._UMMA = record
            assert mod.gated_delta_rule_mtp_ucache_flush(**kw) == "umma ran"
    finally:
        mod._UMMA = saved
    assert seen["args"][0] is kw["A_log"] and seen["args"][2] is kw["dt_bias"]
    assert seen["kw"]["stochastic_rounding"] is None and seen["kw"]["philox_rounds"] == 10


# --------------------------------------------------------------------------- known bugs per backend

def test_known_bugs_per_backend_agree_with_the_corpus():
    """Every open corpus entry of the production target is a known bug the release model places on HMMA
    (seen there); on UMMA the strided a/b and strided output bugs are absent (U copies a/b and has no
    alias branch), the cast cache (N5) and the size-1 pool flag are expected from the source."""
    entries = corpus.known_signatures("production", corpus.default_dir())
    assert len(entries) >= 4
    for rel in releases.RELEASES.values():
        hmma = rel.known_on("hmma")
        assert set(entries) <= set(hmma), set(entries) - set(hmma)
        assert all(hmma[s].backends["hmma"].startswith("seen") for s in entries)
    umma = R074.known_on("umma")
    absent = R074.absent_on("umma")
    assert {s.split(" ")[0] for s in absent} == {"metamorphic.strided_ab.launch", "output_inplace.strided.launch"}
    assert {s.split(" ")[0] for s in umma} == {"params_inplace.oracle", "metamorphic.strided_pool.launch"}


def test_a_b200_job_expects_per_backend():
    """corpus.known_on_backend: the production target's corpus-known bugs on HMMA as they are; on UMMA the
    absent ones are new findings and the source-read ones known, named by the model."""
    t = get_target("production")
    if t.release.release.version != "0.7.4":
        pytest.skip(f"production is modelled as {t.release}")
    known = corpus.known_signatures("production", corpus.default_dir())
    assert corpus.known_on_backend(known, t, "hmma") == known
    on_umma = corpus.known_on_backend(known, t, "umma")
    assert not set(on_umma) & R074.absent_on("umma")
    for sig in R074.known_on("umma"):
        assert sig in on_umma
    ref = get_target("reference")
    assert corpus.known_on_backend(known, ref, "umma") == known  # not FlashInfer's code: unchanged
    # the route of a launch (H19): bf16-state16 with HV/H <= 4 on an SM100 GPU runs UMMA, bf16 runs HMMA
    assert releases.UMMA.serves("bf16-state16", 4, 16, 64, 10) and not releases.UMMA.serves("bf16", 4, 16, 64, 10)
    assert not releases.UMMA.serves("bf16-state16", 4, 16, 64, 9)


# --------------------------------------------------------------------------- stochastic rounding (N6), SM100 only

def _sm100_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("stochastic rounding (N6) runs on an SM100-class GPU (cvt.rs, UMMA); this machine has no GPU")
    cc = torch.cuda.get_device_capability()
    if cc not in hc.CVT_RS_CC:
        pytest.skip(f"stochastic rounding (N6) needs cvt.rs (sm_100a / sm_103a / sm_107a); "
                    f"{torch.cuda.get_device_name()} is SM{cc[0]}{cc[1]}")
    return _load("sm100", "bf16-state16")


def _flush_launch(mod, seed: int | None, mode="philox"):
    """The base call (row 1 flushes: P = 13) on the GPU, rounded with `mode` and `seed` (None: nearest)."""
    kw = hc.base_call("bf16-state16", 4, "cuda", heads=(1, 4))
    kw["restart_hist_on_flush"] = False
    if seed is not None:
        kw.update(stochastic_rounding=mode, rand_seed=torch.tensor([seed], dtype=torch.int64, device="cuda"))
    mod.gated_delta_rule_mtp_ucache_flush_umma(**kw)
    return kw


@pytest.mark.gpu
def test_stochastic_rounding_same_seed_same_bits():
    """N6: with 'philox' and one seed, the flushed fp16 state is reproducible: two launches on the same
    inputs give the same bits (the flush row is row 1, P = 13 >= flush_min 13)."""
    t, mod = _sm100_or_skip()
    a, b = _flush_launch(mod, 7), _flush_launch(mod, 7)
    from gdn_fuzz.observation import same_bits

    assert bool(same_bits(a["initial_state_source"], b["initial_state_source"]).all())


@pytest.mark.gpu
def test_stochastic_rounding_rounds_to_a_neighbour_of_nearest():
    """N6: every flushed element rounded stochastically is the round-to-nearest value of the same launch or
    its fp16 neighbour (SR and RN round the same f32 value, one to a random side, one to the nearer: the
    two results are at most one fp16 step apart, compared as bit patterns)."""
    t, mod = _sm100_or_skip()
    sr, rn = _flush_launch(mod, 11), _flush_launch(mod, None)
    x = sr["initial_state_source"][2].view(torch.int16).int()  # row 1's slot (2): the flush row
    y = rn["initial_state_source"][2].view(torch.int16).int()
    same_sign = (x < 0) == (y < 0)
    assert bool(((x - y).abs() <= 1)[same_sign].all()) and bool((x[~same_sign] & 0x7FFF).le(1).all())


def test_a_campaign_classifies_by_the_backend_of_each_launch(monkeypatch):
    """Campaign.classify: on a launch the model routes to UMMA (here: production's backend_for patched to say
    so, as an SM100 GPU would for the fp16-state arm), the strided a/b bug is a new finding and the cast-cache
    bug is known; on HMMA both are known, as the corpus says."""
    from gdn_fuzz.case import Case, Row
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.findings import Finding
    from gdn_fuzz.properties import get_property

    t = get_target("production")
    if t.release.release.version != "0.7.4":
        pytest.skip(f"production is modelled as {t.release}")
    known = corpus.known_signatures("production", corpus.default_dir())
    c = Campaign(target=t, device="cpu", properties=[get_property("launch")], arms=("bf16-state16",), Ts=(4,),
                 geometries=((1, 2),), buckets=(4,), known=known)
    ab = next(s for s in known if s.startswith("metamorphic.strided_ab"))
    n5 = next(s for s in known if s.startswith("params_inplace"))

    def finding(sig):
        f = Finding(sig.split(" ")[0], sig.split("[")[1].split("]")[0], "x")
        monkeypatch.setattr(f, "signature", lambda: sig)
        return f

    case = Case(arm="bf16-state16", T=4, H=1, HV=2, pool=3, rows=(Row(0, 3, 5),), seed=1)
    for backend, want_new in (("hmma", set()), ("umma", {ab})):
        monkeypatch.setattr(Target, "backend_for", lambda self, *a, **k: backend)
        kn, new = c.classify([finding(ab), finding(n5)], case)
        assert {f.signature() for f in new} == want_new, backend
        assert n5 in {f.signature() for f in kn}
