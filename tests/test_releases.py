"""Release models: detection, a newer or edited release, contract changes, release files, `gdn-fuzz diff`.

How this file tests
-------------------
gdn_fuzz.targets.releases picks the host-check model of a file: by the sha256 of a released file, by a
file's GDN_FUZZ_RELEASE_MODEL, by the installed flashinfer-python's version (an edited install, a
release newer than every model: the newest model and one warning line), else by the entry point's
parameters (with a warning).  These tests build those files from the real ones (a copy with one
line edited, a copy with a check moved) in a temporary folder and check the choice, the warning and
what the host-check machinery then reports: a moved check is a contract change, one table naming
the changes it moved (in a child pytest run of tests/test_host_checks.py: one failure, the moved
changes skipped), not a wall of failures.  `gdn-fuzz diff` of 0.7.2.post1 against 0.7.4 on the
CPU lists what the model says moved, and nothing the model does not explain.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gdn_fuzz import cli
from gdn_fuzz.properties import hostchecks as hc
from gdn_fuzz.studies import release_diff
from gdn_fuzz.targets import TargetUnavailable, get_target, releases
from gdn_fuzz.targets.reference_ucache_flush import GDN_FUZZ_RELEASE_MODEL

ROOT = Path(__file__).resolve().parents[1]


def _installed(version="0.7.4") -> Path:
    p = releases.installed_file()
    if p is None or releases.sha256(p) != releases.get_release(version).files[releases.FLUSH_FILE]:
        pytest.skip(f"flashinfer-python {version}'s flush module is not the installed one here")
    return p


def _fetched(version="0.7.2.post1") -> Path:
    try:
        return releases.release_file(version)
    except TargetUnavailable as e:
        pytest.skip(str(e))


def _edited(src: Path, tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = src.read_text()
    assert text.count(old) == 1, f"{name}: the edit no longer matches {src} once"
    out = tmp_path / name
    out.write_text(text.replace(old, new))
    return out


# the T check of 0.7.4 moved up, before the ring checks and the backend block (right after H6)
_T_CHECK = ('    if T not in (4, 8):\n        raise NotImplementedError(\n'
            '            f"gated_delta_rule_mtp_ucache_flush: T={T} unsupported')
_MOVED_T = ("    HK = k.shape[2]\n\n    # (before the uGPU hand-off below",
            "    HK = k.shape[2]\n    if T not in (4, 8):  # moved up (a test's edit)\n"
            "        raise NotImplementedError(f'T={T} unsupported')\n\n    # (before the uGPU hand-off below")


def test_released_files_are_detected_by_their_bytes():
    p = _installed()
    got = releases.detect(p)
    assert got.exact and got.release.version == "0.7.4" and "sha256" in got.how
    old = _fetched()
    got = releases.detect(old)
    assert got.exact and got.release.version == "0.7.2.post1"


def test_declared_and_overridden_models():
    ref = get_target("reference")
    assert ref.release.release.version == GDN_FUZZ_RELEASE_MODEL == "0.7.4" and ref.release.exact
    forced = get_target("reference", release="0.7.2.post1")
    assert forced.release.release.version == "0.7.2.post1" and "chosen" in forced.release.how
    with pytest.raises(ValueError, match="modelled releases: 0.7.2.post1, 0.7.4"):
        get_target("reference", release="0.6.0")


def test_an_edited_copy_is_modelled_by_its_parameters_with_one_warning(tmp_path):
    p = _installed()
    edited = _edited(p, tmp_path, "edited_flush.py", "flush_min = W_RING - T + 1  # lazy",
                     "flush_min = W_RING - T + 1  # lazy (edited)")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = releases.detect(edited)
        b = releases.detect(edited)
    assert a.release.version == "0.7.4" and not a.exact and "parameters" in a.how
    assert b == a
    got = [x for x in w if issubclass(x.category, releases.ReleaseModelWarning)]
    assert len(got) == 1 and "no released file" in str(got[0].message)
    old = _edited(_fetched(), tmp_path, "edited_old.py", "flush_min = W_RING - T + 1  # lazy",
                  "flush_min = W_RING - T + 1  # lazy (edited)")
    assert releases.detect(old, warn=False).release.version == "0.7.2.post1"


def test_a_newer_installed_release_runs_with_the_newest_model(monkeypatch, tmp_path):
    """flashinfer-python 0.7.5 (simulated: a changed file the installed distribution claims): the newest
    model, not exact, and a warning that says to diff."""
    p = _installed()
    newer = _edited(p, tmp_path, "gdn_decode_bf16_wy_ucache_flush.py", *_MOVED_T)
    monkeypatch.setattr(releases, "_installed_version_for", lambda path: "0.7.5")
    got = releases.detect(newer, warn=False)
    assert got.release is releases.NEWEST and not got.exact
    assert "newer than the newest release model (0.7.4)" in got.warning and "gdn-fuzz diff 0.7.4 0.7.5" in got.warning
    monkeypatch.setattr(releases, "_installed_version_for", lambda path: "0.7.4")
    assert "edited" in releases.detect(newer, warn=False).how


def test_version_order():
    assert releases._vkey("0.7.2.post1") < releases._vkey("0.7.4") < releases._vkey("0.7.10")
    assert releases._vkey("0.7.2") < releases._vkey("0.7.2.post1")


def test_a_moved_check_is_one_contract_change(tmp_path):
    """The T check moved before the ring checks: on CPU tensors T = 6 now raises NotImplementedError where
    the 0.7.4 model puts the device probe (H19) first.  The single-change table names exactly the T
    changes, and the release differential of the real file against the moved one lists only them."""
    p = _installed()
    moved = _edited(p, tmp_path, "moved_T.py", *_MOVED_T)
    t = get_target(str(moved))
    assert not t.release.exact and t.release.release.version == "0.7.4"
    table = hc.single_change_table(lambda arm: getattr(t.module(arm), t.entry), t.module, t.release.release, "flush",
                                   arms=("bf16",))
    bad = sorted({pr.changes[0] for pr in table if not pr.ok})
    assert bad == ["T=0", "T=1", "T=16", "T=6", "T=9"], bad
    diff = release_diff.host_check_diff(get_target("production"), t, "cpu", arms=("bf16",))
    assert sorted({r.change for r in diff["rows"]}) == bad
    assert all("NotImplementedError" in r.new and "ValueError" in r.old for r in diff["rows"])


def test_the_suite_reports_a_moved_check_once(tmp_path):
    """A child pytest of tests/test_host_checks.py against the moved copy: test_contract_changes fails once
    with the table, and the single-change tests of the moved changes skip naming the contract change (that
    every other change passes there is test_a_moved_check_is_one_contract_change's table)."""
    p = _installed()
    moved = _edited(p, tmp_path, "moved_T.py", *_MOVED_T)
    env = dict(os.environ, CI="true", GDN_FUZZ_CORPUS_READONLY="1")
    f = "tests/test_host_checks.py"
    ids = [f"{f}::test_contract_changes[moved_T.py]"] + [f"{f}::test_single_change[moved_T.py-T={T}]"
                                                         for T in (0, 1, 6, 9, 16)]
    r = subprocess.run([sys.executable, "-m", "pytest", *ids, "-q", "-rs", "-p", "no:cacheprovider", "-n", "0",
                        "--gdn-target", str(moved), "--gdn-arms", "bf16"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    out = r.stdout
    assert "1 failed" in out, out[-3000:]
    assert "test_contract_changes[moved_T.py]" in out and "5 host-check contract changes" in out, out[-3000:]
    assert "(arms bf16)" in out, out[-3000:]  # --gdn-arms reaches the table
    assert out.count("contract change against the 0.7.4") == 5 and "5 skipped" in out, out[-3000:]


def test_diff_of_the_two_releases_on_the_cpu(tmp_path):
    """`gdn-fuzz diff 0.7.2.post1 0.7.4 --examples 0` on the CPU: the rows are the model's differences (the new
    keywords, 0.7.4's early device probe, the fp16 u ring), each side does what its own model says, and the
    table is written."""
    _installed()
    _fetched()
    md, js = tmp_path / "d.md", tmp_path / "d.json"
    assert cli.main(["diff", "0.7.2.post1", "0.7.4", "--examples", "0", "--arms", "bf16", "--device", "cpu",
                     "--markdown", str(md), "--json", str(js)]) == 0
    text = md.read_text()
    assert "| H18 | `backend=garbage` |" in text and "| H19 | `T=6` |" in text
    assert "u_cache-fp16-beside-bf16-ring" in text
    import json

    d = json.loads(js.read_text())
    assert d["host"]["misfits"] == []
    assert all(r["change"] not in ("q-fp32", "k_cache=None", "restart-cache_base=None") for r in d["host"]["rows"])


_FAKE_PIP = """#!{python}
# stands in for `python -m pip download --no-deps ... SPEC -d DIR`: writes a wheel holding one kernel file
import sys, zipfile, pathlib
args = sys.argv[1:]
d = pathlib.Path(args[args.index("-d") + 1]); d.mkdir(parents=True, exist_ok=True)
spec = [a for a in args if "==" in a][0]
with zipfile.ZipFile(d / "flashinfer_python-0-py3-none-any.whl", "w") as z:
    z.writestr("flashinfer/gdn_kernels/gdn_decode_bf16_wy_ucache_flush.py", "RING_SLOTS = 32  # " + spec + "\\n")
    z.writestr("flashinfer/other.py", "")
"""


def _fake_python(tmp_path: Path, fail: bool = False) -> str:
    exe = tmp_path / "fake_python"
    exe.write_text("#!/bin/sh\nexit 3\n" if fail else _FAKE_PIP.format(python=sys.executable))
    exe.chmod(0o755)
    return str(exe)


def test_release_fetch_keeps_the_kernel_files_and_writes_atomically(tmp_path):
    """fetch(): the wheel's flashinfer/gdn_kernels/*.py land under dest/VERSION; a failed download, or a file
    whose sha256 is not the model's, raises ReleaseFileError and leaves no folder behind."""
    dest = tmp_path / "releases"
    got = releases.fetch("9.9.9", dest, python=_fake_python(tmp_path))
    f = got / "flashinfer" / "gdn_kernels" / releases.FLUSH_FILE
    assert got == dest / "9.9.9" and "flashinfer-python==9.9.9" in f.read_text()
    assert not (got / "flashinfer" / "other.py").exists()
    with pytest.raises(releases.ReleaseFileError, match="exit 3"):
        releases.fetch("9.9.8", dest, python=_fake_python(tmp_path, fail=True))
    with pytest.raises(releases.ReleaseFileError, match="the model says"):
        releases.fetch("0.7.2.post1", dest, python=_fake_python(tmp_path))
    assert sorted(p.name for p in dest.iterdir()) == ["9.9.9"]


def test_release_fetch_of_an_unmodelled_release_is_a_usage_error(capsys):
    assert cli.main(["release", "fetch", "0.6.0"]) == 2
    assert "no model for 0.6.0" in capsys.readouterr().out


def test_release_list_names_each_model(capsys):
    assert cli.main(["release", "list"]) == 0
    out = capsys.readouterr().out
    assert "0.7.2.post1" in out and "0.7.4 (default)" in out


def test_unvalidated_changes_are_not_launched_on_a_gpu():
    """hostchecks.unvalidated_on_device: an illegal change the model lets through (0.7.2.post1 takes a one-die
    5-D pool unvalidated) is one the CUDA-tensor probes must not launch; a refused or a legal one is not."""
    t = get_target("reference", release="0.7.2.post1")  # no device probe: the model alone decides
    rel, mod = t.release.release, t.module("bf16")
    assert hc.unvalidated_on_device(mod, rel, "flush", "bf16", hc.get_change("pool-5d"), "cpu")
    assert not hc.unvalidated_on_device(mod, rel, "flush", "bf16", hc.get_change("q=None"), "cpu")
    assert not hc.unvalidated_on_device(mod, releases.R_074, "flush", "bf16", hc.get_change("backend=hmma"), "cpu")


def test_launch_diff_counts_identical_tolerated_and_different_outputs():
    """release_diff.launch_diff on the CPU, where both sides launch: the reference against itself is
    bit-identical everywhere; against the catalogued u_stored_io edit (u rounded to IO before the fp16 ring:
    within the oracle's u tolerance) the u ring is within tolerance; against fold_skipped (flush rows never
    write the fold) the pool is different, and what the edits do not touch stays bit-identical."""
    ref = get_target("reference")
    same = release_diff.launch_diff(ref, ref, "cpu", examples=6, arms=("bf16",), Ts=(4,))
    assert all(set(c) <= {"bit-identical"} for k, c in same["counts"].items() if k != "raised"), same["counts"]
    assert same["counts"]["y"]["bit-identical"] == same["examples"] == 6
    u = release_diff.launch_diff(ref, get_target("mutant:u_stored_io"), "cpu", examples=12, arms=("bf16-ring16",),
                                 Ts=(4,))["counts"]
    assert u["u_cache"].get("within tolerance", 0) > 0 and not u["u_cache"].get("different"), u
    assert set(u["initial_state_source"]) == {"bit-identical"}, u
    fold = release_diff.launch_diff(ref, get_target("mutant:fold_skipped"), "cpu", examples=12, arms=("bf16",),
                                    Ts=(4,))["counts"]
    assert fold["initial_state_source"].get("different", 0) > 0, fold
    assert set(fold["u_cache"]) == {"bit-identical"} and set(fold["y"]) == {"bit-identical"}, fold


def test_a_release_file_with_the_wrong_bytes_is_refused(tmp_path, monkeypatch):
    """release_file: a folder that claims a modelled release but holds another file is an error naming it and
    the fix, not a silently wrong model."""
    d = tmp_path / "0.7.2.post1" / "flashinfer" / "gdn_kernels"
    d.mkdir(parents=True)
    (d / releases.FLUSH_FILE).write_text("RING_SLOTS = 32\n")
    monkeypatch.setenv(releases.RELEASES_DIRS_ENV, str(tmp_path))
    monkeypatch.setattr(releases, "installed_file", lambda fname=releases.FLUSH_FILE: None)
    with pytest.raises(releases.ReleaseFileError, match="gdn-fuzz release fetch 0.7.2.post1"):
        releases.release_file("0.7.2.post1")


def test_gpu_major_asks_nvidia_smi_without_starting_cuda(tmp_path, monkeypatch):
    """releases.gpu_major in a process that has not started CUDA: nvidia-smi's compute_cap of the device,
    through CUDA_VISIBLE_DEVICES; None where it cannot tell (a UUID, no such GPU, no nvidia-smi)."""
    import torch

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 9.0\necho 10.0\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    releases._smi_major.cache_clear()
    try:
        assert releases.gpu_major("cpu") is None
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        assert releases.gpu_major("cuda") == 9 and releases.gpu_major("cuda:1") == 10
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        assert releases.gpu_major("cuda") == 10
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f3c")
        assert releases.gpu_major("cuda") is None
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
        assert releases.gpu_major("cuda") is None
    finally:
        releases._smi_major.cache_clear()
