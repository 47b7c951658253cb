"""One launch, observed: materialize the Case, copy every buffer the launch may touch, launch the
target, keep the inputs before and after (Observation).  What the checks judge.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from gdn_fuzz.case import Case, compact, materialize, spread_rows
from gdn_fuzz.graphs import POOL_BUFFERS, clone_all  # POOL_BUFFERS: the buffers indexed by pool slot (dim 0)
from gdn_fuzz.targets import Target


BUFFERS = ("initial_state_source", "k_cache", "u_cache", "g_cache", "hist_len", "cache_base")


READ_ONLY = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "initial_state_indices")


@dataclass
class Observation:
    case: Case
    before: dict
    after: dict
    output: torch.Tensor | None
    error: BaseException | None = None
    from_case: bool = False  # inputs are materialize(case): their cursors are the Case's rows


def clone_inputs(inputs: dict) -> dict:
    """A private copy of a launch's keyword arguments: every tensor cloned, anything else kept
    (a launch writes the rings, the pool and the cursors in place).  The one clone helper of
    the properties (gdn_fuzz.properties) and of observe()'s "before" snapshot (the clones made in one call:
    graphs.clone_all)."""
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    return dict(inputs, **dict(zip(names, clone_all([inputs[k] for k in names]))))


def drawn(case: Case, device: str = "cpu") -> tuple[dict, dict]:
    """(inputs, before) of observe(target, case, device): materialize(case) and its "before" snapshot, the part of
    observe that runs no code of the target (what an isolated worker draws ahead while the check before it ends:
    gdn_fuzz.engine.isolation)."""
    inputs = materialize(case, device)
    # fill="rows" (a pool past 2^31 elements, mostly untouched zeros): "before" is drawn again rather
    # than cloned, which would write every page of the pool; materialize is a function of the case
    return inputs, materialize(case, device) if case.fill == "rows" else clone_inputs(inputs)


def observe(target: Target, case: Case, device: str = "cpu", *, inputs: dict | None = None,
            output: torch.Tensor | None = None, ready: tuple[dict, dict] | None = None) -> Observation:
    """Run one launch.  Exceptions raised by the target are kept in the Observation.  inputs: the launch's own
    tensors (not materialize(case)'s); ready: drawn(case, device) already made (the same launch from its Case)."""
    from_case = inputs is None
    if from_case:
        inputs, before = drawn(case, device) if ready is None else ready
    else:
        before = clone_inputs(inputs)
    kwargs = dict(inputs)
    if output is not None:
        kwargs["output"] = output
    try:
        out = target.launch(case.arm, **kwargs)
        err = None
    except Exception as e:  # the target's own exception, reported as a finding by the caller
        out, err = None, e
    return Observation(case=case, before=before, after=inputs, output=out, error=err, from_case=from_case)


@dataclass
class RowsLaunch:
    """One launch of a fill="rows" case (a pool of thousands of slots or past 2^31 elements, zero but for its rows'
    slots), observed without a second copy of its pool (observe_rows).

    obs        the launch seen on its rows alone: case = compact(case) (the rows renumbered onto a pool of just their
               slots), before = materialize of that case, after = the launch's pool and rings at the rows' slots in
               row order (gathered) with its other tensors as they are, and its output: a small launch that the
               checks judge as any other (checks.verdict; replayed from a CUDA graph where gdn_fuzz.graphs allows)
    case       the fill="rows" case launched
    launched   the launch's own tensors (the whole pool, after the launch), for the evidence of a failing launch
    used       the rows' slots (int64, on the launch's device); indices: the slot indices as launched (a copy)
    """

    obs: Observation
    case: Case
    launched: dict
    used: torch.Tensor
    indices: torch.Tensor

    def full(self) -> Observation:
        """The launch as observe() sees it: "before" drawn again (materialize is a function of the case), the
        whole pool compared (for the evidence of a failing launch)."""
        return Observation(case=self.case, before=materialize(self.case, self.used.device), after=self.launched,
                           output=self.obs.output, error=self.obs.error, from_case=True)


def observe_rows(target: Target, case: Case, device: str = "cpu") -> RowsLaunch:
    """observe() of a fill="rows" case, "before" drawn for the rows' slots only: compact(case) is materialized once
    (its tensors are "before"), spread onto the pool (case.spread_rows) from a private copy, and launched.  What
    observe() would have compared besides the rows' slots is zero before the launch by construction; whether it
    still is after is checks.rows_outside's question."""
    small = compact(case)
    before = materialize(small, device)
    used = torch.tensor(case.used_slots(), dtype=torch.long, device=before["initial_state_source"].device)
    # the launch's own copy of every input but the small pools, which spread_rows only reads
    inputs = spread_rows(case, {**before, **clone_inputs({k: v for k, v in before.items() if k not in POOL_BUFFERS})},
                         at=used)
    indices = inputs["initial_state_indices"].clone()
    try:
        out, err = target.launch(case.arm, **inputs), None
    except Exception as e:  # the target's own exception, reported as a finding by the caller
        out, err = None, e
    after = {k: (v[used] if k in POOL_BUFFERS else v) for k, v in inputs.items()}
    # the launch's slot indices name the big pool's slots: the compact launch's are "before"'s, unless the launch
    # changed them (checks.rows_outside compares them with `indices`)
    after["initial_state_indices"] = before["initial_state_indices"]
    obs = Observation(case=small, before=before, after=after, output=out, error=err, from_case=True)
    return RowsLaunch(obs=obs, case=case, launched=inputs, used=used, indices=indices)


def bits(x: torch.Tensor) -> torch.Tensor:
    """x's bits as the integer dtype of its element size (contiguous), one integer per element."""
    return x.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def same_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise bit equality (NaN == NaN when the payloads match)."""
    return bits(x) == bits(y)


def differ_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """~same_bits(x, y) in one comparison: True where the bits differ."""
    return bits(x) != bits(y)



def mapped_rows(t: torch.Tensor) -> torch.Tensor | None:
    """[t.shape[0]] bool for a contiguous CPU tensor: True where a page holding part of that row has
    been mapped in this process (present or swapped, /proc/self/pagemap bits 63 and 62); None where
    pagemap cannot be read.  In private anonymous memory (case.lazy_zeros) a page never mapped has
    never been written and reads as zero, so two such tensors can differ only in rows this marks."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    start, nbytes = t.data_ptr(), t.numel() * t.element_size()
    first, last = start // page, (start + nbytes - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            raw = f.read((last - first + 1) * 8)
    except OSError:
        return None
    if len(raw) != (last - first + 1) * 8:
        return None
    pm = np.frombuffer(raw, dtype=np.uint64)
    mapped = ((pm >> np.uint64(62)) & np.uint64(3)) != 0
    seen = np.concatenate(([0], np.cumsum(mapped, dtype=np.int64)))
    row_bytes = nbytes // t.shape[0]
    lo = (start + np.arange(t.shape[0], dtype=np.int64) * row_bytes) // page - first
    hi = (start + (np.arange(t.shape[0], dtype=np.int64) + 1) * row_bytes - 1) // page - first
    return torch.from_numpy(seen[hi + 1] - seen[lo] > 0)
