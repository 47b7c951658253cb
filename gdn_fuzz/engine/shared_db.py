"""The example database of the gdn_fuzz Hypothesis profiles: local, plus shared layers (issue 19).

Every runner writes its own `DirectoryBasedExampleDatabase` (GDN_FUZZ_LOCAL_DB, default
.hypothesis/examples).  Two shared layers can sit under it, through Hypothesis'
`MultiplexedDatabase`, so that a failure one runner found is replayed first (Hypothesis' reuse
phase) by every other:

* GDN_FUZZ_SHARED_DB=DIR: a directory every runner can read, always read-only.
* GDN_FUZZ_REDIS_URL=redis://host:6379/0 (or rediss://..., unix:///path/redis.sock): Hypothesis'
  own `hypothesis.extra.redis.RedisExampleDatabase`, read-write: each runner's new examples (and
  Hypothesis' deletion of examples that no longer fail) reach every other runner.
  GDN_FUZZ_REDIS_READONLY=1 wraps it in `ReadOnlyDatabase`: the runner replays what the fleet
  found but sends Redis read commands only (SMEMBERS; not even the TTL refresh that
  RedisExampleDatabase.fetch sends), so read-only ACL credentials are enough.

Keys are namespaced per project and target: key_prefix b"gdn_fuzz:<target>:" (a target given as a
PATH.py is named by its file stem, so that runners with different checkouts share it).  Hypothesis'
own key is a digest of the test function, which does not include the target chosen by --gdn-target.

If the Redis server cannot be reached (down at start, or gone mid-run), the Redis layer warns once
(SharedDatabaseWarning) and is switched off for the rest of the process; the run goes on with the
local database, which receives every save anyway (it comes first in the multiplexed database).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from hypothesis.database import (DirectoryBasedExampleDatabase, ExampleDatabase, MultiplexedDatabase,
                                 ReadOnlyDatabase)

ENV_LOCAL = "GDN_FUZZ_LOCAL_DB"
ENV_SHARED_DIR = "GDN_FUZZ_SHARED_DB"
ENV_REDIS_URL = "GDN_FUZZ_REDIS_URL"
ENV_REDIS_READONLY = "GDN_FUZZ_REDIS_READONLY"
DEFAULT_LOCAL = ".hypothesis/examples"


class SharedDatabaseWarning(UserWarning):
    """The shared (Redis) example database failed; the run continues on the local database."""


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def key_prefix(target: str) -> bytes:
    """b"gdn_fuzz:<target>:" for a target name; a PATH.py target is named by its file stem."""
    name = str(target)
    if name.endswith(".py") or "/" in name or os.sep in name:
        name = Path(name).stem
    return f"gdn_fuzz:{name}:".encode()


def redacted(url: str) -> str:
    """The URL without its password (for messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import ConnectionError, TimeoutError

    return (ConnectionError, TimeoutError, OSError)


class ResilientDatabase(ExampleDatabase):
    """Wraps a shared database: on a connection error or timeout it warns once, switches the shared
    database off for the rest of the process, and carries on as if it were empty (fetch yields
    nothing; save, delete, move do nothing).  Other errors (a wrong password's is a connection
    error too; a NOPERM or a bad command is not) propagate."""

    def __init__(self, db: ExampleDatabase, *, label: str, errors: tuple[type[BaseException], ...] | None = None):
        super().__init__()
        self._db = db
        self.label = label
        self._errors = errors if errors is not None else _redis_errors()
        self.failed: BaseException | None = None

    def __repr__(self) -> str:
        return f"ResilientDatabase({self._db!r}, label={self.label!r})"

    def _fail(self, op: str, e: BaseException) -> None:
        if self.failed is None:
            self.failed = e
            warnings.warn(SharedDatabaseWarning(
                f"gdn_fuzz: the shared example database {self.label} failed on {op} "
                f"({type(e).__name__}: {e}); it is off for the rest of this run, which goes on with the "
                f"local example database only (every example is still saved there)"), stacklevel=3)

    def fetch(self, key: bytes):
        if self.failed is not None:
            return iter(())
        try:
            values = list(self._db.fetch(key))  # fetch may be a generator: errors come when it runs
        except self._errors as e:
            self._fail("fetch", e)
            return iter(())
        return iter(values)

    def save(self, key: bytes, value: bytes) -> None:
        if self.failed is None:
            try:
                self._db.save(key, value)
            except self._errors as e:
                self._fail("save", e)

    def delete(self, key: bytes, value: bytes) -> None:
        if self.failed is None:
            try:
                self._db.delete(key, value)
            except self._errors as e:
                self._fail("delete", e)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if self.failed is None:
            try:
                self._db.move(src, dest, value)
            except self._errors as e:
                self._fail("move", e)

    # change listeners: forwarded to the wrapped database while it works
    def _start_listening(self) -> None:
        if self.failed is None:
            try:
                self._db.add_listener(self._broadcast_change)
            except self._errors as e:
                self._fail("listen", e)

    def _stop_listening(self) -> None:
        try:
            self._db.remove_listener(self._broadcast_change)
        except self._errors:
            pass


def redis_database(url: str, target: str, *, readonly: bool = False, connect_timeout: float = 2.0,
                   timeout: float = 5.0) -> ExampleDatabase:
    """The Redis layer: ResilientDatabase(RedisExampleDatabase(prefix b"gdn_fuzz:<target>:")),
    in ReadOnlyDatabase when readonly.  The client connects on first use; socket_timeout and
    socket_connect_timeout given in the URL's query override the defaults here.  Raises ImportError
    (with the fix) when the redis package is missing, ValueError for a URL redis cannot parse."""
    try:
        from redis import Redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as e:
        raise ImportError(f"{ENV_REDIS_URL} is set but the redis package is missing ({e}): "
                          f"pip install 'redis>=5,<9' (it is in gdn-fuzz's test extra)") from None

    # one retry, no backoff: a pooled connection to a restarted server is retried once; a server that
    # is gone fails fast and the run goes on locally
    client = Redis.from_url(url, socket_connect_timeout=connect_timeout, socket_timeout=timeout,
                            retry=Retry(NoBackoff(), 1))
    prefix = key_prefix(target)
    # (listener_channel stays Hypothesis' default: the argument is newer than hypothesis>=6.100)
    db: ExampleDatabase = (_read_only_fetch_class() if readonly else RedisExampleDatabase)(client, key_prefix=prefix)
    ro = " (read-only)" if readonly else ""
    wrapped: ExampleDatabase = ResilientDatabase(db, label=f"redis {redacted(url)}{ro} prefix {prefix.decode()}")
    return ReadOnlyDatabase(wrapped) if readonly else wrapped


def _read_only_fetch_class():
    from hypothesis.extra.redis import RedisExampleDatabase

    class ReadOnlyFetchRedisExampleDatabase(RedisExampleDatabase):
        """RedisExampleDatabase whose fetch is a plain SMEMBERS, without the EXPIRE (TTL refresh)
        the original pipelines with it: a read-only runner sends no write command at all."""

        def __init__(self, redis, *, key_prefix: bytes, **kw):
            super().__init__(redis, key_prefix=key_prefix, **kw)
            self._gdn_prefix = key_prefix

        def fetch(self, key: bytes):
            yield from self.redis.smembers(self._gdn_prefix + key)

    return ReadOnlyFetchRedisExampleDatabase


def example_database(target: str = "reference", *, local: str | None = None, shared_dir: str | None = None,
                     redis_url: str | None = None, redis_readonly: bool | None = None) -> ExampleDatabase:
    """The example database of the dev and nightly profiles.  Arguments left None come from the
    environment (GDN_FUZZ_LOCAL_DB, GDN_FUZZ_SHARED_DB, GDN_FUZZ_REDIS_URL, GDN_FUZZ_REDIS_READONLY).

    Local first, so every save lands there even if a shared layer fails; then the shared directory
    (read-only), then Redis."""
    local = local or os.environ.get(ENV_LOCAL) or DEFAULT_LOCAL
    shared_dir = shared_dir if shared_dir is not None else os.environ.get(ENV_SHARED_DIR)
    redis_url = redis_url if redis_url is not None else os.environ.get(ENV_REDIS_URL)
    if redis_readonly is None:
        redis_readonly = truthy(os.environ.get(ENV_REDIS_READONLY))
    layers: list[ExampleDatabase] = [DirectoryBasedExampleDatabase(local)]
    if shared_dir:
        layers.append(ReadOnlyDatabase(DirectoryBasedExampleDatabase(shared_dir)))
    if redis_url:
        layers.append(redis_database(redis_url, target, readonly=redis_readonly))
    return layers[0] if len(layers) == 1 else MultiplexedDatabase(*layers)
