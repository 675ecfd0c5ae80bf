"""The one door into the engine: everything the routes and the command line may use of it.

Routes (handlers/routes) and the command line (handlers/cli) import the engine through this module
and nothing else. What crosses the door is plain data, so it can later run across a process
boundary:

- typed requests in: `ChatRequest` (with `Sampling`), `DecisionJob` (with `QuestionView`s), texts to
  embed, text to speak, 16 kHz audio samples to transcribe; images as decoded PIL images;
- events and results out: `TextDelta` / `ReasoningDelta` / `ToolCallEvent` / `Finished`, `DecisionResult`,
  `CheckpointResult`, `Embeddings`, `SpeechSegment`, `Transcript`;
- facts about models: `InstalledModel`, `Task`, `Voices`, `AliasEntry`, `EngineStatus`;
- one family of errors (`EngineError` and its kinds, engine/errors.py).

`EngineClient` is the door's shape and `open_engine(settings)` opens one that runs in this process;
`ModelFiles` lists, installs and removes models without starting MLX (`swama pull`, `list`, `rm`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from swama.engine.decisions.adjust.defaults import NO_DEFAULTS, Defaults, model_defaults
from swama.engine.decisions.adjust.fit import (
    ReliabilityBin,
    accuracy,
    apply_temperature,
    brier_score,
    expected_calibration_error,
    fit_temperature,
    reliability_bins,
)
from swama.engine.decisions.adjust.methods import (
    CALIBRATION_METHODS,
    DEBIAS_METHODS,
    Adjustment,
    Applied,
    Calibration,
    Debias,
)
from swama.engine.decisions.adjust.plan import floored_logs, order_shifts, position_prior, shifted
from swama.engine.decisions.adjust.store import (
    CalibrationCache,
    CalibrationFile,
    Prior,
    read_calibration,
    write_calibration,
)
from swama.engine.decisions.checkpoints import CheckpointResult
from swama.engine.decisions.decide import DecisionJob, DecisionResult
from swama.engine.decisions.rerank import RerankJob, RerankResult
from swama.engine.decisions.scorer import (
    PROMPT_FORMAT_VERSION,
    QuestionKind,
    QuestionView,
    ScoredAnswer,
    check_choice_option_names,
    choice_options_message,
    decision_choice_view,
    decision_score_view,
    noul_view,
    predicate_view,
    render_text,
    systemone_choice_view,
    systemone_score_view,
)
from swama.engine.errors import (
    CLIENT_CLOSED,
    BadInput,
    Busy,
    Cancelled,
    ContextTooLong,
    DecisionError,
    EngineError,
    LoadFailed,
    ModelFileError,
    NotFound,
    Unavailable,
    WrongModel,
    out_of_memory,
)
from swama.engine.files.aliases import DEFAULT_MODEL, AliasEntry
from swama.engine.files.kinds import (
    DECISION,
    EMBEDDING,
    KINDS,
    LANGUAGE,
    RERANKER,
    SPEECH_TO_TEXT,
    TEXT_TO_SPEECH,
    VISION,
)
from swama.engine.files.store import InstalledModel
from swama.engine.kinds.embeddings import Embeddings
from swama.engine.kinds.speech import NO_SPEECH, Voices
from swama.engine.kinds.speech import Segment as SpeechSegment
from swama.engine.kinds.tasks import IMAGES_NEED_VISION, Task, require
from swama.engine.kinds.transcription import SAMPLE_RATE, Transcript
from swama.engine.kinds.transcription import Segment as TranscriptSegment
from swama.engine.priority import BATCH
from swama.engine.ranks.group import (
    EXIT_GROUP_FAILED,
    FAILURE_LINE,
    READY_LINE,
    SERVING_LINE,
    STARTUP_TIMEOUT,
    GroupFailed,
    RankGroup,
)
from swama.engine.ranks.group import current as current_group
from swama.engine.ranks.group import join as join_group
from swama.engine.serving.engine import EngineStatus
from swama.engine.settings import (
    DEVICE_CHOICES,
    DTYPE_CHOICES,
    EngineSettings,
    RuntimeSettings,
    SettingsError,
    StoreSettings,
    default_of,
    env_of,
    flag_of,
    option,
    read,
)
from swama.engine.text.generator import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    OUT_OF_RANGE,
    ChatRequest,
    Event,
    Finished,
    Logprobs,
    ReasoningDelta,
    Sampling,
    TextDelta,
    ToolCallEvent,
)
from swama.engine.text.grammar import Constraint, ToolSpec
from swama.engine.text.kv_policy import catalog_entry as kv_cache_entry
from swama.engine.text.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, TopLogprob
from swama.engine.text.reasoning import EFFORT_BUDGETS, effort
from swama.engine.text.tokenize import Tokenized, TokenizeJob
from swama.engine.text.tool_calls import ToolCall

__all__ = [
    "out_of_memory",
    "kv_cache_entry",
    # ranks: one model split across processes
    "EXIT_GROUP_FAILED", "FAILURE_LINE", "READY_LINE", "SERVING_LINE", "STARTUP_TIMEOUT", "GroupFailed", "RankGroup", "current_group",
    "follow_group", "gpu_count", "group_backend", "join_group", "split_of",
    # constants
    "CALIBRATION_METHODS", "CLIENT_CLOSED", "DEBIAS_METHODS", "DECISION", "DEFAULT_MODEL", "DEFAULT_TEMPERATURE", "DEFAULT_TOP_P", "DEVICE_CHOICES",
    "DTYPE_CHOICES", "EFFORT_BUDGETS", "EMBEDDING", "IMAGES_NEED_VISION", "KINDS", "LANGUAGE", "MAX_TOP_LOGPROBS", "RERANKER", "NO_SPEECH",
    "OUT_OF_RANGE", "BATCH",
    "SAMPLE_RATE", "SPEECH_TO_TEXT", "TEXT_TO_SPEECH", "VISION",
    # types and errors
    "NO_DEFAULTS",
    "Adjustment", "AliasEntry", "Applied", "BadInput", "Busy", "Calibration", "CalibrationCache", "CalibrationFile",
    "Cancelled", "ChatRequest", "CheckpointResult", "Constraint", "ContextTooLong",
    "Debias", "Defaults", "DecisionError", "DecisionJob", "DecisionResult", "Embeddings", "EngineClient", "EngineError",
    "EngineSettings", "EngineStatus", "Event", "Finished", "InstalledModel", "LoadFailed", "Logprobs",
    "ModelFileError",
    "ModelFiles", "NotFound", "Prior", "QuestionKind", "QuestionView", "ReasoningDelta", "RerankJob", "RerankResult", "RuntimeSettings", "Sampling", "ScoredAnswer",
    "SettingsError", "SpeechSegment", "StoreSettings", "Task", "TextDelta", "TokenLogprob", "TokenizeJob", "Tokenized", "ToolCall",
    "ToolCallEvent", "ToolSpec", "TopLogprob",
    "Transcript", "TranscriptSegment", "Unavailable", "Voices", "WrongModel",
    # functions
    "check_choice_option_names", "choice_options_message", "decision_choice_view", "decision_score_view",
    "default_of", "effort", "env_of", "flag_of", "model_defaults", "model_files", "noul_view", "open_engine", "option", "predicate_view",
    "prepare_process", "read", "read_calibration", "render_text", "require", "startup_note", "systemone_choice_view",
    "systemone_score_view", "write_calibration",
    # decision calibration: fitting and measuring it (swama calibrate)
    "PROMPT_FORMAT_VERSION", "ReliabilityBin", "accuracy", "apply_temperature", "brier_score",
    "expected_calibration_error", "fit_temperature", "floored_logs", "order_shifts", "position_prior", "reliability_bins", "shifted",
]


class EngineClient(Protocol):
    """What the routes and the command line ask of the engine."""

    # Observers the server hangs its metrics on: (model id, Finished) per generation, and
    # (model id, questions, shared prefix tokens) per decision request.
    on_generation: Callable[[str, Finished], None] | None
    on_decisions: Callable[[str, int, int], None] | None

    def models(self) -> list[InstalledModel]:
        """The installed models, by id."""

    def find(self, name: str) -> InstalledModel | None:
        """The installed model an alias or id names, or None."""

    def model(self, name: str) -> InstalledModel:
        """The installed model `name` names: BadInput for a blank name, NotFound when none is installed."""

    def require(self, model: InstalledModel, task: Task, name: str | None = None) -> None:
        """WrongModel when `model` cannot do `task` (`name`: what the client asked for)."""

    def model_for(self, name: str, task: Task) -> InstalledModel:
        """`model(name)`, refused when it cannot do `task`."""

    def status(self) -> EngineStatus:
        """The engine's state as last read (see `refresh`)."""

    async def refresh(self) -> None:
        """Bring `status()` up to date (an engine in another process is asked; one here always is)."""

    def chat(self, model_id: str, request: ChatRequest) -> AsyncIterator[Event]:
        """The events of one generation; stop iterating (or `aclose()`) to cancel it."""

    async def tokenize_prompt(self, model_id: str, prompt: str | list[int]) -> list[int]:
        """A raw prompt's tokens, as `ChatRequest.prompt` reads them."""

    async def score_prompt(self, model_id: str, ids: list[int], top: int = 0,
                           temperature: float = 1.0) -> list[TokenLogprob]:
        """Each prompt token with its log probability given the ones before it (the first's: None)."""

    def decide(self, model_id: str, job: DecisionJob) -> AsyncIterator[DecisionResult]:
        """One `DecisionResult` for the job's questions."""

    def rerank(self, model_id: str, job: RerankJob) -> AsyncIterator[RerankResult]:
        """One `RerankResult`: each document's relevance to the query, through the decision scorer."""

    async def predict_checkpoint(self, model_id: str, state: Any, questions: dict[str, dict[str, Any]],
                                 images: list[Any]) -> CheckpointResult:
        """System One questions answered by a decision checkpoint's own head."""

    async def embed(self, model_id: str, texts: list[str], dimensions: int | None = None) -> Embeddings: ...

    def voices(self, model_id: str) -> Voices: ...

    def speak(self, model_id: str, text: str, voice: str | None, speed: float) -> AsyncIterator[SpeechSegment]:
        """Audio segments as the model makes them; stop iterating to cancel."""

    def transcription_language(self, name: str | None) -> str | None:
        """The language code a request names (None: detected); BadInput when it names none."""

    async def transcribe(self, model_id: str, audio: Any, *, language: str | None = None,
                         prompt: str | None = None, temperature: float = 0.0) -> Transcript: ...

    async def tokenize(self, model_id: str, job: TokenizeJob) -> Tokenized:
        """A text prompt's or a chat's tokens, the chat rendered as a chat completion renders it."""

    async def detokenize(self, model_id: str, ids: list[int]) -> str:
        """The text of token ids; BadInput for an id outside the model's vocabulary."""

    async def start(self) -> None:
        """Load what must be loaded before the first request (a rank group's model on rank 0)."""

    async def close(self) -> None: ...


def open_engine(settings: EngineSettings, *, server: bool = False) -> EngineClient:
    """An engine running in this process; for the HTTP server (`server`), the one its settings ask
    for: in a process of its own (the default), whose device-driving loop then shares no interpreter
    lock with HTTP and text work, or in this one (--no-engine-process, and rank 0 of a group of
    ranks, which joined the group in this process and runs its model here). The command line's
    one-shot commands and the tests of the engine itself run it here."""
    if server and settings.engine_process and current_group() is None:
        from swama.engine.process.proxy import EngineProcess

        return EngineProcess(settings)
    from swama.engine.serving.engine import Engine

    return Engine(settings)


class ModelFiles:
    """The installed models and installing them: no MLX is started, so `swama list` stays quick."""

    def __init__(self, root: Path) -> None:
        from swama.engine.files.store import ModelStore

        self.root = root
        self._store = ModelStore(root)

    def list(self) -> list[InstalledModel]:
        return self._store.list()

    def find(self, name: str) -> InstalledModel | None:
        return self._store.find(name)

    def get(self, name: str) -> InstalledModel:
        """The installed model; ModelNotInstalled (worded with the command that installs it) otherwise."""
        return self._store.get(name)

    def pull(self, name: str) -> InstalledModel:
        """Install `name` (an alias or a Hugging Face id) from where it is published."""
        from swama.engine.files.sources import pull

        return pull(self._store, name)

    def find_or_pull(self, name: str) -> InstalledModel:
        return self.find(name) or self.pull(name)

    def create(self, path: Path, name: str, *, dtype: str | None = None, quantize: int | None = None,
               progress: bool = False) -> InstalledModel:
        """Install a local model folder (copied) or a GGUF file (converted: floating weights to `dtype`,
        None for the device's; matrices re-quantized to `quantize` bits when given)."""
        import mlx.core as mx

        from swama.engine.files.gguf_import import ImportOptions
        from swama.engine.files.sources import create

        options = ImportOptions(dtype=getattr(mx, dtype) if dtype else None, quantize_bits=quantize,
                                progress=progress)
        return create(self._store, path, name, options=options)

    def create_adapter(self, path: Path, name: str, base: str) -> InstalledModel:
        """Install the LoRA adapter folder `path` (mlx-lm's or PEFT's) under `name`, against the installed
        model `base` (StoreError, and nothing installed, when it does not fit it)."""
        from swama.engine.adapters.install import create_adapter

        return create_adapter(self._store, path, name, base)

    def remove(self, name: str) -> InstalledModel:
        return self._store.remove(name)

    @staticmethod
    def aliases() -> list[AliasEntry]:
        """Every alias with the kind of model it names and whether this installation can serve it."""
        from swama.engine.files.aliases import catalog

        return catalog()


def model_files(settings: StoreSettings | None = None) -> ModelFiles:
    """The installed models under `settings.models_root` (SWAMA_MODELS or ~/.swama/models by default)."""
    return ModelFiles((settings or read(StoreSettings)).models_root)


def keep_torch_out() -> None:
    """Before anything imports transformers: PyTorch stays out of this process (engine/runtime.py says why)."""
    from swama.engine.runtime import keep_torch_out as keep_out

    keep_out()


def prepare_process(argv: list[str]) -> None:
    """Before a command that runs models: restart once with a tuned BLAS preloaded (Linux CPU), then
    make the chosen device MLX's default. ValueError or RuntimeError when the device or dtype asked
    for cannot be had here."""
    from swama.engine.runtime import activate_device, reexec_with_fast_blas

    reexec_with_fast_blas(argv)
    activate_device()


def startup_note() -> str | None:
    """What to tell someone starting a server on MLX's slow bundled BLAS (None when nothing)."""
    from swama.engine.runtime import slow_blas_note

    return slow_blas_note()


def group_backend(requested: str) -> str:
    """The MLX distributed backend for ranks: `requested`, or for "auto" NCCL on an NVIDIA GPU, else ring."""
    from swama.engine.runtime import on_gpu

    return requested if requested != "auto" else ("nccl" if on_gpu() else "ring")


def gpu_count() -> int:
    """The GPUs this process may use (one per NCCL rank)."""
    from swama.engine.runtime import gpu_count as count

    return count()


def split_of(path: Path, ranks: int, backend: str) -> str:
    """How the model in `path` splits across `ranks` ranks ("tensor" or "pipeline"); BadInput naming
    what is supported when it cannot."""
    from swama.engine.ranks.sharding import plan

    return plan(path, ranks, backend)


def follow_group(settings: EngineSettings, model_id: str) -> None:
    """On a rank other than 0: load this rank's shard of `model_id` and run rank 0's steps for good."""
    from swama.engine.serving.follower import follow

    follow(settings, model_id)
