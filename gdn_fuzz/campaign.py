"""Fuzz campaigns: Hypothesis runs in rounds until a time or example budget is spent.

Each round is one Hypothesis run of `round_examples` examples per property with its own
seed (derived from the campaign seed), so a budget can stop the campaign between rounds
and every failure is shrunk by Hypothesis before it is recorded.  Findings are
deduplicated by (property, clause, finding kind); the shrunk Case of each is kept.

warm_up() (optional, before run()) launches one legal Case per (arm, T, geometry, bucket)
so that every JIT compile is paid outside the measured time; it restarts the clock and
reports its own seconds and compiles (stats.warmup_s, stats.warmup_compiles).
draws="device" makes every drawn Case draw its bulk tensors on the device (Case.draws:
fast on a GPU, bits device-dependent); the default "cpu" keeps device-independent bits.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

from .case import Case, Row
from .checks import Finding
from .properties import Property
from .targets import Target


class PropertyFailed(AssertionError):
    """Raised inside the Hypothesis test body so Hypothesis shrinks the failing Case."""

    def __init__(self, case: Case, findings: list[Finding]):
        self.case, self.findings = case, findings
        super().__init__("\n".join([case.describe()] + [str(f) for f in findings]))


@dataclass
class CampaignFinding:
    prop: str
    case: Case
    findings: list[Finding]
    entry_path: object = None  # corpus file, when written
    entry_new: bool = False  # False: the corpus already held this failure

    def key(self) -> tuple:
        return (self.prop,) + tuple(sorted({f.key() for f in self.findings}))


@dataclass
class CampaignStats:
    examples: int = 0
    launches: int = 0
    rounds: int = 0
    compiles: int = 0
    warmup_s: float = 0.0  # warm_up(): outside `elapsed`
    warmup_compiles: int = 0
    started: float = field(default_factory=time.monotonic)
    events: dict = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.examples / max(self.elapsed, 1e-9)


@dataclass
class Campaign:
    target: Target
    device: str
    properties: list[Property]
    arms: tuple[str, ...]
    Ts: tuple[int, ...]
    geometries: tuple
    buckets: tuple[int, ...]
    seed: int = 0
    round_examples: int = 25
    shrink: bool = True
    isolate: bool = False  # run checks in a worker process (gdn_fuzz.isolation)
    corpus_dir: object = None  # write every finding here (gdn_fuzz.corpus); None: do not write
    record_path: object = None  # JSON lines: one record per example (coverage and errors, for `report`)
    stop_on_finding: bool = False  # end the campaign at its first finding (mutation tests)
    draws: str = "cpu"  # Case.draws of every drawn case ("device": bulk tensors drawn on the device)
    stats: CampaignStats = field(default_factory=CampaignStats)
    findings: dict = field(default_factory=dict)  # key -> CampaignFinding

    def __post_init__(self):
        self._worker = None
        self._records = open(self.record_path, "a") if self.record_path else None
        if self.isolate:
            from .isolation import Worker

            inflight = None if self.corpus_dir is None else Path(self.corpus_dir) / ".inflight"
            self._worker = Worker(self.target.name, self.device, inflight_dir=inflight)

    def _compiles(self) -> int:
        if self._worker is not None:
            return self._worker.compiles
        return sum(self.target.compile_count(a) for a in self.arms)

    def warm_up(self) -> "Campaign":
        """One launch per (arm, T, geometry, bucket): pays every JIT compile before run()'s clock.

        The launches are legal Cases (all rows real, each on its own slot, no window) checked
        by the `launch` property; their findings are not recorded (the campaign finds them).
        """
        from .properties import get_property

        prop = get_property("launch")
        t0, c0 = time.monotonic(), self._compiles()
        rng = random.Random(self.seed)
        for arm in self.arms:
            for T in self.Ts:
                for H, HV in self.geometries:
                    for bucket in self.buckets:
                        rows = tuple(Row(s, 0, rng.randrange(32)) for s in range(bucket))
                        self._check(prop, Case(arm=arm, T=T, H=H, HV=HV, pool=bucket, rows=rows,
                                               seed=rng.randrange(2**32), draws=self.draws))
        self.stats.warmup_s += time.monotonic() - t0
        self.stats.warmup_compiles += self._compiles() - c0
        self.stats.started = time.monotonic()
        return self

    def _check(self, prop: Property, case: Case):
        if self._worker is not None:
            return self._worker.check(prop.name, case)
        return prop.check(self.target, case, self.device)

    def _record(self, f: "CampaignFinding") -> None:
        if self.corpus_dir is None:
            return
        from . import corpus

        f.entry_path, f.entry_new = corpus.write(corpus.make_entry(f.prop, f.case, f.findings, self.target.name),
                                                 self.corpus_dir)

    def _round(self, prop: Property, round_seed: int, on_example) -> CampaignFinding | None:
        strat = prop.strategy(arms=self.arms, Ts=self.Ts, geometries=self.geometries, buckets=self.buckets)
        if self.draws != "cpu":
            strat = strat.map(lambda c: dataclasses.replace(c, draws=self.draws))
        last: dict = {}
        phases = (Phase.generate, Phase.target, Phase.shrink) if self.shrink else (Phase.generate,)

        @hseed(round_seed)
        @settings(max_examples=self.round_examples, deadline=None, database=None, phases=phases,
                  report_multiple_bugs=False, suppress_health_check=list(HealthCheck), print_blob=False)
        @given(strat)
        def body(case):
            self.stats.examples += 1
            self.stats.launches += 1
            on_example()
            found = self._check(prop, case)
            if self._records is not None:
                self._records.write(json.dumps(dict(
                    i=self.stats.examples, t=round(self.stats.elapsed, 3), prop=prop.name, arm=case.arm, T=case.T,
                    H=case.H, HV=case.HV, B=case.B, pool=case.pool, flush_min=case.fmin,
                    rows=[[r.slot, r.hist_len, r.cache_base] for r in case.rows], regime=case.regime.__dict__,
                    metrics=getattr(found, "metrics", None), failed=[f.prop for f in found])) + "\n")
            if found:
                last["case"], last["findings"] = case, found
                raise PropertyFailed(case, found)

        try:
            body()
        except PropertyFailed:
            # Hypothesis re-runs the shrunk example last, so `last` holds the minimal case
            return CampaignFinding(prop.name, last["case"], last["findings"])
        return None

    def run(self, *, seconds: float | None = None, examples: int | None = None, on_example=lambda: None,
            on_finding=lambda f: None) -> "Campaign":
        """Rounds over all properties until a budget is spent (KeyboardInterrupt stops cleanly)."""
        if seconds is None and examples is None:
            raise ValueError("give a budget: seconds=... or examples=... (both may be set; the first reached stops)")
        compiles0 = self._compiles()
        try:
            while True:
                for prop in self.properties:
                    if (seconds is not None and self.stats.elapsed >= seconds) or (
                            examples is not None and self.stats.examples >= examples):
                        return self
                    f = self._round(prop, self.seed * 1_000_003 + self.stats.rounds, on_example)
                    self.stats.rounds += 1
                    self.stats.compiles = self._compiles() - compiles0
                    if f is not None and f.key() not in self.findings:
                        self.findings[f.key()] = f
                        self._record(f)
                        on_finding(f)
                    if self.stop_on_finding and self.findings:
                        return self
        except KeyboardInterrupt:
            return self
        finally:
            self.stats.compiles = self._compiles() - compiles0
            if self._worker is not None:
                self._worker.close()
            if self._records is not None:
                self._records.flush()
