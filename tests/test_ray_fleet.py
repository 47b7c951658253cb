"""`gdn-fuzz run --ray`: campaign actors on a real Ray cluster (gdn_fuzz.engine.raycluster, fleet).

The cluster is real: this module starts one with `ray start --head --block` (4 logical CPUs, no GPU,
on 127.0.0.1 and a free port) and stops it with SIGTERM at the end; the driver is a real `gdn-fuzz
run --ray ADDRESS` process.  What is shown here, on the CPU with the reference target and planted
bugs (the GPU placement is the same code with num_gpus; docs/fleet.md has the H200 run):

  - a planted bug found by the actors is stored once, by the driver, and the merged record says who
    found it;
  - killing an actor's process (SIGKILL, as the out-of-memory killer does) while it shrinks a failure
    loses nothing: the driver stores the failure with its first failing case, records the in-flight
    case, restarts the actor with the budget left, and the new actor checks that case again first;
  - Ctrl-C of the driver stops every actor cleanly (each sends what it found), exit 130;
  - without Ray, or without a cluster at the address, a one-line usage error (exit 2), at once.

Skipped, with the reason, where Ray (the extra gdn-fuzz[cluster]) is not installed.  The module is one
xdist group: its tests share the cluster and run on one xdist worker.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from gdn_fuzz.engine import corpus, raycluster
from gdn_fuzz.cli import main

from .drivers import reaped
from .planted import slow_fold

pytestmark = pytest.mark.xdist_group("ray_cluster")
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[cluster]' runs these tests")

CLUSTER_CPUS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    """A real single-node Ray cluster for this module (raycluster.head_node): its GCS address."""
    with raycluster.head_node(CLUSTER_CPUS, 0, log_path=tmp_path_factory.mktemp("ray") / "ray-start.log") as address:
        yield address


def _driver(*argv, env: dict | None = None) -> subprocess.Popen:
    """`gdn-fuzz run` as its own process (a Ctrl-C of a shell's disposition: xdist workers ignore SIGINT)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    env.pop("GDN_FUZZ_PROCESSES", None)
    return subprocess.Popen([sys.executable, "-m", "gdn_fuzz.cli", "run", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _read_until(p: subprocess.Popen, pattern: str, lines: list, timeout_s: float = 120) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"no line matching {pattern!r}; the driver said:\n{''.join(lines)[-4000:]}")


def _finish(p: subprocess.Popen, lines: list, timeout_s: float = 180) -> str:
    out, _ = p.communicate(timeout=timeout_s)
    return "".join(lines) + out


def test_a_planted_bug_is_stored_once(ray_address, tmp_path):
    """Two actors on the cluster run the planted fold_skipped bug; the driver stores it once, the merged
    record has one finding with the actors that found it, each actor's own record, and the totals."""
    cdir, jp = tmp_path / "corpus", tmp_path / "camp.json"
    p = _driver("--ray", ray_address, "--processes", "2", "--device", "cpu", "--target", "mutant:fold_skipped",
                "--arms", "bf16", "--T", "4", "--property", "launch", "--examples", "25", "--corpus", str(cdir),
                "--json", str(jp), "--shrink-grace", "0")  # no shrinking past the budget: 25 examples exactly
    out = _finish(p, [])
    assert p.returncode == 1, out[-4000:]  # new finding
    rec = json.loads(jp.read_text())
    assert rec["backend"] == "ray" and rec["ray"]["cpus"] == CLUSTER_CPUS and rec["failed"] == []
    assert sorted(w["worker"] for w in rec["workers"]) == ["ray0", "ray1"]
    assert sorted(w["seed"] for w in rec["workers"]) == [0, 1]
    assert all(w["examples"] == 25 for w in rec["workers"])  # the example budget is per actor
    (f,) = rec["findings"]
    assert f["signature"].startswith("oracle.fold [M7]") and f["shrunk"]
    entries = corpus.entries(cdir)
    assert [e.name for e in entries] == [f["corpus_entry"]]
    e = corpus.read(entries[0])
    assert e.signature == f["signature"] and e.target == "mutant:fold_skipped"
    assert [w for w in rec["corpus_writes"] if w["written"]] == [
        dict(signature=f["signature"], entry=f["corpus_entry"], worker=f["worker"], written=True, replaced=False)]
    assert rec["totals"]["examples"] == 50 and rec["totals"]["findings"] == 1
    assert "1 entries (1 written by this run)" in out


def test_killing_an_actor_loses_no_finding(ray_address, tmp_path):
    """SIGKILL of the actor while it shrinks a failure: the driver stores the failure with its first failing
    case (shrunk: no, noted), records the lost actor with its in-flight case and what it was shrinking,
    restarts it (seed, budget left, the failure known), and the new actor checks the in-flight case again
    in a fresh process before anything else."""
    target = slow_fold(tmp_path)
    cdir, jp = tmp_path / "corpus", tmp_path / "camp.json"
    p = _driver("--ray", ray_address, "--processes", "1", "--device", "cpu", "--target", str(target),
                "--arms", "bf16", "--T", "4", "--property", "launch", "--seconds", "25", "--corpus", str(cdir),
                "--json", str(jp), env=dict(GDN_FUZZ_TEST_SLOW_S="0.5"))
    lines: list = []
    with reaped(p):
        pid = int(_read_until(p, r"worker ray0 started: pid (\d+)", lines).group(1))
        sig = _read_until(p, r"failure (.+?)  \(worker ray0", lines).group(1)
        os.kill(pid, signal.SIGKILL)  # shrinking: every flush-row launch takes 0.5 s
        out = _finish(p, lines)
    assert p.returncode == 1, out[-4000:]
    rec = json.loads(jp.read_text())
    (lost,) = rec["lost"]
    assert lost["worker"] == "ray0" and lost["pid"] == pid and lost["restarted"]
    assert "ActorDiedError" in lost["cause"] and lost["shrinking"] == [sig]
    assert lost["inflight"]["prop"] == "launch"
    again = lost["checked_again"]
    assert again is not None and again["by"] == "ray0" and again["outcome"] in ("passed", "failed"), lost
    (f,) = rec["findings"]
    assert f["signature"] == sig and not f["shrunk"] and "lost while shrinking" in f["note"]
    (e,) = [corpus.read(x) for x in corpus.entries(cdir)]  # stored once, whole
    assert e.signature == sig and e.filename() == f["corpus_entry"]
    attempts = sorted((w["attempt"], w.get("lost") is not None) for w in rec["workers"])
    assert attempts == [(0, True), (1, False)], attempts
    restarted = [w for w in rec["workers"] if w["attempt"] == 1][0]
    assert restarted["seed"] == 1 and restarted["budget_s"] < 25  # seed + workers * attempt; the budget left
    assert restarted["findings"] == []  # the failure was known to it: not found, shrunk or stored again
    assert rec["totals"]["restarts"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the signals are POSIX")
def test_ctrl_c_stops_every_actor_cleanly(ray_address, tmp_path):
    """A Ctrl-C of the driver asks each actor to stop: each sends its record (interrupted), exit 130."""
    jp = tmp_path / "camp.json"
    p = _driver("--ray", ray_address, "--processes", "2", "--device", "cpu", "--target", "reference", "--arms",
                "bf16", "--T", "4", "--seconds", "300", "--no-corpus", "--json", str(jp))
    lines: list = []
    with reaped(p):
        started = {_read_until(p, r"worker (ray\d) started", lines).group(1) for _ in range(2)}  # either order
        assert started == {"ray0", "ray1"}, started
        time.sleep(3)
        os.kill(p.pid, signal.SIGINT)
        out = _finish(p, lines, timeout_s=120)
    assert p.returncode == 130, out[-4000:]
    rec = json.loads(jp.read_text())
    assert rec["interrupted"] and rec["lost"] == [] and rec["failed"] == []
    assert sorted((w["worker"], w["exit"], w["interrupted"]) for w in rec["workers"]) == [
        ("ray0", 130, True), ("ray1", 130, True)]
    assert all(w["examples"] > 0 for w in rec["workers"])


def test_no_cluster_at_the_address_is_a_usage_error_at_once(capsys):
    """An address where no head listens: one line naming it and the fix, exit 2, in seconds (ray.init alone
    retries for minutes)."""
    t0 = time.monotonic()
    assert main(["run", "--ray", f"127.0.0.1:{_free_port()}", "--device", "cpu", "--examples", "1"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "no Ray cluster reached" in out and "does not answer" in out and "HOST:PORT" in out, out
    assert time.monotonic() - t0 < 30


def test_without_ray_the_extra_is_named(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["run", "--ray", "auto", "--device", "cpu", "--examples", "1"]) == 2
    out = " ".join(capsys.readouterr().out.split())  # the console folds long lines at 140 columns
    assert out.startswith("gdn-fuzz run: --ray needs Ray") and "pip install 'gdn-fuzz[cluster]'" in out, out


def test_ray_with_gpus_is_a_usage_error(capsys):
    assert main(["run", "--ray", "auto", "--gpus", "0,1", "--examples", "1"]) == 2
    assert "choose one" in capsys.readouterr().out


def _placed(monkeypatch, cluster: dict, argv: list[str]):
    """run_on_ray's plan and actor resources for a pretend cluster (no Ray call is made)."""
    seen = {}

    class FakeFleet:
        def __init__(self, backend, specs, **kw):
            seen.update(backend=backend, specs=specs, **kw)

        def run(self):
            return 0

    class FakeRay:
        __version__ = "test"

        def remote(self, **kw):
            return lambda cls: cls

        def shutdown(self):
            pass

    monkeypatch.setattr(raycluster, "import_ray", lambda: FakeRay())
    monkeypatch.setattr(raycluster, "connect", lambda ray, how: dict(cluster, how=how))
    monkeypatch.setattr(raycluster, "Fleet", FakeFleet)
    from gdn_fuzz.cli import build_parser

    args = build_parser().parse_args(["run", "--ray", "auto", *argv])
    assert raycluster.run_on_ray(args, None, console=argparse.Namespace(print=lambda *a, **k: None)) == 0
    return seen


def test_one_actor_per_gpu_and_cpu_actors(monkeypatch):
    """On a cluster with GPUs: one actor per GPU (num_gpus 1), or N per GPU with --processes N (num_gpus
    1/N), on CUDA with the production target by default; on a CPU cluster: CPUs // 2 actors (--processes N:
    N), the reference target.  Shares of arms and properties as fleet.plan_shares gives them."""
    gpu2 = dict(cpus=32.0, gpus=2.0, nodes=[dict(host="a", cpus=16, gpus=1), dict(host="b", cpus=16, gpus=1)])
    monkeypatch.delenv("GDN_FUZZ_PROCESSES", raising=False)
    s = _placed(monkeypatch, gpu2, ["--examples", "5"])
    assert [x.label for x in s["specs"]] == ["ray0", "ray1"] and s["backend"].options["num_gpus"] == 1.0
    assert {x.device for x in s["specs"]} == {"cuda"} and s["target_name"] == "production"
    assert [x.seed for x in s["specs"]] == [0, 1] and s["specs"][0].torch_threads == 16
    assert s["backend"].options["num_cpus"] == 16  # a node's CPUs split between its GPUs' actors
    s = _placed(monkeypatch, gpu2, ["--examples", "5", "--processes", "4"])
    assert len(s["specs"]) == 8 and s["backend"].options["num_gpus"] == 0.25 and s["specs"][0].torch_threads == 4
    assert s["backend"].options["num_cpus"] == 4
    cpu = dict(cpus=8.0, gpus=0.0, nodes=[dict(host="a", cpus=8, gpus=0)])
    s = _placed(monkeypatch, cpu, ["--examples", "5"])
    assert len(s["specs"]) == 4 and s["backend"].options["num_gpus"] == 0.0 and s["backend"].options["num_cpus"] == 2
    assert s["specs"][0].torch_threads == 2
    s = _placed(monkeypatch, dict(cpus=2.0, gpus=0.0, nodes=[dict(host="a", cpus=2, gpus=0)]),
                ["--examples", "5", "--processes", "4"])  # more actors than CPUs: a fraction each, one thread
    assert s["backend"].options["num_cpus"] == 0.5 and s["specs"][0].torch_threads == 1
    assert {x.device for x in s["specs"]} == {"cpu"} and s["target_name"] == "reference"
    s = _placed(monkeypatch, cpu, ["--examples", "5", "--processes", "3", "--arms", "bf16", "fp16"])
    assert [x.arms for x in s["specs"]] == [("bf16",), ("fp16",), ("bf16",)]
    env_seen = _placed(monkeypatch, cpu, ["--examples", "5"])["backend"].options["runtime_env"]["env_vars"]
    assert all(k.startswith(("GDN_FUZZ_", "GDN_UCACHE_")) for k in env_seen)


UNPLACEABLE = """
import os, queue, sys
from gdn_fuzz.engine.raycluster import RayBackend, _token_auth
_token_auth(sys.argv[1])  # as the driver does: a token only where the cluster has one
import ray
from gdn_fuzz.engine.worker import WorkerSpec
ray.init(address=sys.argv[1], log_to_driver=False)
b = RayBackend(ray, num_gpus=1.0, start_timeout_s=3.0)  # the cluster has no GPU
q = queue.Queue()
b.start(WorkerSpec(label="ray0", target="reference", device="cuda", seed=0, arms=("bf16",),
                   properties=("launch",), examples=1), q)
print(q.get(timeout=60))
b.close()
"""


def test_an_actor_that_cannot_be_placed_is_given_up(ray_address):
    """An actor Ray cannot place (it asks for a GPU the cluster lacks) sends nothing: after start_timeout_s
    the backend kills it and ends its stream as failed, with the reason (the fleet then counts the worker
    as failed, exit 2, instead of restarting it)."""
    p = subprocess.run([sys.executable, "-c", UNPLACEABLE, ray_address], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    ev = ast.literal_eval(p.stdout.strip().splitlines()[-1])  # the (label, attempt, event) printed
    assert ev[0] == "ray0" and ev[2]["kind"] == "exit" and ev[2]["failed"], ev
    assert "sent nothing in" in ev[2]["cause"] and "no free GPU" in ev[2]["cause"], ev


def test_a_cluster_with_token_authentication(tmp_path):
    """A head started where ~/.ray/auth_token exists (`ray get-auth-token --generate`) has token
    authentication on, and a plain ray.init from that HOME is refused; `gdn-fuzz run --ray ADDRESS`
    from the same HOME sends the token (raycluster._token_auth) and runs."""
    home = tmp_path / "home"
    env = dict(os.environ, HOME=str(home))
    env.pop("RAY_AUTH_MODE", None)
    gen = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "get-auth-token", "--generate"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0 and (home / ".ray" / "auth_token").is_file(), gen.stderr[-2000:]
    with raycluster.head_node(2, 0, log_path=tmp_path / "ray-start.log", env=env) as address:
        assert "Token authentication is enabled" in (tmp_path / "ray-start.log").read_text()
        plain = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={address!r})"], env=env,
                               capture_output=True, text=True, timeout=120)
        assert plain.returncode != 0 and "InvalidAuthToken" in plain.stderr, plain.stderr[-3000:]  # no token sent
        p = _driver("--ray", address, "--processes", "1", "--device", "cpu", "--target", "reference", "--arms",
                    "bf16", "--T", "4", "--property", "launch", "--examples", "2", "--no-corpus", env=dict(HOME=str(home)))
        out = _finish(p, [])
    assert p.returncode == 0, out[-4000:]
    assert "worker ray0 started" in out
