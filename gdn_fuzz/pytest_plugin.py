"""pytest plugin (entry point pytest11): gdn_fuzz options, report header, Hypothesis profiles.

Options (group "gdn_fuzz", prefix --gdn-):
  --gdn-target NAME|PATH   target for the property suites (default: production on an SM90+
                           GPU, else reference; env GDN_FUZZ_TARGET)
  --gdn-arms A,B           dtype arms to run (default: all five)
  --gdn-device D           torch device (default: cuda when available, else cpu)
  --gdn-corpus DIR         regression corpus replayed by tests/test_corpus_replay.py and written
                           with every shrunk failure (default: $GDN_FUZZ_CORPUS or ./corpus)
  --gdn-corpus-readonly    never write the corpus (CI; or GDN_FUZZ_CORPUS_READONLY=1)
  --gdn-release VERSION    the release model of targets that are no released file (a user's kernel, an edited
                           or newer FlashInfer; env GDN_FUZZ_RELEASE; gdn_fuzz.targets.releases)
Profiles (--hypothesis-profile NAME or env GDN_FUZZ_PROFILE): ci (deterministic, bounded),
dev (the default outside CI; ci is the default when $CI is set), nightly (many examples, long stateful runs).
A profile is loaded only in a gdn_fuzz session (ini gdn_fuzz_profiles = true, a --gdn-* option,
or GDN_FUZZ_PROFILE): installed beside another project, the plugin leaves its settings alone.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

def _pin_gpu_for_xdist_worker() -> str | None:
    """One xdist worker per GPU: worker gwN sees GPU N mod (number of GPUs) as cuda:0.

    Runs in pytest_configure of a gdn_fuzz session (never at import: installed beside another
    project, the plugin leaves its environment alone), which in an xdist worker happens after
    xdist has set PYTEST_XDIST_WORKER and before any test can initialize CUDA.  The GPUs are those in
    CUDA_VISIBLE_DEVICES, else those `nvidia-smi -L` lists.  GDN_FUZZ_NO_GPU_PINNING=1
    turns it off (e.g. several workers sharing one GPU on purpose).
    """
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not wid.startswith("gw") or os.environ.get("GDN_FUZZ_NO_GPU_PINNING"):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        import shutil
        import subprocess

        if shutil.which("nvidia-smi") is None:
            return None
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        gpus = [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
    if not gpus:
        return None
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(wid[2:]) % len(gpus)]
    return os.environ["CUDA_VISIBLE_DEVICES"]



def _database(target: str = "reference", redis_url: str | None = None, redis_readonly: bool | None = None):
    """Local example database, layered over the shared ones (gdn_fuzz.engine.shared_db).

    GDN_FUZZ_SHARED_DB=/mnt/shared/hypothesis: every runner replays what any runner found
    (copied there by CI), and writes its own new examples only locally.
    GDN_FUZZ_REDIS_URL=redis://host:6379/0 (or --gdn-redis-url): Hypothesis' RedisExampleDatabase
    under the local one, keys prefixed b"gdn_fuzz:<target>:"; read-write unless
    GDN_FUZZ_REDIS_READONLY=1 (or --gdn-redis-readonly).  A Redis server that goes away costs one
    warning: the run goes on with the local database.
    """
    from gdn_fuzz.engine.shared_db import example_database

    try:
        return example_database(target, redis_url=redis_url, redis_readonly=redis_readonly)
    except (ImportError, ValueError) as e:  # the redis package missing, a URL redis cannot parse
        raise pytest.UsageError(f"gdn_fuzz shared example database: {e}") from None


def _database_args(config) -> dict:
    """register_profiles' database arguments from the --gdn-* options (None: the environment's).
    The target (the Redis key namespace) is looked up only when Redis is in use: without
    --gdn-target, default_target_name() asks torch about the GPU."""
    url = config.getoption("--gdn-redis-url") or os.environ.get("GDN_FUZZ_REDIS_URL")
    target = config.getoption("--gdn-target") or "reference"
    if url and not config.getoption("--gdn-target"):
        from gdn_fuzz.targets import default_target_name

        target = default_target_name()
    return dict(target=target, redis_url=url,
                redis_readonly=True if config.getoption("--gdn-redis-readonly") else None)


def register_profiles(target: str = "reference", redis_url: str | None = None,
                      redis_readonly: bool | None = None) -> None:
    """The gdn_fuzz Hypothesis profiles: ci (deterministic, bounded: no example database, as
    derandomize implies), dev, nightly (the local database, layered over the shared ones)."""
    db = _database(target, redis_url, redis_readonly)
    settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("dev", max_examples=15, deadline=None, database=db,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("nightly", max_examples=2000, deadline=None, stateful_step_count=250,
                              database=db,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


GDN_OPTIONS = ("--gdn-target", "--gdn-arms", "--gdn-device", "--gdn-corpus", "--gdn-corpus-readonly",
               "--gdn-redis-url", "--gdn-redis-readonly", "--gdn-release")


def gdn_session(config) -> bool:
    """Does this pytest session run gdn_fuzz suites?  Only then does the plugin load a Hypothesis
    profile: the project opted in (ini `gdn_fuzz_profiles = true`, as gdn_fuzz's own pyproject
    does), a --gdn-* option was given on the command line, or GDN_FUZZ_PROFILE is set.  Installed
    beside another project, the plugin leaves that project's Hypothesis settings alone."""
    if config.getini("gdn_fuzz_profiles") or os.environ.get("GDN_FUZZ_PROFILE"):
        return True
    args = [str(a) for a in getattr(config.invocation_params, "args", ())]
    return any(a == o or a.startswith(o + "=") for a in args for o in GDN_OPTIONS)


def pytest_addoption(parser):
    parser.addini("gdn_fuzz_profiles", type="bool", default=False,
                  help="load a gdn_fuzz Hypothesis profile (ci when $CI is set, else dev; or $GDN_FUZZ_PROFILE) "
                       "for this project's tests")
    g = parser.getgroup("gdn_fuzz", "gdn_fuzz property suites")
    g.addoption("--gdn-target", default=os.environ.get("GDN_FUZZ_TARGET"),
                help="reference | production | sm100 | PATH.py (env GDN_FUZZ_TARGET)")
    g.addoption("--gdn-arms", default=os.environ.get("GDN_FUZZ_ARMS"), help="comma-separated dtype arms")
    g.addoption("--gdn-device", default=os.environ.get("GDN_FUZZ_DEVICE"), help="torch device")
    g.addoption("--gdn-corpus", default=None, help="regression corpus folder (default: $GDN_FUZZ_CORPUS or ./corpus)")
    g.addoption("--gdn-corpus-readonly", action="store_true", help="never write new corpus entries")
    g.addoption("--gdn-redis-url", default=None,
                help="shared Hypothesis example database on Redis, under the local one (dev and nightly "
                     "profiles): redis://host:6379/0, rediss://..., unix:///path/redis.sock (env GDN_FUZZ_REDIS_URL)")
    g.addoption("--gdn-redis-readonly", action="store_true",
                help="replay the Redis examples, never write to Redis (env GDN_FUZZ_REDIS_READONLY=1)")
    g.addoption("--gdn-release", default=None,
                help="release model (0.7.2.post1, 0.7.4) of targets that are no released file: a user's kernel, an "
                     "edited or newer FlashInfer (env GDN_FUZZ_RELEASE)")


_ENV_KEYS = ("GDN_FUZZ_CORPUS", "GDN_FUZZ_CORPUS_READONLY", "GDN_FUZZ_PROCESSES", "GDN_FUZZ_RELEASE")


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own plugin, which loads --hypothesis-profile NAME
def pytest_configure(config):
    config._gdn_pinned_gpu = None
    if gdn_session(config):
        config._gdn_pinned_gpu = _pin_gpu_for_xdist_worker()
        register_profiles(**_database_args(config))
        settings.load_profile(os.environ.get("GDN_FUZZ_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
        # the thread policy of gdn_fuzz suites: the CPU cases are small ([B <= 8, HV <= 8, 128, 128]);
        # intra-op threads only oversubscribe the cores xdist workers share (measured 10-50x slower
        # on a 2-core machine: 30 examples took 54.8 s instead of 6.3 s)
        import torch

        torch.set_num_threads(int(os.environ.get("GDN_FUZZ_TORCH_THREADS", "1")))
    # the corpus options reach gdn_fuzz.engine.corpus through the environment for this session only:
    # restored at unconfigure, so an in-process child session (pytester) cannot leak its corpus
    config._gdn_saved_env = {k: os.environ.get(k) for k in _ENV_KEYS}
    if gdn_session(config):
        # one campaign process per `gdn-fuzz run` a test starts: xdist already spreads the suite over the
        # cores, and `--processes auto` would start 8 per run on a 16-core GPU host (at 4 per run, measured
        # on the H200, the suite went from 224 s to over 500 s); a test or a user's environment may say otherwise
        os.environ.setdefault("GDN_FUZZ_PROCESSES", "1")
    if config.getoption("--gdn-corpus"):
        os.environ["GDN_FUZZ_CORPUS"] = str(config.getoption("--gdn-corpus"))
    if config.getoption("--gdn-corpus-readonly"):
        os.environ["GDN_FUZZ_CORPUS_READONLY"] = "1"
    release = config.getoption("--gdn-release")
    if release:
        from gdn_fuzz.targets.releases import RELEASES

        if release not in RELEASES:
            raise pytest.UsageError(f"--gdn-release={release!r}: no model for it; modelled releases: "
                                    f"{', '.join(RELEASES)}")
        os.environ["GDN_FUZZ_RELEASE"] = release
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU that runs the production kernel")
    arms = config.getoption("--gdn-arms")
    if arms:
        from gdn_fuzz.arms import get_arm

        for a in arms.split(","):
            try:
                get_arm(a.strip())
            except ValueError as e:
                raise pytest.UsageError(f"--gdn-arms={arms!r}: {e}") from None


def pytest_unconfigure(config):
    for k, v in getattr(config, "_gdn_saved_env", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _KNOWN_CACHE.clear()
    _TARGET_CACHE.clear()


def _selection(config):
    from gdn_fuzz.arms import ARM_NAMES, get_arm
    from gdn_fuzz.targets import default_target_name

    target = config.getoption("--gdn-target") or default_target_name()
    arms = config.getoption("--gdn-arms")
    arms = tuple(a.strip() for a in arms.split(",")) if arms else ARM_NAMES
    for a in arms:
        get_arm(a)
    import torch

    device = config.getoption("--gdn-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    return target, arms, device


def pytest_report_header(config):
    import torch

    target, arms, device = _selection(config)
    prof = settings._current_profile
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    from gdn_fuzz.engine import corpus

    seed = config.getoption("--hypothesis-seed", None)
    if seed is None and prof == "ci":
        seed = "derandomized (ci profile)"
    pinned = getattr(config, "_gdn_pinned_gpu", None)
    pin = f" (xdist worker pinned to CUDA_VISIBLE_DEVICES={pinned})" if pinned else ""
    return [f"gdn_fuzz: target={target} arms={','.join(arms)} device={device} gpu={gpu}{pin} "
            f"torch={torch.__version__} hypothesis-profile={prof} hypothesis-seed={seed or 'random per test'}",
            f"gdn_fuzz: corpus={corpus.default_dir()} ({len(corpus.entries())} entries, "
            f"{'read-only' if corpus.is_readonly() else 'new failures are written'})"]


_KNOWN_CACHE: dict = {}


def known_for(target_name: str, case=None, device=None) -> dict:
    """{signature: corpus entry name} of the open corpus entries of this target (read once per run); with a
    case, for the backend that case's launch runs on (corpus.known_on_backend: on an SM100 GPU the released
    kernel routes some launches to UMMA, whose known bugs differ)."""
    from gdn_fuzz.engine import corpus

    key = (str(corpus.default_dir()), target_name)
    if key not in _KNOWN_CACHE:
        _KNOWN_CACHE[key] = corpus.known_signatures(target_name)
    known = _KNOWN_CACHE[key]
    if case is None:
        return known
    target = _TARGET_CACHE.get(target_name)
    if target is None:
        from gdn_fuzz.targets import TargetUnavailable, get_target

        try:
            target = _TARGET_CACHE[target_name] = get_target(target_name)
        except (TargetUnavailable, ValueError):
            return known
    backend = target.backend_for_case(case, device)
    return corpus.known_on_backend(known, target, backend)


_TARGET_CACHE: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
    known = getattr(item, "_gdn_known", None)
    if rep.when == "call" and rep.passed and known:
        # every failure this test saw is a known bug: an expected failure, named
        rep.outcome = "skipped"
        rep.wasxfail = "known bug(s) only: " + "; ".join(
            f"{sig} (corpus entry {entry}, {n} example(s))" for (sig, entry), n in sorted(known.items()))


@pytest.fixture
def gdn_verdict(request):
    """gdn_verdict(prop, case, findings, target_name): the verdict of one example.

    Findings whose signature is a known bug of the target (an `open` corpus entry) are counted
    on the test and do not fail it: the search goes on for other signatures, and a test whose
    only failures are known ends as xfail naming the entries.  Any other finding fails the
    example (one exception class per signature, so Hypothesis shrinks each apart); the last
    failing example (Hypothesis replays the minimal one last) is written to the corpus, unless
    read-only, when the test ends.

    In a Hypothesis test (@given) the fixture is meant to be shared by every example of the test (it
    counts them), which Hypothesis' function_scoped_fixture health check refuses by default; give the
    test `@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])`
    (tests/test_plugin.py::test_gdn_verdict_in_a_hypothesis_test_needs_the_documented_setting).
    """
    from gdn_fuzz.engine.campaign import failure_class

    last: dict = {}
    request.node._gdn_known = {}

    device = _selection(request.config)[2]

    def verdict(prop, case, findings, target_name):
        known = known_for(target_name, case, device)
        new = []
        for f in findings:
            sig = f.signature()
            if sig in known:
                k = (sig, known[sig])
                request.node._gdn_known[k] = request.node._gdn_known.get(k, 0) + 1
            else:
                new.append(f)
        if not new:
            return
        sig = min(f.signature() for f in new)
        last.update(prop=prop, case=case, findings=list(findings), target=target_name, signature=sig)
        raise failure_class(sig)(case, list(findings), sig)

    yield verdict
    rep = getattr(request.node, "rep_call", None)
    if last and rep is not None and rep.failed:
        from gdn_fuzz.engine import corpus

        entry = corpus.make_entry(last["prop"], last["case"], last["findings"], last["target"],
                                  signature=last["signature"])
        try:
            path, new = corpus.write(entry)
            request.node.add_report_section("call", "gdn_fuzz corpus",
                                            f"{'new entry' if new else 'already in corpus'}: {path}")
        except PermissionError as e:
            request.node.add_report_section("call", "gdn_fuzz corpus", str(e).splitlines()[0])


@pytest.fixture(scope="session")
def gdn_selection(pytestconfig):
    """(target name, arms, device) chosen by the gdn_fuzz options."""
    return _selection(pytestconfig)


@pytest.fixture(scope="session")
def target_under_test(gdn_selection):
    """(Target, arms, device) chosen by the gdn_fuzz options, for property suites (a user's own test
    files get it too); skips with the reason when the target cannot launch here."""
    from gdn_fuzz.targets import kernel_of

    name, arms, device = gdn_selection

    if kernel_of(name) != "flush":
        pytest.skip(f"target {name!r} is a prefix materializer: the flush kernel's suites do not apply "
                    "(its own are tests/test_materialize.py, fixture materializer_under_test)")
    return _loaded(name, arms, device)


def _loaded(name, arms, device):
    from gdn_fuzz.targets import TargetMismatch, TargetUnavailable, get_target

    try:
        t = get_target(name)
        for a in arms:
            t.module(a)
    except (TargetUnavailable, TargetMismatch, ImportError) as e:
        pytest.skip(f"target {name!r} unavailable here: {e}")
    why = t.unavailable_reason(device)
    if why:
        pytest.skip(why)
    return t, arms, device


@pytest.fixture(scope="session")
def materializer_under_test(gdn_selection):
    """(Target, arms, device) of the prefix materializer suites: --gdn-target when it names a materializer
    (materialize, materialize-reference, mutant:pm_..., a file defining gdn_prefix_materialize); else the
    installed gdn_prefix_materialize on a CUDA device, materialize-reference elsewhere.  Skips with the reason
    when the target cannot launch here."""
    from gdn_fuzz.targets import kernel_of

    name, arms, device = gdn_selection
    if kernel_of(name) != "materialize":
        name = "materialize" if str(device).startswith("cuda") else "materialize-reference"
    return _loaded(name, arms, device)


@pytest.fixture(scope="session")
def prefix_serving_under_test(gdn_selection):
    """(flush Target, materializer Target, arms, device) of the prefix-cache serving flow (tests/test_prefix_serving.py):
    --gdn-target names one of the two kernels and the other is the installed one on a CUDA device (production /
    materialize), the torch reference elsewhere (reference / materialize-reference).  Skips with the reason when either
    cannot launch here."""
    from gdn_fuzz.targets import kernel_of

    name, arms, device = gdn_selection
    cuda = str(device).startswith("cuda")
    if kernel_of(name) == "materialize":
        flush, mat = ("production" if cuda else "reference"), name
    else:
        flush, mat = name, ("materialize" if cuda else "materialize-reference")
    t, _, _ = _loaded(flush, arms, device)
    m, _, _ = _loaded(mat, arms, device)
    return t, m, arms, device
