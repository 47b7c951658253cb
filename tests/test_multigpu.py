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
from gdn_fuzz.engine.multigpu import auto_processes, child_argv, parse_gpus, parse_processes, threads_per_worker


def test_parse_gpus():
    assert parse_gpus("0,1") == ["0", "1"]
    assert parse_gpus(" 3 ") == ["3"]
    for bad in ("", "0,0", "a,b", "0;1"):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad)


def test_child_argv_keeps_the_options():
    args = argparse.Namespace(pool_scales=None, device=None, seed=5, round_examples=25, target="production", arms=["bf16"], T=[4],
                              buckets=[4, 8], seconds=30.0, examples=None, property=["launch"], no_isolate=False)
    argv = child_argv(args, 1, "/x/c.gpu1.json", None, "/x/corpus")
    s = " ".join(argv)
    assert "--seed 6" in s and "--device cuda" in s and "--target production" in s and "--seconds 30.0" in s
    assert "--corpus /x/corpus" in s and "--property launch" in s and "--gpus" not in s


def test_workers_split_the_host_cores():
    """--gpus without --torch-threads: each worker gets cores / workers torch threads (at least 1), and
    child_argv carries the count; an explicit --torch-threads is kept."""
    assert [threads_per_worker(n, 16) for n in (1, 2, 4, 8, 32)] == [16, 8, 4, 2, 1]
    args = argparse.Namespace(pool_scales=None, device=None, seed=0, round_examples=25, target=None, arms=None, T=[4], buckets=[4],
                              seconds=1.0, examples=None, property=None, no_isolate=False, torch_threads=3)
    assert "--torch-threads 3" in " ".join(child_argv(args, 0, "/x/c.json", None, None))


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
    # each worker finds the planted bug: as a new finding, or as a known one when the other worker's
    # corpus entry was there before it read the corpus (seen on the H200's busy 16-core host)
    assert all(w["findings"] or w["known"] for w in rec["workers"]), "each worker finds the planted bug"
    assert any(w["findings"] for w in rec["workers"])
    stored = {p.name: corpus.read(p) for p in corpus.entries(cdir)}  # every entry whole and readable
    reported = [f["corpus_entry"] for w in rec["workers"] for f in w["findings"]]
    assert None not in reported and set(stored) == set(reported)  # nothing lost, nothing extra
    # the entry is named by the failure's identity, so the same failure from both workers is one file
    for name, e in stored.items():
        assert name == e.filename()
    assert rec["totals"]["examples"] == sum(w["examples"] for w in rec["workers"])
    assert rec["totals"]["structures"] == sum(w["structures"] for w in rec["workers"])


def test_every_run_option_reaches_the_workers():
    """A new `gdn-fuzz run` option must be carried by child_argv (or consumed by the parent)."""
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

    def campaign(**kw):  # --processes 1 builds its campaign in this process: stop there
        raise SingleProcess

    monkeypatch.setattr(run_cli, "Campaign", campaign)
    with pytest.raises(SingleProcess):
        main(["run", "--processes", "1", "--seconds", "30", "--no-corpus"])
    assert len(seen) == 1


def test_child_argv_forwards_processes_and_seeds_per_example():
    args = argparse.Namespace(pool_scales=None, device="cpu", seed=10, round_examples=25, target="reference", arms=None, T=[4, 8],
                              buckets=[4, 8], seconds=3.0, examples=None, property=None, no_isolate=True,
                              torch_threads=1, seeds_per_example=3, processes="4", warm_up=True)
    s = " ".join(child_argv(args, 3, "/x/c.cpu.p3.json", "/x/r.jsonl.cpu.p3", None))
    assert "--processes 1" in s and "--processes 4" not in s  # a child never starts children
    for part in ("--seed 13", "--device cpu", "--seeds-per-example 3", "--torch-threads 1", "--no-isolate",
                 "--warm-up", "--no-corpus", "--record /x/r.jsonl.cpu.p3", "--json /x/c.cpu.p3.json"):
        assert part in s, part
    args.seeds_per_example = 1
    assert "--seeds-per-example" not in " ".join(child_argv(args, 0, "/x/c.json", None, None))
    del args.seeds_per_example  # an args namespace from before the option: the default, 1
    assert "--seeds-per-example" not in " ".join(child_argv(args, 0, "/x/c.json", None, None))


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
        while time.monotonic() < deadline and not all(f.is_file() and "gdn-fuzz run: target=" in f.read_text()
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
