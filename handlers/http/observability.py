"""GET /metrics (Prometheus text), GET /health, and one access-log line per request with its id.

These are operational endpoints beside the API: they are not part of any pinned OpenAPI document.
Every response carries `x-request-id` (the client's own, when it sent a sane one), and the access
log line names it, so a client's report can be matched with the server's log.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from swama.engine.client import EngineClient, Finished

access_log = logging.getLogger("swama.access")
REQUEST_ID = "x-request-id"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Seconds; generation on a CPU runs from tens of milliseconds per token to seconds to the first one.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class Metrics:
    """The server's metrics, in a registry of its own (one per app)."""

    def __init__(self, engine: EngineClient) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("swama_requests", "HTTP requests answered, by route and status",
                                ["method", "route", "status"], registry=r)
        self.prompt_tokens = Counter("swama_prompt_tokens", "Prompt tokens of finished generations", ["model"],
                                     registry=r)
        self.generated_tokens = Counter("swama_generated_tokens", "Tokens generated", ["model"], registry=r)
        self.ttft = Histogram("swama_time_to_first_token_seconds", "Prefill time of a generation, to its first "
                              "token", ["model"], buckets=TTFT_BUCKETS, registry=r)
        self.per_token = Histogram("swama_time_per_output_token_seconds", "Mean decode time per token of a "
                                   "generation", ["model"], buckets=TOKEN_BUCKETS, registry=r)
        self.decision_questions = Counter("swama_decision_questions", "Decision questions scored", ["model"],
                                          registry=r)
        self.prompt_cache_hits = Counter("swama_prompt_cache_hit_tokens", "Prompt tokens served from a cache "
                                         "(chat prompts resumed, decision prefixes shared across questions)", ["model"], registry=r)
        self.accepted_draft_tokens = Counter("swama_accepted_draft_tokens", "Generated tokens of finished generations "
                                             "that speculative decoding drafted and the model accepted", ["model"],
                                             registry=r)
        waiting = Gauge("swama_queue_waiting", "Requests admitted and waiting for their model", registry=r)
        waiting.set_function(lambda: engine.status().waiting)
        running = Gauge("swama_running", "Operations running on a model now", registry=r)
        running.set_function(lambda: engine.status().running)
        loaded = Gauge("swama_models_loaded", "Models in memory", registry=r)
        loaded.set_function(lambda: len(engine.status().models_loaded))
        active = Gauge("swama_mlx_active_bytes", "Memory held by live arrays", registry=r)
        active.set_function(lambda: engine.status().active_memory)
        cache = Gauge("swama_mlx_cache_bytes", "Memory kept by MLX's buffer cache for reuse", registry=r)
        cache.set_function(lambda: engine.status().cache_memory)
        kv = Gauge("swama_kv_cache_bytes", "Key/value state held by batch rows and prompt caches", registry=r)
        kv.set_function(lambda: engine.status().kv_cache_bytes)
        kv_usage = Gauge("swama_kv_cache_usage", "Key/value state held, as a share of the prompt caches' budget "
                         "(0 to 1)", registry=r)
        kv_usage.set_function(lambda: engine.status().kv_cache_usage)
        # The same gauges under the names Kubernetes inference gateways read from vLLM servers.
        for name, text, read in (
                ("vllm:num_requests_waiting", "Requests waiting for their model", lambda: engine.status().waiting),
                ("vllm:num_requests_running", "Requests running on a model", lambda: engine.status().running),
                ("vllm:kv_cache_usage_perc", "Key/value cache usage (0 to 1)",
                 lambda: engine.status().kv_cache_usage)):
            Gauge(name, text, registry=r).set_function(read)
        r.register(_RankCollector(engine))
        r.register(_SpeculationCollector(engine))
        r.register(_PromptCacheCollector(engine))
        r.register(_SchedulerCollector(engine))
        r.register(_KVCollector(engine))

    def watch_batches(self, source: Callable[[], dict[str, int]]) -> None:
        """Export the lines of batch jobs by state, read from `source` (the batch runner's `line_counts`:
        "queued", "running" and "finished") at each scrape. Called once, when the app has a runner; the
        gauges are not exported before."""
        for state, text in (("queued", "Lines of batch jobs waiting to be answered"),
                            ("running", "Lines of batch jobs being answered now"),
                            ("finished", "Lines of batch jobs answered or failed")):
            gauge = Gauge(f"swama_batch_lines_{state}", text, registry=self.registry)
            gauge.set_function(lambda state=state: source()[state])

    def generation_finished(self, model: str, done: Finished) -> None:
        self.prompt_tokens.labels(model).inc(done.prompt_tokens)
        self.generated_tokens.labels(model).inc(done.completion_tokens)
        self.ttft.labels(model).observe(done.prompt_seconds)
        if done.cached_tokens:
            self.prompt_cache_hits.labels(model).inc(done.cached_tokens)
        if done.draft_tokens:
            self.accepted_draft_tokens.labels(model).inc(done.draft_tokens)
        if done.completion_tokens > 1:
            self.per_token.labels(model).observe(done.generation_seconds / (done.completion_tokens - 1))

    def decisions_scored(self, model: str, questions: int, shared_prefix_tokens: int) -> None:
        self.decision_questions.labels(model).inc(questions)
        if questions > 1 and shared_prefix_tokens:
            self.prompt_cache_hits.labels(model).inc(shared_prefix_tokens * (questions - 1))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _RankCollector:
    """The rank group's state, when this process is rank 0 of one (nothing otherwise)."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        group = self.engine.status().ranks
        if group is None:
            return
        yield GaugeMetricFamily("swama_ranks", "Ranks the model is split across", value=group["size"])
        yield GaugeMetricFamily("swama_rank_group_up", "1 while the rank group serves, 0 once it failed",
                                value=1 if group["state"] == "serving" else 0)
        yield CounterMetricFamily("swama_rank_group_restarts", "Times the rank group was restarted after a "
                                  "failure", value=group["restarts"])
        steps = GaugeMetricFamily("swama_rank_steps", "Scheduler steps each rank has taken part in", labels=["rank"])
        memory = GaugeMetricFamily("swama_rank_active_bytes", "Memory held by live arrays on each rank",
                                   labels=["rank"])
        for rank in group["ranks"]:
            steps.add_metric([str(rank["rank"])], rank["steps"])
            memory.add_metric([str(rank["rank"])], rank["active_mib"] << 20)
        yield steps
        yield memory


class _SpeculationCollector:
    """What each drafting model's batch did since it started (models with speculation off have none):
    tokens drafted, and its decode steps by kind. They start over when the model is loaded again."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        drafted = CounterMetricFamily("swama_draft_tokens", "Tokens speculative decoding drafted and verified "
                                      "(accepted or not), since the model was loaded", labels=["model"])
        steps = CounterMetricFamily("swama_decode_steps", "Decode steps of a drafting model's batch since it was "
                                    "loaded: speculative (drafts verified in one wider pass) or plain (one token "
                                    "per row)", labels=["model", "kind"])
        for model, counts in sorted(self.engine.status().speculation.items()):
            drafted.add_metric([model], counts["drafted"])
            steps.add_metric([model, "speculative"], counts["steps"])
            steps.add_metric([model, "plain"], counts["plain_steps"])
        yield drafted
        yield steps


class _PromptCacheCollector:
    """Each loaded model's prompt cache by tier (memory, disk): prompts served from it and not, bytes held,
    what was evicted; the disk tier's tokens read, bytes written and damaged blocks removed. Counts
    start over when the model is loaded again; the disk's blocks stay."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["model", "tier"]
        hits = CounterMetricFamily("swama_prompt_cache_hits", "Prompts that resumed from this tier of the prompt "
                                   "cache", labels=labels)
        misses = CounterMetricFamily("swama_prompt_cache_misses", "Prompts this tier of the prompt cache could not "
                                     "serve", labels=labels)
        held = GaugeMetricFamily("swama_prompt_cache_tier_bytes", "Bytes this tier of the prompt cache holds",
                                 labels=labels)
        evicted = CounterMetricFamily("swama_prompt_cache_evictions", "Entries (memory) or blocks (disk) evicted "
                                      "for the tier's budget", labels=labels)
        read = CounterMetricFamily("swama_prompt_cache_disk_read_tokens", "Prompt tokens read back from disk",
                                   labels=["model"])
        written = CounterMetricFamily("swama_prompt_cache_disk_written_bytes", "Bytes of blocks written to disk",
                                      labels=["model"])
        rejected = CounterMetricFamily("swama_prompt_cache_disk_rejected", "Damaged or foreign block files "
                                       "skipped and removed", labels=["model"])
        for model, tiers in sorted(self.engine.status().prompt_cache.items()):
            for tier, c in tiers.items():
                hits.add_metric([model, tier], c["hits"])
                misses.add_metric([model, tier], c["misses"])
                held.add_metric([model, tier], c["bytes"])
                evicted.add_metric([model, tier], c["evictions"])
            if "disk" in tiers:
                read.add_metric([model], tiers["disk"]["read_tokens"])
                written.add_metric([model], tiers["disk"]["written_bytes"])
                rejected.add_metric([model], tiers["disk"]["rejected"])
        yield from (hits, misses, held, evicted, read, written, rejected)


class _KVCollector:
    """Each loaded language model's batch key/value state: bytes in use and reserved by its rows, the
    budget --memory-limit leaves them, requests waiting for room, and the bits it is quantized to."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        families = {
            "bytes": GaugeMetricFamily("swama_kv_batch_bytes", "Key/value bytes the batch's rows hold now "
                                       "(quantized bytes with --kv-bits)", labels=["model"]),
            "reserved": GaugeMetricFamily("swama_kv_reserved_bytes", "Key/value bytes the running rows reserve: "
                                          "prompt and generation budget (with --memory-limit)", labels=["model"]),
            "budget": GaugeMetricFamily("swama_kv_budget_bytes", "Key/value bytes --memory-limit leaves the "
                                        "batch's rows (0: not counted)", labels=["model"]),
            "waiting": GaugeMetricFamily("swama_kv_waiting", "Requests waiting for key/value room",
                                         labels=["model"]),
            "bits": GaugeMetricFamily("swama_kv_bits", "Bits the key/value cache is quantized to (0: full "
                                      "precision)", labels=["model"]),
        }
        for model, reading in sorted(self.engine.status().kv.items()):
            for key, family in families.items():
                family.add_metric([model], reading[key])
        yield from families.values()


class _SchedulerCollector:
    """Where each model's batch scheduler thread spent its time, by part of its turn, since the model
    was loaded: a benchmark reads it before and after a load level to see what holds the level back."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        seconds = CounterMetricFamily("swama_scheduler_seconds", "Seconds a model's batch scheduler spent in each "
                                      "part of its turns (admission, prefill, graph building, launch, read-back "
                                      "wait, batch bookkeeping, post-processing, delivery, tasks, decisions, idle)", labels=["model", "part"])
        turns = CounterMetricFamily("swama_scheduler_turns", "Turns of a model's batch scheduler", labels=["model"])
        steps = CounterMetricFamily("swama_scheduler_decode_steps", "Decode steps of a model's batch",
                                    labels=["model"])
        for model, reading in sorted(self.engine.status().scheduler.items()):
            for part, value in reading.items():
                if part not in ("turns", "steps"):
                    seconds.add_metric([model, part], value)
            turns.add_metric([model], reading["turns"])
            steps.add_metric([model], reading["steps"])
        yield seconds
        yield turns
        yield steps


def _route_label(scope: Scope) -> str:
    """The route template (`/v1/chat/completions`, `/accounts/{account_id}/...`), not the raw path, so
    the label set stays small; unmatched paths count under one label."""
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


class AccessMiddleware:
    """Pure ASGI (no response buffering, so streams and disconnects behave as without it): adds the
    request id, counts the response by route and status, and writes the access-log line."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(REQUEST_ID.encode(), b"").decode("latin-1")
        request_id = sent if _CLIENT_ID.fullmatch(sent) else f"req-{uuid.uuid4().hex[:16]}"
        status = {"code": 500}
        start = time.perf_counter()

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REQUEST_ID.encode(), request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.requests.labels(scope["method"], _route_label(scope), str(status["code"])).inc()
            access_log.info("%s %s %s %d %.3fs", request_id, scope["method"], scope["path"], status["code"],
                            time.perf_counter() - start)
