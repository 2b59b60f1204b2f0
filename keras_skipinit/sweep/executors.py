"""Where a sweep's runs execute: in the sweep's own process, one at a time
(the default, no dependency), in child processes of this machine, several
at once (a GPU or many cores shared by small runs), or as Ray tasks on a
local Ray instance or a cluster (`pip install -e ".[ray]"`).

The sweep (`keras_skipinit.sweep`) decides every run and writes every result;
an executor only runs `trainer.Config`s and hands back what each run
returned. Its interface: `capacity` (how many runs it takes at once),
`submit(ident, config)`, `wait()` -> (ident, outcome) for the next run to
finish, `in_flight()` -> (running, queued), `close()`.
"""

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time

from keras_skipinit import machine
from keras_skipinit.cli import startup


class RunFailed(RuntimeError):
    """A run that raised, or whose worker died more often than it may be
    retried; `ident` names the run (the sweep words the message)."""

    def __init__(self, ident, reason):
        super().__init__(reason)
        self.ident = ident


def execute(config):
    """Trains one run here; returns what the sweep records: the results dict,
    the per-epoch validation curve and the machine that ran it."""
    from keras_skipinit import machine  # Runs one after another in a process trace new functions each time: TensorFlow's retracing advice, which a
    from keras_skipinit.cli import parsing
    from keras_skipinit.training import run_dir, trainer
    # sweep has no use for, came between its lines (issue 91).
    with parsing.dropped_log_messages("triggered tf.function retracing", logger="tensorflow"):
        result = trainer.train(config)
    return {"result": result, "curve": run_dir.history_column(config.model_dir, "val_top1"),
            "machine": machine.describe()}


class Sequential:
    """Each run in this process, one after the other (the sweep re-plans
    after every run, so the order is the protocol's order)."""

    capacity = 1

    def __init__(self):
        self._queue = []

    def submit(self, ident, config):
        self._queue.append((ident, config))

    def wait(self):
        import keras

        ident, config = self._queue.pop(0)
        keras.backend.clear_session()
        return ident, execute(config)

    def in_flight(self):
        return len(self._queue), 0

    def close(self):
        pass


def _child(config, conn):
    """A child process's one run: its own process group first (a Ctrl-C or
    `timeout` signals the sweep's process, which passes it on once: a second
    would end the run unsaved), then the run; the outcome goes back on `conn`."""
    if hasattr(os, "setpgid"):  # POSIX
        os.setpgid(0, 0)
    startup.quiet_start()  # as our commands start: without TensorFlow's start-up lines
    try:
        outcome = ("ok", execute(config))
    except ValueError as e:  # a bad setting: the sweep's one-line error
        outcome = ("value", str(e))
    except BaseException as e:  # noqa: B036 - reported to the sweep, which stops
        outcome = ("failed", f"{type(e).__name__}: {e}")
    conn.send(outcome)
    conn.close()


@contextlib.contextmanager
def _environ(values):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def share(cores, in_use, starting):
    """TensorFlow threads for each of `starting` runs that start together
    while runs using `in_use` threads go on: the free cores split among them
    (at least 1). A thread pool is fixed at a process's start, so a run
    started alone (a resumed sweep's last run) gets every core, one started
    beside another keeps its half."""
    return max(1, (cores - in_use) // starting)


THREADS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")  # TensorFlow's two pools, as the environment sets them


def run_threads(inter_op):
    """A run's TensorFlow thread pools outside this process (processes,
    Ray): intra-op threads as a run here has (`machine.intra_op_threads`:
    they change its numbers, so every executor gives the same and a sweep's
    runs equal the sequential sweep's, issue 89.4); inter-op threads, which
    only order independent ops, `inter_op` (its share of the cores).
    TF_NUM_INTEROP_THREADS set by the user wins."""
    intra, inter = THREADS
    return {intra: str(machine.intra_op_threads()), inter: os.environ.get(inter) or str(inter_op)}


class Processes:
    """Each run in a fresh child process of this machine, `processes` at
    once (spawned: no TensorFlow or Keras state carries over, a GPU's memory
    is freed). For small runs that leave a GPU or many cores idle alone: the
    children share the GPU (JAX: XLA_PYTHON_CLIENT_PREALLOCATE=false unless
    set) and split the cores (TensorFlow's inter-op pool: the cores the
    running children leave free, split among the runs starting together,
    `share`; its intra-op pool as a run in this process has, `run_threads`). Runs submitted together
    start at the next `wait()`. SIGINT or SIGTERM to the sweep is
    passed on to each child, whose run checkpoints and stops (the same
    command resumes it); a second ends the sweep at once (`callbacks.Interrupt`)."""

    def __init__(self, processes=2):
        if processes < 1:
            raise ValueError(f"--processes must be at least 1, got {processes}")
        self.capacity = processes
        self._context = multiprocessing.get_context("spawn")
        self._running = {}  # ident -> (process, the end of its pipe we read, its TensorFlow threads)
        self._submitted = []  # (ident, config): started together at the next wait()
        self._unstarted = []  # runs submitted after a signal
        defaults = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        self._env = {name: os.environ.get(name, value) for name, value in defaults.items()}  # the user's win
        from keras_skipinit.training import callbacks  # the runs' own signal handling: once, a repeat within a second ignored

        self._interrupt = callbacks.Interrupt(on_signal=self._pass_on).__enter__()

    @property
    def signal(self):
        return self._interrupt.signal

    def _pass_on(self, signum):
        for process, _, _ in self._running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)

    def submit(self, ident, config):
        self._submitted.append((ident, config))

    def _start_submitted(self):
        submitted, self._submitted = self._submitted, []
        if self.signal:  # stopping: nothing new starts; the sweep hears it as interrupted
            self._unstarted += [ident for ident, _ in submitted]
            return
        threads = share(machine.cpu_count(), sum(n for _, _, n in self._running.values()), len(submitted) or 1)
        env = {**self._env, **run_threads(threads)}
        for ident, config in submitted:
            read, write = self._context.Pipe(duplex=False)
            process = self._context.Process(target=_child, args=(config, write), name=f"sweep run {ident}")
            with _environ(env):
                process.start()
            write.close()
            self._running[ident] = (process, read, threads)

    def wait(self):
        self._start_submitted()
        if self._unstarted:
            return self._unstarted.pop(0), {"result": {"status": "interrupted", "signal": self.signal}}
        readers = {read: ident for ident, (_, read, _) in self._running.items()}
        ready = multiprocessing.connection.wait(list(readers))[0]
        ident = readers[ready]
        process, _, _ = self._running.pop(ident)
        try:
            status, outcome = ready.recv()
        except EOFError:  # the child died without a word
            status, outcome = "died", None
        process.join()
        if status == "died":
            why = " (SIGKILL: out of memory?)" if process.exitcode == -signal.SIGKILL else ""
            outcome = (f"its process died (exit code {process.exitcode}{why}); rerun the sweep to resume it from its "
                       "last checkpoint")
        if status == "ok":
            return ident, outcome
        if self.signal:  # stopped by our signal before it could report: nothing to record
            return ident, {"result": {"status": "interrupted", "signal": self.signal}}
        if status == "value":
            raise ValueError(outcome)
        raise RunFailed(ident, f"failed in its process: {outcome}" if status == "failed" else outcome)

    def in_flight(self):
        return len(self._running), len(self._submitted)

    def close(self):
        """Stops the runs still in flight (SIGTERM: each checkpoints) and waits for them."""
        self._interrupt.__exit__()
        self._submitted = []
        for process, read, _ in self._running.values():
            if not self.signal:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
            process.join()
            read.close()
        self._running = {}


# Another process may still hold a run's model_dir for a moment after its
# driver died (Ray reaps a dead job's workers asynchronously): a retried run
# waits for the lock this long before it gives up.
LOCK_WAIT_S = 300


def _ray_run(config, env):
    """A Ray task: one run in a fresh worker process (max_calls=1, so no
    TensorFlow or Keras state carries over and GPU memory is freed)."""
    os.environ.update(env)
    startup.quiet_start()  # as our commands start: without TensorFlow's start-up lines
    from keras_skipinit.training import run_dir
    deadline = time.time() + LOCK_WAIT_S
    while True:
        try:
            return execute(config)
        except run_dir.ModelDirInUse:
            if time.time() > deadline:
                raise
            time.sleep(5)


RAY_CONNECT_TIMEOUT_S = 60
RAY_TOKEN_FILE = os.path.join("~", ".ray", "auth_token")  # Ray's default token path


def _token_at_hand():
    """Whether this machine has a Ray token where Ray looks for one
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)."""
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or os.path.isfile(os.path.expanduser(RAY_TOKEN_FILE)))


def _connect(ray, address):
    """ray.init for the sweep. Ray 2.59+ turns token authentication on for
    `ray start --head` wherever a token exists (and a driver that finds that
    cluster by "auto" follows), but a driver given an address never turns it
    on: it was refused ("InvalidAuthToken" a second for 20 s, then a
    traceback; issue 89.3). With RAY_AUTH_MODE unset and a token at hand,
    the driver turns it on as the head did; a refusal is one line saying
    what the cluster needs."""
    named = address or os.environ.get("RAY_ADDRESS")
    explicit = named not in (None, "auto", "local") and not str(named).startswith("ray://")
    if explicit and "RAY_AUTH_MODE" not in os.environ and _token_at_hand():
        os.environ["RAY_AUTH_MODE"] = "token"
        try:  # Ray reads its settings once, at import: as `ray start` does, re-read them
            from ray._raylet import Config

            Config.initialize("")
        except (ImportError, AttributeError):
            pass
    if not explicit:
        ray.init(address=address, include_dashboard=False, log_to_driver=True, configure_logging=False)
        return
    with startup.filtered_stderr(lambda line: "InvalidAuthToken" in line):  # Ray's C++ retries, one a second
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=True, configure_logging=False)
            return
        except ConnectionError:
            pass
    mode = os.environ.get("RAY_AUTH_MODE", "unset")
    raise ValueError(
        f"could not connect to the Ray cluster at {named} (RAY_AUTH_MODE={mode}); a cluster with token authentication "
        "(Ray 2.59+ turns it on where `ray start --head` finds a token) needs its token here, in ~/.ray/auth_token or "
        "RAY_AUTH_TOKEN (on the head: ray get-auth-token), with RAY_AUTH_MODE unset or token")


def _check_reachable(address):
    """A host:port cluster address that nothing answers at is a one-line
    ValueError within RAY_CONNECT_TIMEOUT_S (ray.init retries it without
    end); 'auto', 'local', ray:// addresses and None are left to Ray."""
    if not address or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray_address must be host:port, 'auto' or 'local', got {address!r}")
    try:
        machine.wait_for_port(address, RAY_CONNECT_TIMEOUT_S)
    except OSError as e:
        raise ValueError(f"no Ray cluster answers at {address} ({e.strerror or e}) after "
                         f"{RAY_CONNECT_TIMEOUT_S} s: start one (ray start --head), or leave "
                         "--ray_address and RAY_ADDRESS unset for a local instance") from None


class Ray:
    """Each run a Ray task with its own resources (`cpus_per_run`,
    `gpus_per_run`): Ray queues what the cluster cannot run yet. A task whose
    worker dies (kill -9, a lost node) is retried up to `max_retries` times
    and resumes from the checkpoint in its model_dir, so model_dirs must be on
    storage every node reads and writes. Runs see the driver's KERAS_BACKEND
    (and TF_CPP_MIN_LOG_LEVEL); TensorFlow's inter-op pool is sized to
    `cpus_per_run`, its intra-op pool as the driver's (`run_threads`)."""

    capacity = sys.maxsize

    def __init__(self, address=None, cpus_per_run=1, gpus_per_run=0, max_retries=3):
        try:
            import ray
        except ImportError:
            raise ValueError("--executor=ray needs Ray: pip install -e \".[ray]\"") from None
        self._ray = ray
        if not ray.is_initialized():
            _check_reachable(address or os.environ.get("RAY_ADDRESS"))
            _connect(ray, address)
        self._need = {"CPU": cpus_per_run, "GPU": gpus_per_run}
        if not self.slots():
            total = self._ray.cluster_resources()
            have = ", ".join(f"{total.get(name, 0):g} {name}" for name in self._need)
            ask = ", ".join(f"{amount:g} {name}" for name, amount in self._need.items())
            self.close()
            raise ValueError(f"the Ray cluster has {have}; a run asks for {ask} (--cpus_per_run, --gpus_per_run) "
                             "and would wait forever: ask for less, or add nodes")
        env = {name: os.environ[name] for name in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL") if name in os.environ}
        if not startup.log_level_is_users():  # the user's own level travels; the driver's quiet start's does not
            env.pop("TF_CPP_MIN_LOG_LEVEL", None)
        env.update(run_threads(max(1, int(cpus_per_run))))
        self._env = env
        # In the worker's environment from its start (it imports the package, and TensorFlow, to unpickle the task).
        self._task = ray.remote(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_calls=1, max_retries=max_retries,
                                retry_exceptions=False, runtime_env={"env_vars": env})(_ray_run)
        self._refs = {}
        self.max_retries = max_retries

    def submit(self, ident, config):
        self._refs[self._task.remote(config, self._env)] = ident

    def wait(self):
        ray = self._ray
        ready, _ = ray.wait(list(self._refs), num_returns=1)
        ident = self._refs.pop(ready[0])
        try:
            return ident, ray.get(ready[0])
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            if isinstance(cause, ValueError):
                raise cause from None  # a bad setting: the sweep's one-line error
            raise RunFailed(ident, f"failed in its Ray worker: {e}") from None
        except ray.exceptions.RayError as e:
            raise RunFailed(ident, f"its worker died {self.max_retries + 1} times ({type(e).__name__}); "
                                   "rerun the sweep to resume it") from None

    def slots(self):
        """How many runs the cluster can hold at once (its resources over a run's)."""
        total = self._ray.cluster_resources()
        fits = [int(total.get(name, 0) // amount) for name, amount in self._need.items() if amount]
        return min(fits) if fits else len(self._refs)

    def in_flight(self):
        running = min(len(self._refs), self.slots())
        return running, len(self._refs) - running

    def close(self):
        """Disconnects; stops the local Ray instance if this process started one
        (a cluster's runs of this driver are cancelled: rerun to resume)."""
        if self._ray.is_initialized():
            self._ray.shutdown()


def make(name, **options):
    if name == "sequential":
        return Sequential()
    if name == "processes":
        return Processes(**options)
    if name == "ray":
        return Ray(**options)
    raise ValueError(f"unknown executor {name!r}; choose sequential, processes or ray")
