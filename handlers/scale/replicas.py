"""`swama serve MODEL --replicas N`: N independent copies of the engine behind one endpoint, on Ray Serve.

Serve's HTTP proxy listens on --host/--port and hands every request to the ingress (ingress.py), which
forwards it to one of the engine replicas (replica.py) chosen by the request router (routing.py):
the replica holding the request's prompt-cache prefix, else the least loaded. Ray restarts a replica
whose process dies; --min-replicas/--max-replicas let Serve's autoscaler follow the queue depth.

Without --ray-address a local Ray is started for the server and shut down with it, leaving no process
behind; with it the server joins that cluster and, on exit, removes only its own application.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
from typing import Any

from swama.handlers.http.settings import ServerSettings

APP_NAME = "swama"
# Ray's object store holds nothing large here (requests and chunks travel inline): keep it small.
OBJECT_STORE_BYTES = 128 << 20
# How often Serve checks a replica, and how long a stopping one may finish its requests.
HEALTH_CHECK_SECONDS = 2.0
GRACEFUL_STOP_SECONDS = 5.0


def _replica_counts(settings: ServerSettings) -> tuple[int, int, int]:
    """(initial, least, most) replicas; the same three numbers without autoscaling."""
    if settings.min_replicas is None or settings.max_replicas is None:
        n = settings.replicas or 1
        return n, n, n
    least, most = settings.min_replicas, settings.max_replicas
    initial = min(max(settings.replicas or least, least), most)
    return initial, least, most


# What the BLAS preload (swama's restart at start-up) put in the environment.
BLAS_VARIABLES = ("LD_PRELOAD", "LD_LIBRARY_PATH", "MKL_THREADING_LAYER")


def _replica_env() -> dict[str, str]:
    """The environment replicas start with on any node: swama's process-wide settings (device, dtype,
    BLAS) and, when this process runs on a preloaded BLAS, the same preload, so that replicas on
    nodes installed alike compute as fast (a node without the library ignores it). On one machine
    the replicas inherit all of it anyway."""
    env = {k: v for k, v in os.environ.items() if k.startswith("SWAMA_")}
    if os.environ.get("SWAMA_BLAS_PRELOADED"):
        env.update({k: os.environ[k] for k in BLAS_VARIABLES if k in os.environ})
    return env


def _engine_options(settings: ServerSettings) -> dict[str, Any]:
    from ray.serve.config import RequestRouterConfig

    from swama.handlers.scale.routing import AffinityRouter

    initial, least, most = _replica_counts(settings)
    gpu = _on_gpus()
    gpus = _cluster_gpus() if gpu else 0.0
    share = gpu_share(most, gpus, local=settings.ray_address is None) if gpu else 0
    if 0 < share < 1:
        print(f"swama: {most} replicas share this machine's {gpus:g} GPU{'' if gpus == 1 else 's'}, "
              f"{share:g} of a GPU each", file=sys.stderr, flush=True)
    # A replica's engine admits its batch and its own queue; Serve holds at most one more queue's worth
    # before the ingress answers 429, as one process would.
    options: dict[str, Any] = {
        "name": "engine",
        "max_ongoing_requests": settings.batch_rows + settings.max_queue,
        "max_queued_requests": settings.max_queue,
        "health_check_period_s": HEALTH_CHECK_SECONDS,
        "graceful_shutdown_timeout_s": GRACEFUL_STOP_SECONDS,
        "request_router_config": RequestRouterConfig(
            request_router_class=AffinityRouter, request_router_kwargs={"imbalance": settings.batch_rows}),
        # A GPU each (or a share of one, see gpu_share), or this machine's cores shared out between
        # the most replicas there may be: Ray places replicas by these, and sets a replica's BLAS
        # threads (OMP_NUM_THREADS) to its CPUs.
        "ray_actor_options": {"num_cpus": 0 if gpu else max(1, (os.cpu_count() or 1) // most),
                              "num_gpus": share,
                              "runtime_env": {"env_vars": _replica_env()}},
    }
    if least == most and settings.min_replicas is None:
        options["num_replicas"] = initial
    else:
        # Queue depth: a replica with more requests than one batch holds has some waiting.
        options["autoscaling_config"] = {"min_replicas": least, "max_replicas": most, "initial_replicas": initial,
                                         "target_ongoing_requests": settings.batch_rows}
    return options


def gpu_share(replicas: int, gpus: float, local: bool) -> float:
    """The GPUs one replica reserves: one each where there are enough. On a local Ray with fewer GPUs
    than replicas they share the GPUs out (two replicas on one GPU reserve half each), so that more
    engine processes, each with its own host thread, feed the same device; a cluster given with
    --ray-address keeps one each, since it may add nodes to place them."""
    if not local or gpus >= replicas or gpus <= 0:
        return 1.0
    return math.floor(gpus / replicas * 100) / 100


def _cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


def _on_gpus() -> bool:
    """Whether each replica takes a GPU: --device gpu, or auto where the cluster has GPUs."""
    import ray

    from swama.engine.client import RuntimeSettings, read

    device = read(RuntimeSettings).requested_device
    return device == "gpu" or (device == "auto" and ray.cluster_resources().get("GPU", 0) >= 1)


def application(settings: ServerSettings) -> Any:
    """The Serve application: the ingress bound to the engine deployment."""
    from ray import serve

    from swama.handlers.scale.ingress import Ingress
    from swama.handlers.scale.replica import EngineReplica

    engine = serve.deployment(EngineReplica, **_engine_options(settings)).bind(settings)
    # One ingress, so that one router instance sees every request and its affinity map stays whole.
    ingress = serve.deployment(Ingress, name="ingress", num_replicas=1,
                               max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0})
    return ingress.bind(engine, settings.api_key)


def _port_free(host: str, port: int) -> bool:
    try:
        with socket.create_server((host, port)):
            return True
    except OSError:
        return False


def _start_ray(settings: ServerSettings) -> None:
    import logging

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
    quiet = logging.DEBUG if settings.log_level == "debug" else logging.WARNING
    logging.getLogger("ray.serve").setLevel(quiet)  # swama prints its own start-up line
    if settings.ray_address is not None:
        ray.init(address=settings.ray_address, logging_level=quiet)
        return
    _, _, most = _replica_counts(settings)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, most), include_dashboard=False,
             object_store_memory=OBJECT_STORE_BYTES, logging_level=quiet)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the server as Ctrl-C does, at start-up too


def _on_stop_signals(handler: Any) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def _describe(settings: ServerSettings) -> tuple[str, str]:
    """How many replicas, and where they run, in words."""
    initial, least, most = _replica_counts(settings)
    count = f"{initial} replica{'' if initial == 1 else 's'}"
    if settings.min_replicas is not None:
        count += f" (autoscaled {least}-{most})"
    if settings.ray_address is None:
        return count, "a local Ray started for this server"
    return count, f"the Ray cluster at {settings.ray_address}"


def serve_replicas(settings: ServerSettings) -> int:
    """Serve until SIGINT or SIGTERM, then stop Serve and Ray (or leave the cluster); the exit status."""
    try:
        from ray import serve
    except ImportError:
        print("error: --replicas runs on Ray Serve, which is not installed: pip install 'swama[scale]'",
              file=sys.stderr)
        return 2
    local = settings.ray_address is None
    if local and not _port_free(settings.host, settings.port):
        print(f"error: port {settings.port} on {settings.host} is in use", file=sys.stderr)
        return 1
    count, where = _describe(settings)
    print(f"swama: starting {count} on {where}", file=sys.stderr, flush=True)
    status, serve_was_running, deployed = 0, False, False
    _on_stop_signals(_interrupt)
    try:
        _start_ray(settings)
        _on_stop_signals(_interrupt)  # ray.init puts its own SIGTERM handler (an exit) in place
        running = serve.status()
        serve_was_running = bool(running.proxies or running.applications)
        if APP_NAME in running.applications:
            print(f"error: a swama application already runs on {where}; stop it first", file=sys.stderr)
            return 1
        if serve_was_running:
            print("note: Ray Serve already runs on this cluster, so the HTTP host and port it was started "
                  "with apply", file=sys.stderr)
        log_config = {"log_level": settings.log_level.upper(), "enable_access_log": False}
        serve.start(http_options={"host": settings.host, "port": settings.port}, proxy_location="EveryNode",
                    logging_config=log_config)
        deployed = True
        serve.run(application(settings), name=APP_NAME, route_prefix="/", logging_config=log_config)
        print(f"swama listening on http://{settings.host}:{settings.port}  ({count} on {where}; models: "
              f"{settings.models_root})", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # a replica that cannot start, a cluster that cannot be reached
        print(f"error: the replicas did not start: {exc}", file=sys.stderr)
        status = 1
    finally:
        _stop(local, deployed, serve_was_running)
    return status


def _stop(local: bool, deployed: bool, serve_was_running: bool) -> None:
    """Stop Serve and the local Ray; on a cluster remove this server's application, and Serve too when
    this server started it and nothing else runs on it (so no proxy stays on the port)."""
    import ray
    from ray import serve

    # A second Ctrl-C while stopping would leave Ray's processes behind: stopping runs to its end.
    _on_stop_signals(signal.SIG_IGN)
    try:
        if ray.is_initialized():
            print("swama: stopping the replicas", file=sys.stderr, flush=True)
            if local:
                serve.shutdown()
            elif deployed:
                serve.delete(APP_NAME)
                if not serve_was_running and not serve.status().applications:
                    serve.shutdown()
    finally:
        ray.shutdown()  # also when start-up was cut short: it stops whatever Ray processes it started
