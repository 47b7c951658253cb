"""Replay every regression corpus entry as its own test id.

Each entry (corpus/*.json, or --gdn-corpus DIR) re-runs its property on its shrunk Case
against its recorded target.  `open` entries are known bugs: they must still fail WITH THEIR
SIGNATURE (then the test is an xfail naming it; a pass means the bug is fixed and the entry
should become a `guard`; a failure with another signature is a failure of this test, since
the entry no longer reproduces what it records); `guard` entries must pass.  Entries for a target this machine cannot launch (the production kernel without
an SM90+ GPU) skip with the reason.  A damaged, truncated or unknown-version entry fails
with a message naming the file; collection of the others is unaffected (entries are read
inside the test, not at collection).
"""

from __future__ import annotations

import pytest

from gdn_fuzz.engine import corpus
from gdn_fuzz.targets import TargetUnavailable, get_target

ENTRIES = corpus.entries()


@pytest.mark.parametrize("path", ENTRIES, ids=[p.name for p in ENTRIES])
def test_corpus_entry(path, request, gdn_selection):
    """Each corpus entry reproduces exactly: open bugs still fail, guards pass."""
    try:
        entry = corpus.read(path)
    except corpus.CorpusError as e:
        pytest.fail(str(e), pytrace=False)
    _, _, device = gdn_selection
    try:
        corpus.check_replayable(entry)  # data, never code: no entry may make this run import a file
    except corpus.CorpusError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        target = get_target(entry.target)
        dev = "cuda" if target.needs_cuda else device
        why = target.unavailable_reason(dev)
    except TargetUnavailable as e:
        why = str(e)
    if why:
        pytest.skip(f"{path.name}: {why}")
    findings = corpus.replay(entry, device=dev)
    ok, what = corpus.verdict(entry, findings)
    detail = "\n".join([f"{path.name}: {what}", entry.case.describe()] + [str(f) for f in findings])
    assert ok, detail
    if entry.status == "open":
        pytest.xfail(f"open bug {path.name}: {entry.signature}")
