"""The decode/materialize differential (kernel-contract-0.7.4.md PMM5): a measurement, not a verdict.

For a flush row b of a decode launch (slot idx, hist_len P >= flush_min, cache_base base), the flush kernel
stores the fold S_P of its window into pool[idx] (M7).  gdn_prefix_materialize on the launch's *inputs*, with
src = idx, base = base, count = P, computes the same S_P into a spare slot.  PMM5 reads bit-identity from the
source (the same exp, w-scaling, MMA strips and fma epilogue); nothing promises it.  This study counts, per arm,
the flush rows whose two results are bit-identical, and checks both against the float64 PMM3 value within the
PMN5 bound (compare.prefix_bound), which is a promise of each kernel.

  python -m gdn_fuzz.studies.prefix_decode --examples 40 --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from hypothesis import HealthCheck, given, settings

from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.case import materialize
from gdn_fuzz.observation import clone_inputs, same_bits
from gdn_fuzz.oracles import prefix as pm_oracle
from gdn_fuzz.properties.materialize import error_ratio
from gdn_fuzz.strategies import cases
from gdn_fuzz.targets import get_target


def one(flush_t, pm_t, case, device) -> list[dict]:
    kw = materialize(case, device)
    before = clone_inputs(kw)
    flush_t.launch(case.arm, **kw)
    out = []
    rows = [i for i, r in enumerate(case.rows) if case.row_kind(r) == "flush"]
    if not rows:
        return out
    pool = before["initial_state_source"]
    spare = pool.shape[0]
    state = torch.cat([pool, torch.zeros_like(pool[:len(rows)])])
    i32 = dict(dtype=torch.int32, device=pool.device)
    args = dict(state=state, src_slots=torch.tensor([case.rows[i].slot for i in rows], **i32),
                dst_slots=torch.arange(spare, spare + len(rows), **i32),
                k_cache=before["k_cache"], u_cache=before["u_cache"], g_cache=before["g_cache"],
                cache_base=torch.tensor([case.rows[i].cache_base for i in rows], **i32),
                count=torch.tensor([case.rows[i].hist_len for i in rows], **i32))
    ref = clone_inputs(args)
    pm_t.launch(case.arm, **args)
    e = pm_oracle.materialize(**ref)
    src = args["src_slots"].long()
    S0, got_pm = pool[src], state[spare:]
    got_flush = kw["initial_state_source"][src]
    r_flush, r_pm = error_ratio(case.arm, e, got_flush, S0), error_ratio(case.arm, e, got_pm, S0)
    differ = (~same_bits(got_flush, got_pm)).reshape(len(rows), -1)
    n_diff, rf, rp = differ.sum(1).tolist(), r_flush.amax(1).tolist(), r_pm.amax(1).tolist()  # one copy each
    for j, i in enumerate(rows):
        out.append(dict(arm=case.arm, T=case.T, H=case.H, HV=case.HV, P=case.rows[i].hist_len,
                        identical=n_diff[j] == 0, differing=n_diff[j], elements=differ.shape[1],
                        flush_ratio=rf[j], pm_ratio=rp[j]))
    return out


def run(examples: int = 40, device: str = "cuda", arms=ARM_NAMES, flush: str = "production",
        materializer: str = "materialize") -> dict:
    """`examples` drawn launches with a flush row per arm (one Hypothesis run per arm, so that every arm is measured:
    one run over all arms left bf16-ring16 without a flush row in run 44)."""
    flush_t, pm_t = get_target(flush), get_target(materializer)
    rows: list[dict] = []
    for arm in arms:
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(cases(arms=(arm,), Ts=(4, 8), geometries=((1, 2), (2, 8)), buckets=(4,), need="flush"))
        def body(case):
            rows.extend(one(flush_t, pm_t, case, device))

        body()
    by = Counter((r["arm"], r["identical"]) for r in rows)
    return dict(rows=rows, per_arm={a: dict(identical=by[(a, True)], different=by[(a, False)]) for a in arms},
                max_flush_ratio=max((r["flush_ratio"] for r in rows), default=None),
                max_pm_ratio=max((r["pm_ratio"] for r in rows), default=None))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=40, help="drawn launches per arm")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--flush", default="production")
    ap.add_argument("--materializer", default="materialize")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    res = run(a.examples, a.device, flush=a.flush, materializer=a.materializer)
    for arm, d in res["per_arm"].items():
        print(f"{arm}: {d['identical']} flush rows bit-identical, {d['different']} different")
    diff = [r for r in res["rows"] if not r["identical"]]
    if diff:
        print("differing rows (first 10):", json.dumps(diff[:10]))
    print(f"worst error / PMN5 bound: flush fold {res['max_flush_ratio']}, materializer {res['max_pm_ratio']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
