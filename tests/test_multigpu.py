"""`gdn-fuzz run --gpus` and `--processes`: N campaign processes per device, one shared corpus, one
merged record.

On a GPU host the workers run the GPU campaign (docs/h200-results.md records the two-GPU run).
Here, without a GPU, the same orchestration runs CPU workers (`--device cpu`): it proves the
assignment (each worker sees only its own CUDA_VISIBLE_DEVICES value, its own seed), that two
workers finding the same planted bug write one whole corpus entry and lose none, that `--processes 2`
runs two children on the run's own device, and that a SIGINT or SIGTERM of the parent stops and
reaps every child.  `--processes auto` on CUDA is checked with the CPU and GPU counts patched.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdn_fuzz.engine import corpus, multigpu
from gdn_fuzz.cli import main
from gdn_fuzz.engine.fleet import plan, plan_shares
from gdn_fuzz.engine.multigpu import auto_processes, parse_gpus, parse_processes, threads_per_worker
from gdn_fuzz.engine.worker import WorkerSpec
from .drivers import reaped


def test_parse_gpus():
    assert parse_gpus("0,1") == ["0", "1"]
    assert parse_gpus(" 3 ") == ["3"]
    for bad in ("", "0,0", "a,b", "0;1"):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad)


def _run_args(**kw):
    """`gdn-fuzz run`'s parsed options, with kw set."""
    from gdn_fuzz.cli import build_parser

    args = build_parser().parse_args(["run"])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def test_plan_keeps_the_options():
    """fleet.plan: worker k gets seed + k, its label and GPU, and every option as given; buckets and pool
    scales left to the worker (None) unless given; specs survive their JSON trip unchanged."""
    args = _run_args(seed=5, target="production", arms=["bf16"], T=[4], buckets=[4, 8], seconds=30.0,
                     property=["launch"], no_isolate=False, seeds_per_example=3, warm_up=True, launch_timeout=7.0,
                     draws="cpu", fail_on_known=True, record="/x/r.jsonl")
    specs = plan(args, target_name="production", device="cuda", labels=["gpu0.p0", "gpu1.p0"], gpus=["0", "1"],
                 torch_threads=4, known={"sig": "e.json"})
    assert [(s.label, s.gpu, s.seed, s.slot) for s in specs] == [("gpu0.p0", "0", 5, 0), ("gpu1.p0", "1", 6, 1)]
    for s in specs:
        assert (s.target, s.device, s.arms, s.properties, s.Ts, s.buckets, s.seconds) == (
            "production", "cuda", ("bf16",), ("launch",), (4,), (4, 8), 30.0)
        assert (s.seeds_per_example, s.warm_up, s.launch_timeout, s.draws, s.fail_on_known, s.record, s.isolate,
                s.torch_threads, s.known) == (3, True, 7.0, "cpu", True, True, True, 4, {"sig": "e.json"})
        assert WorkerSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    d = plan(_run_args(), target_name="reference", device="cpu", labels=["cpu.p0"])[0]
    assert d.buckets is None and d.pool_scales is None and d.torch_threads is None and d.seeds_per_example == 1
    with pytest.raises(ValueError, match="unknown fields.*same one on every host"):
        WorkerSpec.from_dict(dict(d.to_dict(), from_the_future=1))


def test_shares_cover_every_arm_and_property():
    """plan_shares: arms split first, then properties; the first a*p workers cover every (arm, property) pair;
    one worker gets everything; more workers than pairs repeat shares."""
    arms, props = ("a1", "a2", "a3", "a4", "a5"), ("p1", "p2", "p3")
    assert plan_shares(1, arms, props) == [(arms, props)]
    assert plan_shares(2, arms, props) == [(("a1", "a3", "a5"), props), (("a2", "a4"), props)]
    for n in range(1, 40):
        shares = plan_shares(n, arms, props)
        assert len(shares) == n
        pairs = {(a, p) for sa, sp in shares for a in sa for p in sp}
        assert pairs == {(a, p) for a in arms for p in props}, n
    s10 = plan_shares(10, arms, props)  # 5 arm groups x 2 property groups
    assert s10[0] == (("a1",), ("p1", "p3")) and s10[5] == (("a1",), ("p2",))
    assert plan_shares(4, ("bf16",), ("launch",)) == [(("bf16",), ("launch",))] * 4
    with pytest.raises(ValueError, match="n >= 1"):
        plan_shares(0, arms, props)


def test_workers_split_the_host_cores():
    """Without --torch-threads each worker gets cores / workers torch threads (at least 1); an explicit
    --torch-threads is kept."""
    assert [threads_per_worker(n, 16) for n in (1, 2, 4, 8, 32)] == [16, 8, 4, 2, 1]
    specs = plan(_run_args(torch_threads=3), target_name="reference", device="cpu", labels=["a", "b"])
    assert [s.torch_threads for s in specs] == [3, 3]


def test_two_workers_share_one_corpus(tmp_path):
    cdir, jp = tmp_path / "corpus", tmp_path / "camp.json"
    rc = main(["run", "--gpus", "0,1", "--device", "cpu", "--target", "mutant:fold_skipped", "--arms", "bf16",
               "--T", "4", "--examples", "25", "--property", "launch", "--no-isolate", "--corpus", str(cdir),
               "--json", str(jp)])
    assert rc == 1  # the planted bug is found
    rec = json.loads(jp.read_text())
    assert rec["failed"] == [] and [w["gpu"] for w in rec["workers"]] == ["0", "1"]
    assert [w["cuda_visible_devices"] for w in rec["workers"]] == ["0", "1"]
    assert [w["seed"] for w in rec["workers"]] == [0, 1]
    # the driver is the one corpus writer: the planted bug is stored once, whichever worker found it first,
    # and the other is told it is known (or had found it too: then it is listed under found_by)
    assert any(w["findings"] for w in rec["workers"])
    assert all(f["corpus_entry"] is None for w in rec["workers"] for f in w["findings"])  # workers never write
    stored = {p.name: corpus.read(p) for p in corpus.entries(cdir)}  # every entry whole and readable
    merged = {f["signature"]: f for f in rec["findings"]}
    assert set(stored) == {f["corpus_entry"] for f in merged.values()}  # nothing lost, nothing extra
    assert sorted(w["signature"] for w in rec["corpus_writes"] if w["written"]) == sorted(merged)  # each once
    for name, e in stored.items():  # the entry is named by the failure's identity
        assert name == e.filename() and e.target == "mutant:fold_skipped"
        assert merged[e.signature]["found_by"][0] == merged[e.signature]["worker"]
    assert rec["totals"]["examples"] == sum(w["examples"] for w in rec["workers"])
    assert rec["totals"]["structures"] == sum(w["structures"] for w in rec["workers"])


def test_every_run_option_reaches_the_workers():
    """A new `gdn-fuzz run` option must be carried by fleet.plan (or consumed by the driver)."""
    from gdn_fuzz.cli import build_parser
    from gdn_fuzz.engine.multigpu import HANDLED_RUN_OPTIONS

    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["run"]
    dests = {a.dest for a in sub._actions if a.dest != "help"}
    assert dests == HANDLED_RUN_OPTIONS, f"not carried by --gpus: {dests - HANDLED_RUN_OPTIONS}"


def test_auto_processes_is_one_on_cpu_and_the_core_rule_on_cuda(monkeypatch):
    """auto: 1 on a CPU device; on CUDA min(8, max(1, cores per GPU // 2)) (16 cores, one GPU -> 8)."""
    assert parse_processes("auto") is None and parse_processes("3") == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert auto_processes("cpu") == 1
    assert [auto_processes("cuda", g) for g in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert auto_processes("cuda:1") == 8
    assert [auto_processes("cuda", 1, c) for c in (2, 3, 7, 8, 12, 64)] == [1, 1, 3, 4, 6, 8]
    assert [auto_processes("cuda", 8, c) for c in (128, 64, 16)] == [8, 4, 1]
    # --gpus all: the GPUs torch sees share the host's cores (no GPU needed: counts patched)
    import torch

    seen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(multigpu, "run_processes", lambda args, cdir, console, **kw: seen.append(kw) or 0)
    base = dict(gpus="all", device=None, processes="auto")
    assert multigpu.run_on_gpus(argparse.Namespace(**base), None, None) == 0
    assert multigpu.run_on_gpus(argparse.Namespace(**{**base, "processes": "3"}), None, None) == 0
    assert multigpu.run_on_gpus(argparse.Namespace(**{**base, "device": "cpu"}), None, None) == 0
    assert [(k["gpus"], k["device"], k["per_device"]) for k in seen] == [
        (["0", "1"], "cuda", 4), (["0", "1"], "cuda", 3), (["0", "1"], "cpu", 1)]


def test_auto_without_gpus_uses_the_runs_own_cuda_device(monkeypatch, tmp_path):
    """`gdn-fuzz run` on CUDA without --gpus (the product command): auto children on the device the run
    would use, CUDA_VISIBLE_DEVICES untouched; --processes 1 stays in this process."""
    from gdn_fuzz.cli import run as run_cli
    from gdn_fuzz.targets import get_target

    seen = []
    monkeypatch.delenv("GDN_FUZZ_PROCESSES", raising=False)  # the plugin's 1 for test sessions: the product default
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(run_cli, "target_device_arms", lambda args: (get_target("reference"), "cuda", ("bf16",)))
    monkeypatch.setattr(run_cli, "run_processes", lambda args, cdir, console, **kw: seen.append(kw) or 0)
    assert main(["run", "--seconds", "30", "--property", "launch", "--no-corpus"]) == 0
    assert seen == [dict(device="cuda", per_device=8)]  # gpus=None: the environment is kept
    class SingleProcess(Exception):
        pass

    def campaign(*a, **kw):  # --processes 1 builds its campaign in this process: stop there
        raise SingleProcess

    monkeypatch.setattr(run_cli, "make_campaign", campaign)
    with pytest.raises(SingleProcess):
        main(["run", "--processes", "1", "--seconds", "30", "--no-corpus"])
    assert len(seen) == 1


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_bad_processes_is_a_usage_error(value, capsys):
    assert main(["run", "--processes", value, "--device", "cpu", "--target", "reference", "--examples", "1"]) == 2
    out = capsys.readouterr().out
    assert f"--processes={value}" in out and "--processes 4" in out and "auto" in out, out
    assert len(out.strip().splitlines()) == 1, out


def test_bad_processes_from_the_environment_names_it(monkeypatch, capsys):
    monkeypatch.setenv("GDN_FUZZ_PROCESSES", "0")
    assert main(["run", "--device", "cpu", "--target", "reference", "--examples", "1"]) == 2
    assert "--processes=0 (from $GDN_FUZZ_PROCESSES)" in capsys.readouterr().out


def test_two_processes_on_the_cpu(tmp_path):
    """--processes 2 without --gpus: two children on the run's device, distinct seeds, their own records
    (named by device and process), one merged record whose totals are the children's sums."""
    jp = tmp_path / "camp.json"
    rc = main(["run", "--processes", "2", "--device", "cpu", "--target", "reference", "--seconds", "3",
               "--seed", "7", "--no-corpus", "--json", str(jp)])
    assert rc == 0
    rec = json.loads(jp.read_text())
    assert rec["failed"] == [] and rec["processes_per_device"] == 2 and rec["gpus"] is None
    ws = rec["workers"]
    assert [w["worker"] for w in ws] == ["cpu.p0", "cpu.p1"] and [w["seed"] for w in ws] == [7, 8]
    assert all(w["device"] == "cpu" and w["launches"] > 0 for w in ws)
    for key in ("examples", "launches", "compiles"):
        assert rec["totals"][key] == sum(w[key] for w in ws), key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["camp.cpu.p0.json", "camp.cpu.p0.log", "camp.cpu.p1.json",
                                                          "camp.cpu.p1.log", "camp.json"]


def _children(pid: int) -> set[int]:
    """Every live descendant of pid (Linux /proc)."""
    out, todo = set(), [pid]
    while todo:
        q = todo.pop()
        try:
            kids = [int(x) for x in Path(f"/proc/{q}/task/{q}/children").read_text().split()]
        except OSError:
            continue
        out.update(kids)
        todo.extend(kids)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux")
@pytest.mark.parametrize("sig, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_parent_stops_and_reaps_its_children(tmp_path, sig, rc):
    """SIGINT (Ctrl-C) or SIGTERM of the parent of `--processes 2`: it forwards the signal, waits for every
    child and exits 130 (each child reports what it found and exits 130; the merged record is written) or
    143; no process of its tree is left.  Before, the parent died at once (SIGTERM) or with a traceback
    (Ctrl-C) and the children ran on to the end of their budget."""
    jp = tmp_path / "camp.json"
    # an xdist worker ignores SIGINT and its children inherit that: give the parent a shell's disposition
    p = subprocess.Popen([sys.executable, "-m", "gdn_fuzz.cli", "run", "--processes", "2", "--device", "cpu",
                          "--target", "reference", "--seconds", "300", "--no-corpus", "--no-isolate",
                          "--json", str(jp)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        logs = [tmp_path / f"camp.cpu.p{k}.log" for k in range(2)]
        while time.monotonic() < deadline and not all(f.is_file() and "gdn-fuzz worker cpu.p" in f.read_text()
                                                      for f in logs):
            time.sleep(0.1)
        tree = _children(p.pid)
        assert len(tree) >= 2, tree
        os.kill(p.pid, sig)
        out, _ = p.communicate(timeout=30)
        assert p.returncode == rc, out[-3000:]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(q) for q in tree):
            time.sleep(0.05)
        assert not [q for q in tree if _alive(q)], "children outlived the parent"
        if sig == signal.SIGINT:
            rec = json.loads(jp.read_text())
            assert rec["interrupted"] and rec["failed"] == [], out[-3000:]
            assert [(w["exit"], w["interrupted"]) for w in rec["workers"]] == [(130, True), (130, True)]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for q in _children(p.pid):
            os.kill(q, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_a_child_dies_with_its_killed_parent(tmp_path):
    """The children of `--processes` / `--gpus` are started with multigpu._pdeathsig() (isolation's
    parent_death_signal, SIGTERM): when their parent is killed with SIGKILL, the kernel ends them too."""
    code = ("import subprocess, sys, time\nfrom gdn_fuzz.engine import multigpu\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "preexec_fn=multigpu._pdeathsig())\nprint(c.pid, flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        os.kill(child, 0)  # alive while its parent is
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return
            if Path(f"/proc/{child}/stat").is_file() and Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
                return  # dead, a zombie until init reaps it
            time.sleep(0.1)
        raise AssertionError(f"child {child} outlived its SIGKILLed parent by 10 s")
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the signals are POSIX")
def test_a_killed_worker_loses_no_finding_and_is_restarted(tmp_path):
    """The processes backend under the same fleet as --ray (tests/test_ray_fleet.py has the actor case):
    SIGKILL of a child while it shrinks a failure; the driver stores the failure with its first failing case,
    records the child's in-flight case, and starts a new child with the budget left that checks it first."""
    from .planted import TWO_BUGS_B, slow_fold

    target, cdir, jp = slow_fold(tmp_path), tmp_path / "corpus", tmp_path / "camp.json"
    env = dict(os.environ, GDN_FUZZ_TEST_SLOW_S="0.5", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "gdn_fuzz.cli", "run", "--gpus", "0", "--processes", "1", "--device",
                          "cpu", "--target", str(target), "--arms", "bf16", "--T", "4", "--property", "launch",
                          "--seconds", "20", "--corpus", str(cdir), "--json", str(jp)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    seen = []
    with reaped(p):
        pid = None
        for line in p.stdout:
            seen.append(line)
            if pid is None and "worker gpu0.p0 started: pid" in line:
                pid = int(line.split("pid ")[1].split()[0])
            if pid is not None and line.startswith("failure " + TWO_BUGS_B):
                os.kill(pid, signal.SIGKILL)
                break
        out = "".join(seen) + p.communicate(timeout=120)[0]
    assert p.returncode == 1, out[-4000:]
    rec = json.loads(jp.read_text())
    (lost,) = rec["lost"]
    assert lost["pid"] == pid and lost["cause"] == "killed by SIGKILL" and lost["shrinking"] == [TWO_BUGS_B]
    assert lost["restarted"] and lost["inflight"]["prop"] == "launch" and lost["checked_again"]["by"] == "gpu0.p0"
    (f,) = rec["findings"]
    assert f["signature"] == TWO_BUGS_B and not f["shrunk"]
    assert [corpus.read(x).signature for x in corpus.entries(cdir)] == [TWO_BUGS_B]
    assert sorted(w["attempt"] for w in rec["workers"]) == [0, 1]
    assert sorted(x.name for x in tmp_path.glob("camp.gpu0.p0*")) == ["camp.gpu0.p0.a1.json", "camp.gpu0.p0.log"]
