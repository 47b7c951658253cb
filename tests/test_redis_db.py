"""The shared example database on Redis (issue 19), against a real redis-server.

Each test session (each xdist worker) starts its own redis-server on a unix socket in a fresh
temporary folder (no TCP port: `--port 0`), without persistence, and stops it at the end; the
server-killed test starts one of its own.  Skipped, with the reason, without the redis-server
binary or the redis package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings

import pytest

redis = pytest.importorskip("redis", reason="the redis package is missing (pip install 'redis>=5,<9')")

from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.database import DirectoryBasedExampleDatabase  # noqa: E402

from gdn_fuzz.engine import shared_db  # noqa: E402
from gdn_fuzz.engine.shared_db import SharedDatabaseWarning, example_database, key_prefix, redis_database  # noqa: E402

REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS_SERVER is None,
                                reason="no redis-server binary on PATH (apt-get install redis-server)")
WRITES = {"sadd", "srem", "smove", "expire", "del", "unlink", "set", "publish", "flushdb", "flushall"}


class Server:
    """A throwaway redis-server on a unix socket: no TCP, no RDB/AOF files."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gdn-redis-")  # short: a unix socket path has 107 bytes at most
        self.sock = os.path.join(self.dir, "redis.sock")
        self.url = f"unix://{self.sock}"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client.ping():
                    break
            except (redis.exceptions.ConnectionError, OSError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.skip(f"redis-server did not start (exit code {self.proc.returncode})")
                time.sleep(0.02)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def keys(self, pattern=b"*"):
        return sorted(self.client.scan_iter(match=pattern))


@pytest.fixture(scope="session")
def redis_server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def database_key_on(monkeypatch):
    """Hypothesis uses no database key (so no example database) while a --hypothesis-seed is in force,
    and an in-process pytester session given --hypothesis-seed (tests/test_plugin.py) leaves it set
    in its xdist worker: the in-process Hypothesis runs here start without it."""
    import hypothesis.core

    monkeypatch.setattr(hypothesis.core, "global_force_seed", None)


def unique_target() -> str:
    return "t" + uuid.uuid4().hex[:12]


def shared_warnings(record):
    return [w for w in record if issubclass(w.category, SharedDatabaseWarning)]


FAILING_TEST = '''
import os
from hypothesis import given, strategies as st


@given(st.integers(0, 10**6))
def test_shared(x):
    with open(os.environ["GDN_TEST_LOG"], "a") as f:
        f.write(f"{x}\\n")
    assert x < 500
'''


def test_two_processes_share_the_failing_example(redis_server, tmp_path):
    """Two pytest processes (the gdn_fuzz plugin, dev profile), different local databases, one Redis
    URL (by environment, then by option): the second replays the failure the first found (x=500)
    as its very first example, before generating anything."""
    target = unique_target()
    (tmp_path / "test_shared.py").write_text(FAILING_TEST)
    base = {k: v for k, v in os.environ.items()
            if not (k.startswith(("PYTEST_", "GDN_FUZZ_", "HYPOTHESIS")) or k == "CI")}

    def run(name, by_option):
        log = tmp_path / f"{name}.log"
        env = dict(base, GDN_FUZZ_PROFILE="dev", GDN_FUZZ_TARGET=target,
                   GDN_FUZZ_LOCAL_DB=str(tmp_path / f"local-{name}"), GDN_TEST_LOG=str(log))
        args = ["--gdn-redis-url", redis_server.url] if by_option else []
        if not by_option:
            env["GDN_FUZZ_REDIS_URL"] = redis_server.url
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                              *args, "test_shared.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 1, res.stdout + res.stderr  # the test fails: x=500
        assert "x=500" in res.stdout, res.stdout
        return [int(line) for line in log.read_text().split()]

    first = run("a", by_option=False)  # GDN_FUZZ_REDIS_URL
    assert first[0] != 500  # the first process found it by search
    keys = redis_server.keys(key_prefix(target) + b"*")
    assert keys, "the first process saved nothing to Redis"
    assert not (tmp_path / "local-b").exists()
    second = run("b", by_option=True)  # --gdn-redis-url
    assert second[0] == 500, second[:10]  # replayed from Redis before any generated example
    assert (tmp_path / "local-b").exists()  # the second process saved its failure locally too


def failing_test(db, calls, phases, on_first=None):
    """A Hypothesis test failing for x >= 500 (shrunk: x=500); every call builds the same test,
    so they share one database key."""
    @settings(database=db, max_examples=200, deadline=None, phases=phases)
    @given(st.integers(0, 10**6))
    def body(x):
        calls.append(x)
        if on_first is not None and len(calls) == 1:
            on_first()
        assert x < 500

    return body


def test_server_killed_mid_run_degrades_to_local(tmp_path, database_key_on):
    """The Redis server dies inside a Hypothesis run: one warning, nothing raises but the test's own
    failure, and the failure lands in the local database; later operations stay silent."""
    server = Server()
    try:
        db = example_database(unique_target(), local=str(tmp_path / "local"), shared_dir="",
                              redis_url=server.url, redis_readonly=False)
        db.save(b"before", b"v0")
        assert server.keys(b"gdn_fuzz:*before")  # Redis works before the kill

        def kill():
            server.proc.kill()
            server.proc.wait(10)

        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with pytest.raises(AssertionError):
                failing_test(db, [], (Phase.reuse, Phase.generate, Phase.shrink), on_first=kill)()
            db.save(b"after", b"v1")
            db.delete(b"before", b"v0")
            db.move(b"after", b"after2", b"v1")
            assert list(db.fetch(b"after2")) == [b"v1"]
        got = shared_warnings(record)
        assert len(got) == 1, [str(w.message) for w in got]
        assert "off for the rest of this run" in str(got[0].message)
        local = DirectoryBasedExampleDatabase(str(tmp_path / "local"))
        assert list(local.fetch(b"after2")) == [b"v1"]
        # the shrunk failure, saved after the kill, replays first from the local database alone
        replayed: list = []
        with pytest.raises(AssertionError):
            failing_test(local, replayed, (Phase.reuse,))()
        assert replayed[:1] == [500]
    finally:
        server.stop()


def test_keys_are_namespaced_per_target(redis_server):
    a, b = unique_target(), unique_target()
    db_a = redis_database(redis_server.url, a)
    db_b = redis_database(redis_server.url, b)
    db_a.save(b"k", b"from-a")
    db_b.save(b"k", b"from-b")
    assert list(db_a.fetch(b"k")) == [b"from-a"]
    assert list(db_b.fetch(b"k")) == [b"from-b"]
    assert redis_server.keys(key_prefix(a) + b"*") == [key_prefix(a) + b"k"]
    assert redis_server.keys(key_prefix(b) + b"*") == [key_prefix(b) + b"k"]
    assert key_prefix("reference") == b"gdn_fuzz:reference:"
    assert key_prefix("/ci/checkout/tests/targets/my_kernel.py") == b"gdn_fuzz:my_kernel:"


def test_read_only_mode_never_writes_to_redis(redis_server, tmp_path, monkeypatch, database_key_on):
    """GDN_FUZZ_REDIS_READONLY=1: the runner replays what Redis holds, writes only locally, and sends
    Redis no write command at all (not even the TTL refresh of RedisExampleDatabase.fetch)."""
    target = unique_target()
    redis_database(redis_server.url, target).save(b"k", b"seeded")
    before = redis_server.keys()
    monkeypatch.setenv(shared_db.ENV_REDIS_URL, redis_server.url)
    monkeypatch.setenv(shared_db.ENV_REDIS_READONLY, "1")
    monkeypatch.delenv(shared_db.ENV_SHARED_DIR, raising=False)
    monkeypatch.setenv(shared_db.ENV_LOCAL, str(tmp_path / "local"))
    db = example_database(target)
    redis_server.client.config_resetstat()

    assert list(db.fetch(b"k")) == [b"seeded"]
    db.save(b"k", b"new")
    db.save(b"k2", b"new2")
    db.delete(b"k", b"seeded")
    db.move(b"k2", b"k3", b"new2")

    with pytest.raises(AssertionError):
        failing_test(db, [], tuple(Phase))()
    stats = redis_server.client.info("commandstats")
    used = {name.removeprefix("cmdstat_") for name in stats}
    assert "smembers" in used  # it did read Redis
    assert not used & WRITES, used
    assert redis_server.keys() == before
    assert redis_server.client.smembers(key_prefix(target) + b"k") == {b"seeded"}
    local = DirectoryBasedExampleDatabase(str(tmp_path / "local"))
    assert set(local.fetch(b"k")) == {b"new"} and set(local.fetch(b"k3")) == {b"new2"}
    assert len(list((tmp_path / "local").iterdir())) > 3  # and the Hypothesis run's failure


def test_read_only_mode_works_with_read_only_credentials(redis_server, tmp_path):
    """A Redis user allowed read commands only (ACL +@read): read-only mode replays and stays silent."""
    target, user = unique_target(), "reader" + uuid.uuid4().hex[:8]
    redis_database(redis_server.url, target).save(b"k", b"seeded")
    redis_server.client.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@read", "+@connection")
    db = example_database(target, local=str(tmp_path / "local"), shared_dir="",
                          redis_url=f"unix://{user}:pw@{redis_server.sock}", redis_readonly=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert list(db.fetch(b"k")) == [b"seeded"]
        db.save(b"k", b"new")
        db.delete(b"k", b"seeded")
    assert shared_warnings(record) == []
    assert set(db.fetch(b"k")) == {b"seeded", b"new"}  # Redis unchanged, the save is local


def test_unreachable_server_at_start_warns_once(tmp_path):
    """A URL nobody listens on: the first fetch warns, the run goes on locally, fast."""
    url = f"unix://{tmp_path}/nobody.sock"
    db = example_database(unique_target(), local=str(tmp_path / "local"), shared_dir="", redis_url=url,
                          redis_readonly=False)
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert list(db.fetch(b"k")) == []
        db.save(b"k", b"v")
        assert list(db.fetch(b"k")) == [b"v"]
    assert len(shared_warnings(record)) == 1
    assert time.monotonic() - t0 < 5
