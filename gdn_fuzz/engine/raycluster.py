"""The Ray backend of a fleet: `gdn-fuzz run --ray auto|local|ADDRESS` (the extra gdn-fuzz[cluster]).

This process is the fleet's driver (gdn_fuzz.engine.fleet: plan, one corpus writer, merge, restarts);
each worker is gdn_fuzz.engine.worker.run_worker inside a Ray actor (_CampaignActor), which sends its
events back in batches through a streaming generator (`run`, num_returns="streaming") and takes the
driver's messages through `tell` (a threaded actor, so both run at once).

  --ray auto      the running cluster: $RAY_ADDRESS, or the one `ray start --head` started on this host
                  (ray.init(address="auto")); none running is a usage error that says how to start one
  --ray local     a new single-host cluster for this run only (ray.init(address="local")), shut down at
                  the end: this host's CPUs and GPUs
  --ray ADDRESS   HOST:PORT of a cluster's head (GCS), or ray://HOST:10001 (Ray Client)

Placement: on a CUDA device, one actor per GPU of the cluster (Ray's GPU resource: each actor asks for
1 / N GPU with --processes N, default 1, and Ray sets its CUDA_VISIBLE_DEVICES); on a CPU device,
--processes N actors in all (auto: the cluster's CPUs // 2, each actor being a campaign and its
crash-isolation process).  Each actor asks for its share of its node's CPUs (cpu_share; a fraction when
there are more actors than CPUs) and runs that many torch threads.  Actors get the driver's GDN_FUZZ_* and
GDN_UCACHE_* environment variables (runtime_env env_vars); every node needs gdn-fuzz (the same
version) and the target installed: each worker reports its target file's SHA-256, and the driver warns
when two workers ran different files.  Actors' own stdout and stderr stay in Ray's logs on their nodes
(log_to_driver=False): what matters reaches the driver as events.

A worker whose actor dies (its process killed, its node lost) ends its stream with a RayActorError:
the fleet records it with its in-flight case and starts a new actor for that worker.  An actor that
cannot be placed (no free GPU or CPU) and sends nothing for start_timeout_s is given up with the
reason; the run goes on with the others.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import tempfile
import threading
import time

from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.exits import EXIT_USAGE
from gdn_fuzz.engine.fleet import TERM_GRACE_S, Fleet, plan
from gdn_fuzz.engine.multigpu import parse_processes, target_name_of
from gdn_fuzz.engine.worker import WorkerSpec, run_worker

# sent with a hand-off wait: the actor's campaign thread goes on only once the batch holding the event
# was handed to Ray, so the driver learns the in-flight case before its check starts
SYNC_KINDS = frozenset({"inflight", "first", "finding", "done", "error"})
HANDOFF_WAIT_S = 5.0
ENV_PREFIXES = ("GDN_FUZZ_", "GDN_UCACHE_")
START_TIMEOUT_S = 600.0  # an actor that has sent nothing after this long is given up (placement, import)


class RayUnavailable(ValueError):
    """Ray is missing or no cluster can be reached: one line with the fix (exit 2)."""


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise RayUnavailable(f"--ray needs Ray, which is not installed here ({e}); install the cluster extra: "
                             "pip install 'gdn-fuzz[cluster]' (every node of the cluster needs it too)") from None
    return ray


class _CampaignActor:
    """One fleet worker in a Ray actor (made a Ray actor class by RayBackend: ray.remote(...))."""

    def __init__(self):
        self._camp = None
        self._stop = False
        self._known: dict = {}
        self._lock = threading.Lock()

    def run(self, spec_dict: dict):
        """Run the worker in a thread; yield its events in batches (a streaming generator)."""
        spec = WorkerSpec.from_dict(spec_dict)
        q: queue.Queue = queue.Queue()

        def emit(ev: dict) -> None:
            if ev.get("kind") in SYNC_KINDS:
                handed = threading.Event()
                q.put((ev, handed))
                handed.wait(HANDOFF_WAIT_S)
            else:
                q.put((ev, None))

        def on_campaign(camp) -> None:
            with self._lock:
                self._camp = camp
                camp.learn(self._known)
                if self._stop:
                    camp.request_stop()

        def body() -> None:
            try:
                run_worker(spec, emit, on_campaign=on_campaign)
            except BaseException as e:  # noqa: BLE001 - told to the driver, which says it
                q.put((dict(kind="error", message=f"the worker raised {type(e).__name__}: {e}"), None))
            finally:
                q.put(None)

        threading.Thread(target=body, daemon=True, name=f"gdn_fuzz-{spec.label}").start()
        end = False
        while not end:
            items = [q.get()]
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            end = None in items
            items = [x for x in items if x is not None]
            if items:
                yield [ev for ev, _ in items]
            for _, handed in items:
                if handed is not None:
                    handed.set()

    def tell(self, msg: dict) -> None:
        with self._lock:
            if msg.get("known"):
                self._known.update(msg["known"])
                if self._camp is not None:
                    self._camp.learn(msg["known"])
            if msg.get("stop"):
                self._stop = True
                if self._camp is not None:
                    self._camp.request_stop()

    def where(self) -> dict:
        import ray

        return dict(pid=os.getpid(), node=ray.get_runtime_context().get_node_id(), gpus=ray.get_gpu_ids())


class RayBackend:
    """Workers as Ray actors (module doc)."""

    name = "ray"

    def __init__(self, ray, *, num_gpus: float = 0.0, num_cpus: float = 1.0, env: dict | None = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.ray = ray
        self.actor_cls = ray.remote(max_concurrency=4)(_CampaignActor)
        self.options = dict(num_gpus=num_gpus, num_cpus=num_cpus, max_restarts=0,
                            runtime_env=dict(env_vars=dict(env or {})))
        self.actors: dict = {}
        self.start_timeout_s = start_timeout_s
        self._threads: list[threading.Thread] = []

    def start(self, spec: WorkerSpec, events) -> None:
        actor = self.actor_cls.options(**self.options).remote()
        self.actors[spec.label] = actor
        gen = actor.run.options(num_returns="streaming").remote(spec.to_dict())
        t = threading.Thread(target=self._read, args=(gen, spec.label, spec.attempt, events), daemon=True,
                             name=f"gdn_fuzz-events-{spec.label}")
        t.start()
        self._threads.append(t)

    def _read(self, gen, label: str, attempt: int, events) -> None:
        cause, failed = None, False
        started = time.monotonic()
        first = True
        try:
            while True:
                if first:  # an actor Ray cannot place sends nothing: give up after start_timeout_s
                    ready, _ = self.ray.wait([gen], timeout=self.start_timeout_s)
                    if not ready:
                        cause = (f"the actor sent nothing in {time.monotonic() - started:.0f} s (the cluster may have no "
                                 f"free {'GPU' if self.options['num_gpus'] else 'CPU'} for it, or a node cannot import "
                                 "gdn_fuzz); given up")
                        failed = True
                        self.kill(label)
                        break
                    first = False
                try:
                    ref = next(gen)
                except StopIteration:
                    break
                for ev in self.ray.get(ref):
                    events.put((label, attempt, ev))
        except self.ray.exceptions.RayError as e:  # the actor died, its node was lost
            cause = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
        events.put((label, attempt, dict(kind="exit", code=None, cause=cause, failed=failed)))

    def tell(self, label: str, msg: dict) -> None:
        a = self.actors.get(label)
        if a is not None:
            a.tell.remote(msg)

    def stop(self, label: str) -> None:
        self.tell(label, {"stop": True})

    terminate = stop

    def kill(self, label: str) -> None:
        a = self.actors.get(label)
        if a is not None:
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def close(self) -> None:
        deadline = time.monotonic() + TERM_GRACE_S
        for t in self._threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        for label in list(self.actors):
            self.kill(label)


PROBE_TIMEOUT_S = 3.0  # a head that does not accept a TCP connection in this long is not there


def _bootstrap_address(how: str) -> str | None:
    """The HOST:PORT ray.init would dial for --ray `how` (None: a new local cluster, or not known here).
    auto: $RAY_ADDRESS, else the address `ray start --head` left in /tmp/ray/ray_current_cluster (where
    Ray's own lookup finds it)."""
    if how == "local":
        return None
    if how == "auto":
        env = os.environ.get("RAY_ADDRESS", "").strip()
        if env and env != "auto":
            return env
        f = os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")
        try:
            return open(f).read().strip() or None
        except OSError:
            return None  # Ray says "no running instance" at once
    return how


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why `address` ([ray://]HOST:PORT) cannot be a running head, or None when its port answers.
    ray.init retries an absent head for minutes (13 min 46 s seen on this repository's CI machine with
    Ray 2.60: docs/fleet.md), so the driver asks the port first."""
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None  # not HOST:PORT: ray.init says what is wrong with it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        return f"{host}:{port} does not answer ({e.strerror or e})"
    return None


def _token_auth(how: str) -> None:
    """Ray 2.60's `ray start` turns token authentication on when a token is at hand ($RAY_AUTH_TOKEN,
    $RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token, which `ray get-auth-token --generate` writes; without one
    it warns that authentication is off), while a driver that connects with ray.init(address=...) runs
    with RAY_AUTH_MODE 'disabled' and sends no token: the head answers InvalidAuthToken (seen here, a
    cluster of this host's own `ray start`).  So when the user has not set RAY_AUTH_MODE and such a token
    is at hand, the driver sends it ('token'); a head without authentication accepts such a driver too
    (checked with Ray 2.60).  Ray reads the setting when it is imported: call this first."""
    if how == "local" or "RAY_AUTH_MODE" in os.environ:
        return
    if (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
            or os.path.isfile(os.path.expanduser("~/.ray/auth_token"))):
        os.environ["RAY_AUTH_MODE"] = "token"


def connect(ray, how: str) -> dict:
    """ray.init for --ray `how`; returns what the run record says of the cluster.  RayUnavailable
    when no cluster can be reached."""
    kw = dict(log_to_driver=False, logging_level="WARNING", namespace="gdn_fuzz")
    address = {"auto": "auto", "local": "local"}.get(how, how)
    if address == "local":
        kw.update(include_dashboard=False)
    target = _bootstrap_address(how)
    why = None if target is None else probe(target)
    try:
        if why is not None:
            raise ConnectionError(why)
        ctx = ray.init(address=address, **kw)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ("start one with `ray start --head` (and `ray start --address HEAD:6379` on the other hosts), set "
                "RAY_ADDRESS, or use --ray local for a cluster of this host alone" if how == "auto" else
                "check the address (HOST:PORT of the head, or ray://HOST:10001) and that the cluster runs")
        cause = e.__cause__ or e.__context__
        if "InvalidAuthToken" in f"{e} {cause}":
            hint = ("the head wants a token: put the cluster's token in $RAY_AUTH_TOKEN or ~/.ray/auth_token "
                    "(`ray get-auth-token` on the head prints it)")
        raise RayUnavailable(f"--ray {how}: no Ray cluster reached ({first}); {hint}") from None
    res = ray.cluster_resources()
    nodes = [dict(host=n.get("NodeManagerHostname"), address=n.get("NodeManagerAddress"),
                  cpus=n.get("Resources", {}).get("CPU", 0), gpus=n.get("Resources", {}).get("GPU", 0))
             for n in ray.nodes() if n.get("Alive")]
    return dict(how=how, address=(getattr(ctx, "address_info", None) or {}).get("gcs_address"),
                started_here=address == "local", cpus=res.get("CPU", 0), gpus=res.get("GPU", 0),
                nodes=nodes, ray_version=ray.__version__)


@contextlib.contextmanager
def head_node(num_cpus: int, num_gpus: int | None = None, log_path=None, start_timeout_s: float = 120.0,
              env: dict | None = None):
    """A real single-node Ray cluster on this host for the duration of the block: yields its address
    (127.0.0.1:PORT).  `ray start --head --block` in its own process group (no dashboard, no usage
    stats, a 100 MiB object store), stopped with SIGTERM (it drains the node and ends its processes),
    SIGKILL of the group after 60 s.  For tests, benchmarks and one-host GPU runs (tools/h200_fleet.sh);
    a fleet's cluster is the user's own `ray start`.  `env`: the environment of `ray start` (default
    this process's; a HOME holding ~/.ray/auth_token gives a cluster with token authentication)."""
    import signal
    import subprocess
    import sys

    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this interpreter's Ray
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    log_path = log_path or tempfile.mktemp(prefix="gdn_fuzz_ray_start-", suffix=".log")
    argv = [*ray_cli, "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1",
            "--num-cpus", str(num_cpus), "--include-dashboard", "false", "--disable-usage-stats",
            "--object-store-memory", str(100 * 2**20)]
    if num_gpus is not None:
        argv += ["--num-gpus", str(num_gpus)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + start_timeout_s
        while "Ray runtime started" not in open(log_path).read():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RayUnavailable(f"ray start did not come up (exit {proc.poll()}); its log {log_path} ends: "
                                     + open(log_path).read()[-2000:])
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_share(cluster: dict, n: int, device: str) -> tuple[float, int]:
    """(num_cpus each actor asks Ray for, its torch threads): the CPUs of a node split between the actors
    placed on it, the smallest share over the nodes (one value for every actor).  On CUDA the actors of a
    node are its GPUs' (the GPUs place them); on a CPU device n actors spread over the nodes.  A share
    below one CPU is asked for as a fraction (Ray places it) and runs one torch thread.

    Why: the campaign is bound by host CPU, and torch threads beyond the cores slow every check.  With
    one logical CPU per actor and threads from the cluster's CPU count, a 2-core machine's cluster of 4
    logical CPUs ran 1 actor at 9.1 and 2 actors at 6.4 checked examples/s against 14.7 and 20.1 for
    one and two processes (docs/fleet.md)."""
    nodes = cluster.get("nodes") or [dict(cpus=cluster.get("cpus", 1), gpus=cluster.get("gpus", 0))]
    shares = []
    for x in nodes:
        cpus = float(x.get("cpus") or 0)
        if str(device).startswith("cuda"):
            gpus = float(x.get("gpus") or 0)
            if not gpus:
                continue
            here = n * gpus / max(float(cluster.get("gpus") or gpus), 1.0)  # this node's GPUs' actors
        else:
            here = n * cpus / max(float(cluster.get("cpus") or cpus), 1.0)  # spread in proportion to CPUs
        if cpus:
            shares.append(cpus / max(here, 1.0))
    share = min(shares) if shares else 1.0
    num_cpus = share if share < 1 else float(int(share))
    return round(num_cpus, 4), max(1, int(share))


def run_on_ray(args, corpus_dir: str | None, console) -> int:
    """`gdn-fuzz run --ray ...`: the plan over the cluster's GPUs (or CPUs), one fleet, its exit status."""
    try:
        _token_auth(args.ray.strip())  # before Ray is imported: it reads RAY_AUTH_MODE then
        ray = import_ray()
        n_given = parse_processes(getattr(args, "processes", "auto"))
        cluster = connect(ray, args.ray.strip())
    except (RayUnavailable, ValueError) as e:
        console.print(f"gdn-fuzz run: {e}", markup=False, style="red")
        return EXIT_USAGE
    try:
        gpus = int(cluster["gpus"])
        device = args.device or ("cuda" if gpus else "cpu")
        target_name = target_name_of(args.target or ("production" if gpus else "reference"))
        if str(device).startswith("cuda"):
            if not gpus:
                console.print(f"[red]gdn-fuzz run:[/red] --ray {args.ray}: device {device} but the cluster has no GPU "
                              f"(resources: {cluster['cpus']:g} CPUs); use --device cpu or add GPU nodes", markup=True)
                return EXIT_USAGE
            per_gpu = n_given or 1
            n, num_gpus = gpus * per_gpu, 1.0 / per_gpu
            shape = f"{per_gpu} per GPU on {gpus} GPU(s)"
        else:
            n, num_gpus = n_given or max(1, int(cluster["cpus"]) // 2), 0.0
            shape = f"on CPUs ({cluster['cpus']:g} in the cluster)"
        if corpus_dir is not None:
            corpus.clean_stale_temps(corpus_dir)
        known = {} if corpus_dir is None else corpus.known_signatures(target_name, corpus_dir)
        labels = [f"ray{k}" for k in range(n)]
        num_cpus, threads = cpu_share(cluster, n, device)
        threads = getattr(args, "torch_threads", None) or threads
        specs = plan(args, target_name=target_name, device=device, labels=labels, torch_threads=threads, known=known)
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
        backend = RayBackend(ray, num_gpus=num_gpus, num_cpus=num_cpus, env=env)
        title = (f"gdn-fuzz run --ray {args.ray}: {n} campaign actors ({shape}; {len(cluster['nodes'])} node(s)), "
                 f"target {target_name} on {device}, seeds {args.seed}..{args.seed + n - 1}, {threads} torch threads "
                 f"each; {len(known)} known bug signature(s)")
        fleet = Fleet(backend, specs, target_name=target_name, corpus_dir=corpus_dir, console=console,
                      json_path=args.json, record_path=getattr(args, "record", None), known=known,
                      restarts=getattr(args, "restarts", 3), fail_on_known=getattr(args, "fail_on_known", False),
                      title=title, info=dict(gpus=None, device=device, processes_per_device=n_given or 1, ray=cluster))
        return fleet.run()
    finally:
        ray.shutdown()
