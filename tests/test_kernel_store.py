"""The kernel store (gdn_fuzz.targets.kernel_store): compiled kernels on disk across processes.

CPU tests drive the store with stand-in compiled functions (their dump/load is the DSL's; here
only the store's own logic: keys, atomic writes, fallbacks, the install on the released module).
The GPU test compiles the released kernel in one process and checks that a second process reads
it from the store, compiles nothing, and writes the same bits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from gdn_fuzz.targets import kernel_store as ks


class FakeCompiled:
    """Stands in for a JitCompiledFunction: callable, exports bytes."""

    def __init__(self, payload: bytes, fail: bool = False):
        self.payload, self.fail = payload, fail

    def __call__(self, *args):
        return ("ran", self.payload, args)

    def dump_to_object(self, prefix: str) -> bytes:
        if self.fail:
            raise RuntimeError("export provider is not set")
        return prefix.encode() + b"|" + self.payload


class FakeModule:
    """What cutlass.cute.runtime.load_module returns: attribute lookup by exported prefix."""

    def __init__(self, path: str):
        prefix, _, payload = Path(path).read_bytes().partition(b"|")
        self.prefix, self.payload = prefix.decode(), payload

    def __getattr__(self, name):
        if name != self.prefix:
            raise AttributeError(name)
        return FakeCompiled(self.payload)


@pytest.fixture
def fake_loader(monkeypatch):
    import cutlass.cute.runtime as rt

    calls = []

    def load_module(path, **kw):
        calls.append(path)
        return FakeModule(path)

    monkeypatch.setattr(rt, "load_module", load_module)
    return calls


def kernel_file(tmp_path: Path, text: str = "kernel v1\n") -> Path:
    p = tmp_path / "kernel.py"
    p.write_text(text)
    return p


def test_store_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv(ks.STORE_ENV, "off")
    assert ks.store_dir() is None
    monkeypatch.setenv(ks.STORE_ENV, str(tmp_path / "s"))
    assert ks.store_dir() == tmp_path / "s"
    monkeypatch.delenv(ks.STORE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ks.store_dir() == tmp_path / "xdg" / "gdn_fuzz" / "kernels"


def test_a_compiled_kernel_is_read_back_by_a_fresh_store(tmp_path, fake_loader):
    ident = ks.identity(kernel_file(tmp_path), "bf16")
    key = ("ucache-flush-v2", "torch.bfloat16", (0, "sm_90a"), 4, False, 64, 16, 128)
    first = ks.KernelStore(tmp_path / "store", ident)
    assert key not in first  # nothing on disk yet: the wrapper compiles
    first[key] = FakeCompiled(b"cubin-A")
    assert (first.compiled, first.saved, first.loaded) == (1, 1, 0)
    assert first.path(key).is_file()
    assert not list((tmp_path / "store").glob(".tmp-*")), "no temporary left behind"

    second = ks.KernelStore(tmp_path / "store", ident)  # another process
    assert key in second
    assert (second.compiled, second.loaded) == (0, 1)
    assert second[key]("x")[1] == b"cubin-A"
    assert fake_loader == [str(first.path(key))]
    other = key[:-1] + (64,)
    assert other not in second, "another cache key (V) is another kernel"


def test_another_file_never_reads_this_files_kernels(tmp_path, fake_loader):
    """A mutant or an edited kernel hashes to other names: it compiles its own kernel."""
    key = ("k", 4)
    a = ks.KernelStore(tmp_path / "store", ks.identity(kernel_file(tmp_path, "kernel v1\n"), "bf16"))
    a[key] = FakeCompiled(b"A")
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    b = ks.KernelStore(tmp_path / "store", ks.identity(kernel_file(b_dir, "kernel v1 with one edit\n"), "bf16"))
    assert key not in b
    c = ks.KernelStore(tmp_path / "store", ks.identity(kernel_file(tmp_path, "kernel v1\n"), "fp16"))
    assert key not in c, "another dtype arm is another kernel"
    assert fake_loader == []


def test_a_failing_export_keeps_the_kernel_in_memory_and_warns_once(tmp_path, capsys):
    s = ks.KernelStore(tmp_path / "store", "id")
    s["a"] = FakeCompiled(b"A", fail=True)
    s["b"] = FakeCompiled(b"B", fail=True)
    assert s["a"]()[1] == b"A" and "b" in s
    assert s.saved == 0 and len(s.errors) == 2
    err = capsys.readouterr().err
    assert err.count("kernel store") == 1 and "compiling instead" in err and "RuntimeError" in err
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").iterdir())


def test_an_unreadable_file_means_compile(tmp_path, monkeypatch, capsys):
    import cutlass.cute.runtime as rt

    s = ks.KernelStore(tmp_path / "store", "id")
    s.folder.mkdir()
    s.path("a").write_bytes(b"not an object file")

    def broken(path, **kw):
        raise RuntimeError("bad ELF")

    monkeypatch.setattr(rt, "load_module", broken)
    assert "a" not in s  # the wrapper then compiles and overwrites the file
    s["a"] = FakeCompiled(b"A")
    assert s.compiled == 1 and s.path("a").read_bytes().endswith(b"|A")
    assert "bad ELF" in capsys.readouterr().err


def test_install_only_on_dsl_modules_and_not_when_off(tmp_path, monkeypatch):
    monkeypatch.setenv(ks.STORE_ENV, str(tmp_path / "store"))
    f = kernel_file(tmp_path)
    plain = types.SimpleNamespace(_CACHE={})  # no `cute`: e.g. a Triton or torch target
    assert ks.install(plain, f, "bf16") is None and type(plain._CACHE) is dict
    dsl = types.SimpleNamespace(_CACHE={}, cute=object())
    store = ks.install(dsl, f, "bf16")
    assert dsl._CACHE is store and isinstance(store, ks.KernelStore)
    assert ks.install(dsl, f, "bf16") is None and dsl._CACHE is store, "installed once"
    monkeypatch.setenv(ks.STORE_ENV, "off")
    off = types.SimpleNamespace(_CACHE={}, cute=object())
    assert ks.install(off, f, "bf16") is None and type(off._CACHE) is dict


def test_the_released_module_gets_a_store(tmp_path):
    """The installed FlashInfer wrapper, imported on this machine as a campaign imports it."""
    from gdn_fuzz.targets import TargetUnavailable, get_target

    try:
        get_target("production")
    except TargetUnavailable as e:
        pytest.skip(f"the released kernel module is not installed here: {e}")
    code = textwrap.dedent("""
        import json
        from gdn_fuzz.targets import get_target
        t = get_target("production")
        m = t.module("bf16")
        print(json.dumps(dict(kind=type(m._CACHE).__name__, folder=str(getattr(m._CACHE, "folder", "")),
                              compiles=t.compile_count("bf16"), loads=t.store_loads("bf16"))))
    """)
    for env, kind in (({ks.STORE_ENV: str(tmp_path / "store")}, "KernelStore"), ({ks.STORE_ENV: "off"}, "dict")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **env})
        if out.returncode != 0 and "No module named" in out.stderr:
            pytest.skip(f"the released module does not import here: {out.stderr.strip().splitlines()[-1]}")
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["kind"] == kind and got["compiles"] == 0 and got["loads"] == 0
        if kind == "KernelStore":
            assert got["folder"] == str(tmp_path / "store")


GPU_PROBE = textwrap.dedent("""
    import hashlib, json, time, torch
    from gdn_fuzz.case import Case, Row
    from gdn_fuzz.observation import BUFFERS, observe
    from gdn_fuzz.targets import get_target
    t = get_target("production")
    case = Case(arm="bf16", T=4, H=2, HV=4, pool=3, rows=(Row(0, 5, 30), Row(2, 16, 7)), seed=11)
    t0 = time.monotonic()
    obs = observe(t, case, "cuda")
    torch.cuda.synchronize()
    assert obs.error is None, obs.error
    def digest(x):
        return hashlib.sha256(x.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
    bits = {k: digest(obs.after[k]) for k in BUFFERS}
    bits["output"] = digest(obs.output)
    print(json.dumps(dict(s=time.monotonic() - t0, compiles=t.compile_count("bf16"),
                          loads=t.store_loads("bf16"), bits=bits)))
""")


def test_second_process_reads_the_kernel_and_writes_the_same_bits(tmp_path):
    """GPU: process 1 compiles and stores; process 2 loads, compiles nothing, and its launch
    writes bit-identical outputs (the loaded kernel is the compiled one)."""
    from gdn_fuzz.targets import TargetUnavailable, get_target

    try:
        why = get_target("production").unavailable_reason("cuda")
    except TargetUnavailable as e:
        why = str(e)
    if why:
        pytest.skip(f"needs the released kernel on an SM90+ GPU: {why}")
    env = {**os.environ, ks.STORE_ENV: str(tmp_path / "store")}
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["compiles"] >= 1 and first["loads"] == 0
    assert second["compiles"] == 0 and second["loads"] == first["compiles"]
    assert second["bits"] == first["bits"]
    assert list((tmp_path / "store").glob("*.o"))


RACER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[5])  # the repository: this file's stand-ins
    import cutlass.cute.runtime as rt
    from gdn_fuzz.targets import kernel_store as ks
    from tests.test_kernel_store import FakeCompiled, FakeModule

    rt.load_module = lambda path, **kw: FakeModule(path)
    folder, ident, me = sys.argv[1], sys.argv[2], sys.argv[4]
    store = ks.KernelStore(Path(folder), ident)
    # both processes miss at the same moment: each says it is ready (its imports done), then waits for the other's
    # word; a start time fixed in advance let a process slowed by a loaded machine's imports arrive late
    barrier = Path(sys.argv[3])
    (barrier / f"ready-{me}").touch()
    while len(list(barrier.glob("ready-*"))) < 2:
        time.sleep(0.001)
    key = ("ucache-flush-v2", 4, 64)
    if key not in store:  # the wrapper's own pattern
        time.sleep(1.0)  # the compile
        store[key] = FakeCompiled(b"cubin-" + str(sys.argv[4]).encode())
    print(json.dumps(dict(compiled=store.compiled, loaded=store.loaded, waited=store.waited_s,
                          payload=store[key].payload.decode())))
""")


def test_processes_that_miss_one_kernel_at_once_compile_it_once(tmp_path):
    """Issue 32: two processes miss the same kernel on an empty store at the same moment; one compiles it (holding
    the kernel's lock), the other waits for that lock and reads what the first stored: one compile, not two."""
    ident = ks.identity(kernel_file(tmp_path), "bf16")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    root = str(Path(__file__).resolve().parents[1])
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / "store"), ident, str(barrier), str(i), root],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted((o["compiled"], o["loaded"]) for o in outs) == [(0, 1), (1, 0)], outs
    waiter = next(o for o in outs if o["loaded"])
    assert waiter["waited"] > 0.5  # it waited for the other's 1 s compile (0.5 s of slack: the two leave the barrier
    # within a few ms of each other)
    assert outs[0]["payload"] == outs[1]["payload"]  # the same kernel in both
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".tmp-")]


def test_a_kernel_that_never_compiled_releases_its_lock(tmp_path, fake_loader):
    """A compile that raised leaves no lock held for long: the next miss (another kernel) releases it, so another
    process does not wait for a kernel that will never be stored."""
    ident = ks.identity(kernel_file(tmp_path), "bf16")
    store = ks.KernelStore(tmp_path / "store", ident)
    assert ("k", 1) not in store and ("k", 1) in store._held  # this process compiles it, holding its lock
    assert ("k", 2) not in store  # the compile of ("k", 1) raised; the wrapper goes on to another kernel
    assert ("k", 1) not in store._held and ("k", 2) in store._held
    store[("k", 2)] = FakeCompiled(b"two")
    assert store._held == {}
    assert ("k", 3) not in store and store._held  # a launch that missed ("k", 3), then raised in its compile:
    mod = types.SimpleNamespace(_CACHE=store)
    ks.release_held(mod)  # Target.launch's finally
    assert store._held == {}


def test_a_launch_that_raises_releases_the_locks_it_took(tmp_path, monkeypatch):
    """Target.launch releases the store's locks whatever the entry point did (a compile that raised inside it)."""
    from gdn_fuzz.targets import Target

    store = ks.KernelStore(tmp_path / "store", "ident")

    def entry(**kw):
        assert ("key",) not in store  # the wrapper's miss: this process takes the kernel's lock
        raise RuntimeError("the compile failed")

    mod = types.SimpleNamespace(_CACHE=store, entry=entry)
    t = Target.__new__(Target)
    t.entry = "entry"
    monkeypatch.setattr(Target, "module", lambda self, arm: mod)
    with pytest.raises(RuntimeError, match="compile failed"):
        t.launch("bf16")
    assert store._held == {}
