"""The server's settings: the engine's options (engine/settings.py) and the HTTP server's own, each
written once with its default, its environment variable, its help text and its bounds; the
`swama serve` flags are made from these fields."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationInfo, field_validator, model_validator

from swama.engine.client import (
    CALIBRATION_METHODS,
    DEBIAS_METHODS,
    DEFAULT_MODEL,
    EngineClient,
    EngineSettings,
    InstalledModel,
    option,
)
from swama.handlers.media.audio_decode import MAX_AUDIO_SECONDS, MAX_SAMPLE_RATE


class ServerSettings(EngineSettings):
    host: str = option("127.0.0.1", "address to bind; 0.0.0.0 exposes the API to the network", metavar="HOST")
    port: int = option(28100, "port to listen on", metavar="PORT", ge=1, le=65535)
    api_key: str | None = option(None, "require 'Authorization: Bearer KEY' on every route", metavar="KEY",
                                 default_text="none")
    allowed_hosts: str = option(
        "", "host names the server answers to beside its bound address and localhost, comma-separated "
            "('*.example.com' takes its subdomains, '*' any name); any other Host header is refused, which stops "
            "a web page from reaching the server by rebinding its own name to this address",
        metavar="HOST,...", default_text="none")
    cors_origins: str = option(
        "", "origins of web pages (scheme://host:port) that may call the API from a browser, comma-separated "
            "('*': any page); a request from any other page is refused (the playground, same-origin, always works)",
        metavar="ORIGIN,...", default_text="none")
    allow_private_urls: bool = option(
        False, "fetch image URLs that point at private, loopback or link-local addresses too (by default only "
               "public addresses are fetched, so a request cannot make the server reach into its own network)")
    max_audio_seconds: float = option(
        MAX_AUDIO_SECONDS, "the longest audio an upload may hold, by its header and as it is decoded",
        metavar="SECONDS", gt=0)
    max_audio_sample_rate: int = option(
        MAX_SAMPLE_RATE, "the highest sample rate an audio upload may have (its samples are held at that rate "
                         "before resampling to 16 kHz)", metavar="HZ", ge=16000)
    files_quota_bytes: int = option(10 * 1024 ** 3, "the most bytes the files uploaded to /v1/files may take "
                                                     "together in the data folder", metavar="BYTES", ge=0)
    max_choices: int = option(128, "the most completions one /v1/completions request may ask for: its prompts "
                                   "times n", metavar="N", ge=1, le=4096)
    log_level: str = option("info", "how much the server logs", choices=("critical", "error", "warning", "info",
                                                                         "debug"))
    ui: bool = option(True, "do not serve the browser playground at / and /ui/; the API is unchanged",
                      flags=("--no-ui",))
    clef_model: str | None = option(
        None, "the local model that answers Cloudflare's @cf/cloudflare/clef and clef-flash", metavar="NAME",
        default_text="the server's model, as for System One's jev-latest")
    decision_debias: str = option(
        "none", "the x_debias a decision question gets when neither it nor its request names one (choice "
                "questions; a model's own default from `swama calibrate --default-debias` comes first)",
        choices=DEBIAS_METHODS)
    decision_calibration: str = option(
        "none", "the x_calibration a decision question gets when neither it nor its request names one (fitted: "
                "where the model has a fitted temperature for the question's kind)",
        choices=CALIBRATION_METHODS)
    batch_lines: int = option(16, "lines of one batch job answered at once; live requests still go first",
                              metavar="N", ge=1, le=4096)
    # The model `swama serve MODEL` was started with: the command's argument, not a flag.
    default_model: str | None = option(None, "the server's default model", cli=False)

    # Past one process (docs/scale.md): one model split across ranks, or copies of the engine behind
    # one endpoint.
    ranks: int | None = option(
        None, "split MODEL across N ranks on this machine (mlx-lm's tensor or pipeline sharding over MLX "
              "distributed: the ring backend on the CPU, NCCL on NVIDIA GPUs, one GPU per rank, NVLink multicast off "
              "unless NCCL_NVLS_ENABLE=1); rank 0 serves HTTP",
        metavar="N", default_text="one process", ge=2)
    hostfile: Path | None = option(
        None, "split MODEL across the hosts of an mlx.launch host file, one rank per entry, started by mlx.launch "
              "(over ssh where a host is not 127.0.0.1); rank 0, the first entry, serves HTTP", metavar="FILE")
    rank_backend: str = option("auto", "the MLX distributed backend the ranks talk over (auto: NCCL on NVIDIA "
                                       "GPUs, else the ring backend)",
                               choices=("auto", "ring", "nccl", "jaccl", "mpi"))
    rank_timeout: float = option(
        20.0, "how long one step may wait on the other ranks before the group counts as failed: requests in "
              "flight end with 503 and the group is restarted", metavar="SECONDS", gt=0, le=3600)
    rank_restarts: int = option(3, "restarts of a failed rank group in a row before the server gives up and exits, "
                                   "naming the failed rank", metavar="N", ge=0)
    replicas: int | None = option(
        None, "serve N independent copies of the engine behind one endpoint with Ray Serve, each request routed "
              "to the copy that holds its prompt's cached prefix, else the least loaded; a GPU each where there "
              "are GPUs, or a share of one when this machine has fewer GPUs than replicas", metavar="N",
        default_text="one process", ge=1)
    ray_address: str | None = option(None, "join this Ray cluster with --replicas instead of starting a local one",
                                     metavar="ADDRESS", default_text="a local Ray started for the server")
    min_replicas: int | None = option(
        None, "autoscale between --min-replicas and --max-replicas on queue depth (both needed)", metavar="N",
        default_text="no autoscaling", ge=1)
    max_replicas: int | None = option(
        None, "the most replicas autoscaling starts", metavar="N", default_text="no autoscaling", ge=1)

    # Set by the process that starts a rank group, for its ranks.
    group_restarts: int | None = option(None, "times this rank group was restarted after a failure", cli=False,
                                        ge=0)
    group_last_failure: str | None = option(None, "why the rank group last failed", cli=False)
    group_notice: Path | None = option(None, "where the supervisor writes why it signals rank 0", cli=False)

    @field_validator("decision_debias", "decision_calibration")
    @classmethod
    def _decision_method(cls, value: str, info: ValidationInfo) -> str:
        methods = DEBIAS_METHODS if info.field_name == "decision_debias" else CALIBRATION_METHODS
        if value not in methods:
            flag = "--" + str(info.field_name).replace("_", "-")
            raise ValueError(f"{flag} must be one of {', '.join(methods)} (got {value!r})")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_patterns(cls, value: str) -> str:
        for host in _listed(value):
            if host != "*" and ("*" in host[1:] or host.startswith("*") and not host.startswith("*.")):
                raise ValueError(f"--allowed-hosts: {host!r} is not a host name, '*.domain' or '*'")
        return value

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: str) -> str:
        for origin in _listed(value):
            parts = urlsplit(origin)
            if origin != "*" and (parts.scheme not in ("http", "https") or not parts.netloc
                                  or parts.path.strip("/") or parts.query):
                raise ValueError(f"--cors-origins: {origin!r} is not an origin such as 'http://localhost:3000' or '*'")
        return value

    @property
    def allowed_host_list(self) -> list[str]:
        return [h.lower() for h in _listed(self.allowed_hosts)]

    @property
    def cors_origin_list(self) -> list[str]:
        return [o.rstrip("/").lower() for o in _listed(self.cors_origins)]

    @model_validator(mode="after")
    def _one_way_to_scale(self) -> ServerSettings:
        if self.ranks is not None and self.hostfile is not None:
            raise ValueError("--ranks and --hostfile both say where the ranks run: give one of them")
        if self.hostfile is not None and not self.hostfile.expanduser().is_file():
            raise ValueError(f"--hostfile {str(self.hostfile)!r} is not a file")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("--min-replicas and --max-replicas go together: give both to autoscale")
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"--min-replicas ({self.min_replicas}) is more than --max-replicas ({self.max_replicas})")
        if (self.replicas is not None or self.min_replicas is not None) and (self.ranks or self.hostfile):
            raise ValueError("--replicas with --ranks or --hostfile is not served yet: a replica here is one process "
                             "(docs/scale.md)")
        return self

    @property
    def rank_group(self) -> bool:
        """Whether MODEL is split across ranks."""
        return self.ranks is not None or self.hostfile is not None

    @property
    def replicated(self) -> bool:
        """Whether copies of the engine run behind one endpoint (Ray Serve)."""
        return self.replicas is not None or self.min_replicas is not None


def _listed(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def server_default_model(settings: ServerSettings, engine: EngineClient) -> InstalledModel | None:
    """The server's default model: the one `swama serve` was started with, else the offline default
    model when it is installed (what System One's default names and Clef's cards mean here)."""
    for candidate in (settings.default_model, DEFAULT_MODEL):
        if candidate and (default := engine.find(candidate)) is not None:
            return default
    return None
