"""The regression corpus: atomic, deduplicated writes, clear errors, concurrent writers.

Entries are written by many processes at once (xdist workers, campaign workers); these
tests write from 8 processes, damage entries on purpose, and run two campaigns on a
planted bug to show that the second one finds the same failure and stores nothing new.
"""

from __future__ import annotations

import json
import os
import subprocess
import multiprocessing as mp

import pytest

from gdn_fuzz.engine import corpus
from gdn_fuzz.case import Case, Row
from gdn_fuzz.findings import Finding


def _case(seed: int, P: int = 13) -> Case:
    return Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, P, 3), Row(-1)), seed=seed)


def _entry(i: int) -> corpus.Entry:
    # failures 0..9 differ by their check name; every writer writes each of them (duplicates)
    f = Finding(f"oracle.check{i % 10}", "M7", "planted")
    return corpus.make_entry("launch", _case(i), [f], target="mutant:fold_skipped")


def _writer(args):
    d, wid = args
    made = 0
    for i in range(40):
        _, new = corpus.write(_entry(i + wid), d)
        made += new
    return made


def test_entry_roundtrip_and_dedup(tmp_path):
    """An entry reads back to the same Case; the same failure twice is stored once."""
    e = _entry(3)
    p, new = corpus.write(e, tmp_path)
    assert new and p.name.startswith("launch-") and p.suffix == ".json"
    back = corpus.read(p)
    assert back.case == e.case and back.keys == e.keys and back.status == "open"
    p2, new2 = corpus.write(_entry(13), tmp_path)  # another case of the same failure identity
    assert p2 == p and not new2
    assert [x.name for x in tmp_path.iterdir()] == [p.name]  # no temp files left behind


def test_eight_concurrent_writers_lose_and_corrupt_nothing(tmp_path):
    """8 processes write 40 entries each (10 distinct failures): exactly 10 whole entries remain."""
    with mp.get_context("spawn").Pool(8) as pool:
        pool.map(_writer, [(tmp_path, w) for w in range(8)])
    files = sorted(tmp_path.iterdir())
    assert len(files) == 10, [f.name for f in files]
    for f in files:
        corpus.read(f)  # every file parses: no torn writes
    assert {tuple(corpus.read(f).keys[0]) for f in files} == {(f"oracle.check{i}", "M7") for i in range(10)}


@pytest.mark.parametrize("damage, words", [
    (lambda t: t[: len(t) // 2], "truncated"),
    (lambda t: t.replace(corpus.FORMAT, "gdn_fuzz.corpus/99"), "format"),
    (lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "case"}), "malformed field"),
    (lambda t: t.replace('"version": 1', '"version": 7'), "version"),
])
def test_damaged_entry_names_the_file(tmp_path, damage, words):
    """A damaged entry raises CorpusError naming the file and what is wrong."""
    p, _ = corpus.write(_entry(1), tmp_path)
    p.write_text(damage(p.read_text()))
    with pytest.raises(corpus.CorpusError, match=words) as ei:
        corpus.read(p)
    assert str(p) in str(ei.value)


def test_readonly_corpus_refuses_with_the_entry(tmp_path, monkeypatch):
    """Read-only mode (CI) never writes the configured corpus, and says what it would have written;
    a folder given explicitly elsewhere (a test's own temporary corpus) is still written."""
    monkeypatch.setenv(corpus.READONLY_ENV, "1")
    monkeypatch.setenv(corpus.CORPUS_ENV, str(tmp_path / "configured"))
    with pytest.raises(PermissionError, match="read-only"):
        corpus.write(_entry(2), tmp_path / "configured")
    assert not (tmp_path / "configured").exists()
    path, new = corpus.write(_entry(2), tmp_path / "elsewhere")
    assert new and path.parent == tmp_path / "elsewhere"


def test_campaign_writes_one_shrunk_entry_then_deduplicates(tmp_path):
    """A planted bug found by a campaign lands in the corpus once; a second campaign adds nothing."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    def run(seed):
        c = Campaign(target=get_target("mutant:fold_skipped"), device="cpu", properties=[get_property("launch")],
                     arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=seed,
                     round_examples=60, corpus_dir=tmp_path)
        return c.run(examples=60)

    first = run(1)
    assert len(first.findings) == 1
    (f,) = first.findings.values()
    assert f.entry_new and any(x.prop == "oracle.fold" for x in f.findings)
    entry = corpus.read(f.entry_path)
    assert entry.case.rows and len([r for r in entry.case.rows if not r.pad]) <= 2  # shrunk
    second = run(2)
    (g,) = second.findings.values()
    assert g.entry_path == f.entry_path and not g.entry_new
    assert len(corpus.entries(tmp_path)) == 1


def _read_only_run(corpus_dir, capsys, extra=()):
    """`gdn-fuzz run` on a planted bug with a corpus it cannot write: (exit code, output)."""
    from gdn_fuzz import cli

    rc = cli.main(["run", "--target", "mutant:anchor_off_by_one", "--arms", "bf16", "--T", "4", "--property", "launch",
                   "--examples", "12", "--seed", "0", "--corpus", str(corpus_dir), *extra])
    return rc, capsys.readouterr().out


def test_run_with_an_unwritable_corpus_says_so_once(tmp_path, monkeypatch, capsys):
    """A corpus folder the filesystem refuses (a read-only checkout; simulated: os.access says no write access
    under it): the isolated worker keeps its in-flight case in a temporary folder, the run finds the planted bug,
    exits 1 with no traceback, and says once that the new entries were not written and where the cases are."""
    ro = tmp_path / "checkout"
    (ro / "corpus").mkdir(parents=True)
    real = os.access
    monkeypatch.setattr(corpus.os, "access", lambda p, mode, *a, **k: (False if str(p).startswith(str(ro)) and
                                                                        mode & os.W_OK else real(p, mode, *a, **k)))
    rc, out = _read_only_run(ro / "corpus", capsys)
    assert rc == 1 and "Traceback" not in out, out[-3000:]
    assert "cannot be written" in out and "not written" in out and "each case is printed above" in out, out[-3000:]
    assert list((ro / "corpus").iterdir()) == []  # no entry, and no .inflight folder


def test_run_in_a_read_only_mount(tmp_path, monkeypatch, capsys):
    """The same on a real read-only filesystem (a read-only bind mount of the checkout, cwd inside it, with
    GDN_FUZZ_CORPUS_READONLY=1 as CI sets it): the run works.  Skips where this process may not mount."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    (src / "corpus").mkdir(parents=True)
    ro.mkdir()
    ok = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode == 0 and \
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True).returncode == 0
    if not ok:
        subprocess.run(["umount", str(ro)], capture_output=True)
        pytest.skip("cannot make a read-only bind mount here (needs root and mount privileges)")
    try:
        monkeypatch.chdir(ro)
        monkeypatch.setenv(corpus.READONLY_ENV, "1")
        monkeypatch.setenv(corpus.CORPUS_ENV, str(ro / "corpus"))
        rc, out = _read_only_run(ro / "corpus", capsys)
        assert rc == 1 and "Traceback" not in out, out[-3000:]
        assert "is read-only" in out and "not written" in out, out[-3000:]
    finally:
        monkeypatch.chdir(tmp_path)
        # lazily: the forkserver this run started keeps its working directory inside the mount, and a plain
        # umount then fails (busy) and leaves the mount behind
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


def test_run_names_a_corrupt_entry(tmp_path, capsys):
    """A corrupt entry in the corpus (truncated JSON) is named when `gdn-fuzz run` starts, with the reason and the
    fix, instead of being left out of the known bugs without a word; the run goes on."""
    from gdn_fuzz import cli

    d = tmp_path / "corpus"
    d.mkdir()
    (d / "launch-0123456789abcdef.json").write_text('{"format": "gdn_fuzz.corpus/2", "case": {')
    rc = cli.main(["run", "--target", "reference", "--arms", "bf16", "--T", "4", "--property", "launch",
                   "--examples", "2", "--corpus", str(d)])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0, out[-2000:]
    assert "corpus: skipped" in out and "launch-0123456789abcdef.json" in out and "truncated JSON" in out, out[-2000:]
    assert "delete it or restore it from git" in out


def test_corpus_check_names_each_refused_entry(tmp_path, capsys):
    """`gdn-fuzz corpus check FOLDER`: every entry read as replay and run read it; each refused one named with the
    reason (a truncated file, a case field out of bounds), exit 1; a valid corpus exits 0; a missing folder is a
    usage error (2).  Nothing runs."""
    import shutil

    from gdn_fuzz import cli

    good = tmp_path / "good"
    shutil.copytree(corpus.default_dir() if corpus.default_dir().is_dir() else "corpus", good)
    assert cli.main(["corpus", "check", str(good)]) == 0
    assert "0 refused" in capsys.readouterr().out
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    (bad / "launch-0123456789abcdef.json").write_text('{"format": "gdn_fuzz.corpus/2", "case": {')
    one = bad / sorted(p.name for p in good.glob("launch-*.json"))[0]
    d = json.loads(one.read_text())
    d["case"]["T"] = 5
    one.write_text(json.dumps(d))
    assert cli.main(["corpus", "check", str(bad)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "launch-0123456789abcdef.json: unreadable or truncated JSON" in out and f"{one.name}" in out, out
    assert "2 refused" in out, out
    assert cli.main(["corpus", "check", str(tmp_path / "none")]) == 2
