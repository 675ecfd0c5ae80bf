"""`swama serve MODEL --ranks N` and `--hostfile FILE`: one model split across ranks.

This process supervises; it serves nothing itself. It starts the ranks, each one `swama serve MODEL`
with the environment mlx.launch gives its ranks (MLX_RANK and the ring host file, or NCCL's
coordinator address): on this machine it sets that environment itself, across hosts it runs
mlx.launch with the host file (which reaches the other hosts over ssh). Each rank joins the group
(`join`): rank 0 loads its shard and serves HTTP, the others load theirs and follow rank 0's steps.

When the group fails (a rank exits, a step outlives --rank-timeout, the ranks disagree) rank 0 ends
the requests in flight with a 503 and exits; this process then stops what is left of the group and
starts it again, which reloads the model, so the server serves again. After --rank-restarts failed
starts in a row (a group that never came up) it gives up and exits, naming the failed rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from swama.engine.client import (
    EXIT_GROUP_FAILED,
    FAILURE_LINE,
    LANGUAGE,
    SERVING_LINE,
    STARTUP_TIMEOUT,
    BadInput,
    GroupFailed,
    env_of,
    follow_group,
    gpu_count,
    group_backend,
    join_group,
    model_files,
    split_of,
)
from swama.handlers.http.settings import ServerSettings

# Options about how the server scales are the supervisor's; the ranks get every other one.
SCALE_FIELDS = {"ranks", "hostfile", "rank_restarts", "replicas", "ray_address", "min_replicas", "max_replicas",
                "default_model", "group_restarts", "group_last_failure", "group_notice"}
STOP_SECONDS = 10.0  # how long a rank may take to stop before it is killed
# The supervisor's pid, in the environment of each rank it starts itself (`--ranks`).
SUPERVISOR_ENV = "SWAMA_RANK_SUPERVISOR"
# What NCCL runs with unless the environment says otherwise. NVLink multicast (NVLS) buys nothing for
# the small all-sums of decoding, reserves GPU memory of its own, and on hosts whose GPUs are shared
# a fault in it can take them all down: it is off unless asked for (NCCL_NVLS_ENABLE=1).
NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0"}


# -- a rank: join the group, then serve HTTP (rank 0) or follow ----------------------------------

def join_as_rank(settings: ServerSettings) -> int | None:
    """In a process that mlx.launch (or `serve_ranks`) started as a rank: join the group. Returns
    None on rank 0, which goes on to serve HTTP; on the other ranks it follows rank 0 and returns
    the exit status only when the group ends."""
    _die_with_supervisor()
    backend = group_backend(settings.rank_backend)
    try:
        group = join_group(backend, settings.rank_timeout, STARTUP_TIMEOUT, restarts=settings.group_restarts or 0,
                           last_failure=settings.group_last_failure)
    except GroupFailed as exc:
        print(f"{FAILURE_LINE}{exc}", file=sys.stderr, flush=True)
        return EXIT_GROUP_FAILED
    if not settings.default_model:
        print("error: a rank needs the model to split: swama serve MODEL", file=sys.stderr)
        return 2
    group.model_id = model_files(settings).get(settings.default_model).id
    if group.rank != 0:
        follow_group(settings, group.model_id)
        return EXIT_GROUP_FAILED

    def notified(signum: int, frame: object) -> None:  # the supervisor saw another rank exit
        notice = settings.group_notice
        try:
            reason = notice.read_text().strip() if notice else ""
        except OSError:
            reason = ""
        group.fail(reason or "another rank of the group exited")

    signal.signal(signal.SIGUSR1, notified)
    return None


def _die_with_supervisor() -> None:
    """A rank the supervisor started goes when the supervisor goes, however it ends (SIGKILL, the OOM
    killer): it stops its ranks only when it is asked to stop, and an orphaned rank 0 would go on
    serving a group that nobody restarts. Linux only (the kernel's parent-death signal)."""
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if supervisor is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(supervisor):  # it was gone before the signal was asked for
        os._exit(EXIT_GROUP_FAILED)


# -- the supervisor --------------------------------------------------------------------------------

@dataclass
class Outcome:
    """How a started group ended."""

    reason: str
    served: bool  # it came up (rank 0's server started) before it ended
    failed_rank: int | None = None


@dataclass
class _Group:
    """One start of the group: its processes (one per rank, or mlx.launch's one) and what they said."""

    processes: list[subprocess.Popen[bytes]]
    ranked: bool  # one process per rank (else mlx.launch's single process)
    notice: Path
    served: threading.Event = field(default_factory=threading.Event)
    failures: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def relay(self, stream: IO[bytes], prefix: str) -> None:
        """Copy a process's output to ours, line by line, noticing start-up and failure lines."""
        def copy() -> None:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace")
                if SERVING_LINE in line:  # rank 0's server started, not only its group
                    self.served.set()
                if FAILURE_LINE in line:
                    self.failures.append(line.split(FAILURE_LINE, 1)[1].strip())
                sys.stderr.write(prefix + line)
                sys.stderr.flush()

        thread = threading.Thread(target=copy, daemon=True)
        thread.start()
        self.readers.append(thread)

    def exited(self) -> list[tuple[int, int]]:
        """(rank, exit status) of the processes that have ended."""
        return [(rank, code) for rank, p in enumerate(self.processes) if (code := p.poll()) is not None]

    def stop(self) -> None:
        """Every process of the group, with what it started (mlx.launch's ranks are its children):
        asked to stop, then killed when slow. Bounded."""
        for p in self.processes:
            _signal_session(p, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_session(p, signal.SIGKILL)  # what is left of its session, also once it has exited
            p.wait(STOP_SECONDS)
        for thread in self.readers:
            thread.join(2)


def _signal_session(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal a process and everything it started: each was started as a session (and process
    group) of its own."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _port_taken(host: str, port: int) -> str | None:
    """Why rank 0 could not listen on host:port (checked before any rank starts), or None."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _hosts(path: Path) -> list[dict[str, object]]:
    """The entries of an mlx.launch host file (a JSON list of {"ssh": ..., "ips": [...]})."""
    try:
        hosts = json.loads(path.expanduser().read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--hostfile {path}: not an mlx.launch host file ({exc})") from None
    if isinstance(hosts, dict):
        hosts = hosts.get("hosts")
    if not isinstance(hosts, list) or len(hosts) < 2 or not all(isinstance(h, dict) and h.get("ssh") for h in hosts):
        raise BadInput(f"--hostfile {path}: expected a JSON list of at least two hosts, each "
                       '{"ssh": "host", "ips": ["address"]}')
    return hosts


def launcher(script: Path) -> list[str]:
    """The command that runs mlx.launch: its console script beside this Python, or, where MLX was
    installed without one (pip --target), its main function (its module has no __main__ to run)."""
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; "
            "sys.argv[0] = 'mlx.launch'; sys.exit(main())"]


def rank_gpus(size: int, visible: str | None, count: int) -> list[str]:
    """The GPU each rank of an NCCL group on this machine takes, as its CUDA_VISIBLE_DEVICES: one
    each, in the order this process sees them (with CUDA_VISIBLE_DEVICES=2,3 the ranks get GPUs 2
    and 3). BadInput when there are fewer GPUs than ranks: NCCL refuses two ranks on one GPU."""
    devices = [d.strip() for d in visible.split(",") if d.strip()] if visible else [str(i) for i in range(count)]
    if len(devices) < size:
        seen = f"CUDA_VISIBLE_DEVICES={visible} leaves {len(devices)}" if visible else f"this machine has {count}"
        raise BadInput(f"--ranks {size} puts each rank on a GPU of its own (NCCL), and {seen} GPU"
                       f"{'' if len(devices) == 1 else 's'}: ask for at most {len(devices)} rank{'' if len(devices) == 1 else 's'}, or split "
                       "across machines with --hostfile")
    return devices[:size]


def rank_environment(settings: ServerSettings, budget: int) -> dict[str, str]:
    """The options every rank runs with, as the environment variables they are read from: the
    supervisor's own are left out; the prompt cache's size is fixed, so every rank's cache (which
    must stay the same as rank 0's) gets the same budget even on hosts with more memory. NCCL's
    defaults (NCCL_DEFAULTS) are added where the environment does not set them."""
    env = {k: v for k, v in NCCL_DEFAULTS.items() if k not in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("SWAMA_")})
    for name in ServerSettings.model_fields:
        value = getattr(settings, name)
        if name not in SCALE_FIELDS and value is not None:
            env[env_of(ServerSettings, name)] = str(value)
    env[env_of(ServerSettings, "prompt_cache_bytes")] = str(budget)
    return env


class Supervisor:
    def __init__(self, settings: ServerSettings, model: str, backend: str, gpus: list[str] | None = None) -> None:
        self.settings = settings
        self.model = model
        self.backend = backend
        self.size = settings.ranks or len(_hosts(settings.hostfile))
        self.gpus = gpus  # each rank's CUDA_VISIBLE_DEVICES (NCCL on this machine)
        self.env = rank_environment(settings, settings.prompt_cache_budget())
        self.command = [sys.executable, "-m", "swama.handlers.cli", "serve", model]
        self.stopping = False  # set by SIGINT or SIGTERM; a plain flag, safe to set in a signal handler
        self.workdir = Path(tempfile.mkdtemp(prefix="swama-ranks-"))

    def start(self, restarts: int, last_failure: str | None) -> _Group:
        notice = self.workdir / "notice"
        notice.unlink(missing_ok=True)
        env = {**self.env, env_of(ServerSettings, "group_restarts"): str(restarts),
               env_of(ServerSettings, "group_notice"): str(notice)}
        if last_failure:
            env[env_of(ServerSettings, "group_last_failure")] = last_failure
        if self.settings.hostfile is not None:
            return self._launch(env, notice)
        return self._spawn(env, notice)

    def _spawn(self, env: dict[str, str], notice: Path) -> _Group:
        """The ranks on this machine, each given the environment mlx.launch would give it."""
        if self.backend == "ring":
            hostfile = self.workdir / "hosts.json"
            hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in _free_ports(self.size)]))
            shared = {"MLX_HOSTFILE": str(hostfile)}
        elif self.backend == "nccl":
            shared = {"NCCL_HOST_IP": "127.0.0.1", "NCCL_PORT": str(_free_ports(1)[0]),
                      "MLX_WORLD_SIZE": str(self.size)}
        else:
            raise BadInput(f"--ranks starts the ring or NCCL backend on this machine; {self.backend} needs "
                           "--hostfile (mlx.launch)")
        processes = []
        for rank in range(self.size):
            rank_env = {**os.environ, **env, **shared, "MLX_RANK": str(rank), SUPERVISOR_ENV: str(os.getpid())}
            if self.gpus is not None:
                rank_env["CUDA_VISIBLE_DEVICES"] = self.gpus[rank]
            processes.append(subprocess.Popen(self.command, env=rank_env, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        group = _Group(processes, ranked=True, notice=notice)
        for rank, p in enumerate(processes):
            group.relay(p.stdout, f"[rank {rank}] ")
        return group

    def _launch(self, env: dict[str, str], notice: Path) -> _Group:
        """The ranks of a host file, through mlx.launch."""
        command = launcher(Path(sys.executable).with_name("mlx.launch"))
        command += ["--hostfile", str(self.settings.hostfile.expanduser()), "--backend", self.backend,
                    "--starting-port", str(_free_ports(1)[0]), "--nccl-port", str(_free_ports(1)[0])]
        for key, value in env.items():
            command += ["--env", f"{key}={value}"]
        process = subprocess.Popen([*command, "--", *self.command], env={**os.environ, **env},
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        group = _Group([process], ranked=False, notice=notice)
        group.relay(process.stdout, "")
        return group

    def watch(self, group: _Group) -> Outcome:
        """Wait until the group ends (or the server is asked to stop); bounded once it has begun to end."""
        while not self.stopping:
            time.sleep(0.2)
            ended = group.exited()
            if not ended:
                continue
            # The rank that ended first for a cause of its own (not because it saw its group fail).
            rank, code = next(((r, c) for r, c in ended if c != EXIT_GROUP_FAILED), ended[0])
            if group.ranked and rank != 0:
                # Rank 0 answers its requests in flight first: tell it now, then give it a bound.
                why = f"rank {rank} (pid {group.processes[rank].pid}) {_exit_words(code)}"
                group.notice.write_text(why)
                if group.processes[0].poll() is None:
                    group.processes[0].send_signal(signal.SIGUSR1)
                _wait_all(group.processes[:1], self.settings.rank_timeout)
                group.stop()
                return Outcome(why, group.served.is_set(), rank)
            _wait_all(group.processes, self.settings.rank_timeout)
            group.stop()
            why = group.failures[0] if group.failures else (
                f"rank 0 {_exit_words(code)}" if group.ranked else f"mlx.launch {_exit_words(code)}")
            return Outcome(why, group.served.is_set(), 0 if group.ranked else None)
        group.stop()
        return Outcome("stopped", group.served.is_set())

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def run(self) -> int:
        restarts, in_a_row, last = 0, 0, None
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stop)
        try:
            while True:
                group = self.start(restarts, last)
                outcome = self.watch(group)
                if self.stopping:
                    return 0
                in_a_row = 0 if outcome.served else in_a_row + 1
                if in_a_row > self.settings.rank_restarts:
                    print(f"error: the rank group failed {in_a_row} times in a row without serving; giving up. "
                          f"Last failure: {outcome.reason}", file=sys.stderr)
                    return 1
                restarts, last = restarts + 1, outcome.reason
                print(f"swama: the rank group failed ({outcome.reason}); restarting it (restart {restarts})",
                      file=sys.stderr, flush=True)
        finally:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)


def _exit_words(code: int) -> str:
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return "exited because its group failed" if code == EXIT_GROUP_FAILED else f"exited with status {code}"


def _wait_all(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in processes:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def serve_ranks(settings: ServerSettings) -> int:
    """Supervise the group that splits MODEL across --ranks N (this machine) or --hostfile (hosts)."""
    if not settings.default_model:
        print("error: --ranks and --hostfile split one model: swama serve MODEL --ranks N", file=sys.stderr)
        return 2
    installed = model_files(settings).get(settings.default_model)
    if installed.kind != LANGUAGE:
        print(f"error: only a language model can be split across ranks; {installed.id} is a {installed.kind} model",
              file=sys.stderr)
        return 2
    if not settings.batching:
        print("error: a model split across ranks is served with batching; leave out --no-batching", file=sys.stderr)
        return 2
    if settings.ranks and (taken := _port_taken(settings.host, settings.port)):
        print(f"error: rank 0 cannot listen on {settings.host}:{settings.port}: {taken}", file=sys.stderr)
        return 2
    backend = group_backend(settings.rank_backend)
    gpus = None  # refused here too, before any rank starts, when there are fewer GPUs than ranks
    if backend == "nccl" and settings.ranks:
        gpus = rank_gpus(settings.ranks, os.environ.get("CUDA_VISIBLE_DEVICES"), gpu_count())
    supervisor = Supervisor(settings, installed.id, backend, gpus)
    split = split_of(installed.path, supervisor.size, backend)  # refused here, before any rank starts
    where = "this machine" if settings.ranks else f"the hosts of {settings.hostfile}"
    print(f"swama: splitting {installed.id} across {supervisor.size} ranks on {where} ({split} parallel, "
          f"{backend} backend); rank 0 serves http://{settings.host}:{settings.port}", file=sys.stderr, flush=True)
    return supervisor.run()
