"""Where each pinned document in specs/ comes from, and what we take from it.

A spec bump edits this file (new commit, new sha256) and reruns `python -m tools.spec bump`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Operation:
    method: str
    upstream_path: str
    path: str  # the path we serve
    handler: str  # "module:function" under swama.handlers
    operation_id: str | None = None  # overrides the upstream operationId
    error_schema: str = "ErrorResponse"
    errors: tuple[str, ...] | None = None  # the error statuses it answers (default: by its method)


@dataclass(frozen=True)
class Source:
    doc: str  # file name under specs/
    repo: str
    path: str
    commit: str
    commit_date: str
    operations: tuple[Operation, ...]
    component_prefix: str = ""  # keeps component names unique once the documents are merged
    note: str = ""
    extra_inputs: tuple[str, ...] = field(default_factory=tuple)
    # Keep only the components the operations reach once the overlay has narrowed them (a document
    # built from a whole SDK's types would otherwise carry every type the overlay cut off).
    keep_only_reached: bool = False


OPENAI = Source(
    doc="openai.yaml",
    repo="openai/openai-openapi",
    path="openapi.yaml",
    commit="f85dbe223d40e1a31cba812ab2d755c7e98a92a3",
    commit_date="2026-08-21",
    operations=(
        Operation("get", "/models", "/v1/models", "routes.models:list_models"),
        Operation("post", "/chat/completions", "/v1/chat/completions", "routes.chat:create_chat_completion"),
        Operation("post", "/completions", "/v1/completions", "routes.completions:create_completion"),
        Operation("post", "/responses", "/v1/responses", "routes.responses:create_response"),
        Operation("post", "/embeddings", "/v1/embeddings", "routes.embeddings:create_embedding"),
        Operation("post", "/audio/transcriptions", "/v1/audio/transcriptions", "routes.transcriptions:create_transcription"),
        Operation("post", "/audio/speech", "/v1/audio/speech", "routes.speech:create_speech"),
        Operation("post", "/files", "/v1/files", "routes.files:create_file",
                  errors=("400", "401", "413", "500", "503")),
        Operation("get", "/files", "/v1/files", "routes.files:list_files", errors=("400", "401", "500", "503")),
        Operation("get", "/files/{file_id}", "/v1/files/{file_id}", "routes.files:retrieve_file",
                  errors=("401", "404", "500", "503")),
        Operation("delete", "/files/{file_id}", "/v1/files/{file_id}", "routes.files:delete_file",
                  errors=("400", "401", "404", "500", "503")),
        Operation("get", "/files/{file_id}/content", "/v1/files/{file_id}/content", "routes.files:download_file",
                  errors=("401", "404", "500", "503")),
        Operation("post", "/batches", "/v1/batches", "routes.batches:create_batch",
                  errors=("400", "401", "404", "413", "500", "503")),
        Operation("get", "/batches", "/v1/batches", "routes.batches:list_batches", errors=("400", "401", "500", "503")),
        Operation("get", "/batches/{batch_id}", "/v1/batches/{batch_id}", "routes.batches:retrieve_batch",
                  errors=("401", "404", "500", "503")),
        Operation("post", "/batches/{batch_id}/cancel", "/v1/batches/{batch_id}/cancel", "routes.batches:cancel_batch",
                  errors=("400", "401", "404", "500", "503")),
    ),
)

DECISIONS = Source(
    doc="decisions.yaml",
    repo="openai/openai-openapi",
    path="openapi.yaml",
    commit="4a4020d8",
    commit_date="2026-10-06",
    operations=(
        Operation(
            "post", "/decisions", "/v1/decisions", "routes.decisions:create_decision",
        ),
    ),
    component_prefix="Decision",
    note=(
        "The upstream file at this commit was not available. The document is written from the "
        "published OpenAI Decisions reference and the server's own contract (1-200 questions, "
        "2-255 choices, 2-10 levels, safety_identifier <= 128 characters), using a reconstruction "
        "whose sha256 is recorded as upstream_sha256. Replace it with the real file when it can be had."
    ),
)

SYSTEMONE = Source(
    doc="systemone.yaml",
    repo="TypeSafe System One API (https://api.typesafe.ai/openapi.json)",
    path="openapi.json",
    commit="0.2.0",
    commit_date="2026-10-04",
    operations=(
        Operation(
            "post", "/v1/systemone", "/v1/systemone", "routes.systemone:create_system_one",
            operation_id="createSystemOne",
        ),
    ),
    component_prefix="SystemOne",
    note=(
        "info.version 0.2.0 as served. Extensions are marked x-swama-extension: `images` "
        "(Cloudflare Clef, cloudflare/cloudflare-docs clef.json @ 0ae61c0b72577c69ed32bf7867d2e478cee255d0), "
        "`x_label_mass` and `chat_template_kwargs` (SGLang). Validation errors use 400, not 422."
    ),
    extra_inputs=("clef",),
)

# Cloudflare serves Clef under the v4 API; the same paths without the `/client/v4` prefix let a client
# whose base URL is just the server's address reach it too.
_RUN = "/accounts/{account_id}/ai/run/@cf/cloudflare/"
WORKERS_AI_CARDS = {"clef": "clef.json", "clef_flash": "clef-flash.json"}  # card key -> upstream file

WORKERS_AI = Source(
    doc="workers_ai.yaml",
    repo="cloudflare/cloudflare-docs",
    path="src/content/workers-ai-models/clef.json, clef-flash.json",
    commit="0ae61c0b72577c69ed32bf7867d2e478cee255d0",
    commit_date="unknown: the cards say created_at 2026-09-29; collected 2026-11-30",
    operations=(
        Operation("post", "@cf/cloudflare/clef", "/client/v4" + _RUN + "clef", "routes.workers_ai:run_clef",
                  operation_id="runClef"),
        Operation("post", "@cf/cloudflare/clef-flash", "/client/v4" + _RUN + "clef-flash",
                  "routes.workers_ai:run_clef_flash", operation_id="runClefFlash"),
        Operation("post", "@cf/cloudflare/clef", _RUN + "clef", "routes.workers_ai:run_clef",
                  operation_id="runClefUnprefixed"),
        Operation("post", "@cf/cloudflare/clef-flash", _RUN + "clef-flash", "routes.workers_ai:run_clef_flash",
                  operation_id="runClefFlashUnprefixed"),
    ),
    component_prefix="WorkersAi",
    note=(
        "Built from the two Workers AI model cards (schema.input / schema.output are JSON Schemas); "
        "upstream_sha256 is clef.json's, clef_flash_sha256 clef-flash.json's. Answers come in "
        "Cloudflare's v4 envelope {result, success, errors, messages}; refusals set result null, "
        "success false and errors [{code, message}]."
    ),
    extra_inputs=("clef_flash",),
)

# vLLM keeps no OpenAPI file of its tokenizer routes in its repository: the document is our own,
# written from its request and response models and kept in this repository (WRITTEN). Its messages and tools are the
# chat route's components, taken from the pinned openai.yaml at extraction.
WRITTEN = Path(__file__).resolve().parent / "written"

TOKENIZE = Source(
    doc="tokenize.yaml",
    repo="vllm-project/vllm",
    path="vllm/entrypoints/serve/tokenize/protocol.py",
    commit="030ea52effcb05071543c8c42b8f0145e94cee43",
    commit_date="unknown: the shapes were read from this commit's protocol.py on 2026-12-03",
    operations=(
        Operation("post", "/tokenize", "/tokenize", "routes.tokenize:tokenize"),
        Operation("post", "/detokenize", "/detokenize", "routes.tokenize:detokenize"),
    ),
    note=(
        "Our own document of vLLM's shapes (TokenizeCompletionRequest | TokenizeChatRequest -> "
        "TokenizeResponse, DetokenizeRequest -> DetokenizeResponse), written from the models in "
        "upstream_path at upstream_commit: vLLM keeps no OpenAPI file of these routes in its repository. "
        "upstream_sha256 is our document's, tools/spec/written/vllm-tokenize.yaml. `messages`, `tools` "
        "and the error envelope are the chat route's components, copied by name from the pinned "
        "openai.yaml whose sha256 is openai_sha256."
    ),
    extra_inputs=("openai",),
)
TOKENIZE_DOCUMENT = WRITTEN / "vllm-tokenize.yaml"

SCORE = Source(
    doc="score.yaml",
    repo="vllm-project/vllm",
    path="vllm/entrypoints/pooling/score/protocol.py",
    commit="08a48e2b51ac2ea9c2cfad361806fc8cdaef866a",
    commit_date="unknown: the shapes were read from this commit's protocol.py on 2026-12-07",
    operations=(
        Operation("post", "/v1/score", "/v1/score", "routes.score:create_score", operation_id="createScore"),
    ),
    note=(
        "Our own document of vLLM's shapes (ScoreRequest -> ScoreResponse, text forms only), written from "
        "the models in upstream_path at upstream_commit: vLLM keeps no OpenAPI file of this route in its "
        "repository. upstream_sha256 is our document's, tools/spec/written/vllm-score.yaml. The error "
        "envelope is the chat route's, copied by name from the pinned openai.yaml whose sha256 is openai_sha256."
    ),
    extra_inputs=("openai",),
)
SCORE_DOCUMENT = WRITTEN / "vllm-score.yaml"

# Anthropic publishes no OpenAPI file: the document is built from the types of its Python SDK, which is
# generated from Anthropic's own specification (tools/spec/anthropic_sdk.py reads the installed package,
# and refuses any version but `commit`).
ANTHROPIC = Source(
    doc="anthropic.yaml",
    repo="anthropics/anthropic-sdk-python (PyPI: anthropic)",
    path="anthropic/types/: message_create_params.py, message_count_tokens_params.py, message.py, "
         "message_tokens_count.py, raw_message_stream_event.py, shared/error_response.py and the modules they import",
    commit="2.10.0",
    commit_date="unknown: read from the installed anthropic 2.10.0 wheel on 2026-12-03",
    operations=(
        Operation("post", "/v1/messages", "/v1/messages", "routes.messages:create_message",
                  operation_id="createMessage"),
        Operation("post", "/v1/messages/count_tokens", "/v1/messages/count_tokens",
                  "routes.messages:count_message_tokens", operation_id="countMessageTokens"),
    ),
    component_prefix="Anthropic",
    note=(
        "Anthropic publishes no OpenAPI file. The document is built from the anthropic Python SDK at "
        "upstream_commit (its PyPI version), which Stainless generates from Anthropic's own specification: "
        "the request TypedDicts (MessageCreateParamsBase plus `stream` as one boolean, MessageCountTokensParams) "
        "and the answer models (Message, MessageTokensCount, RawMessageStreamEvent, ErrorResponse), turned "
        "into JSON Schema by pydantic (tools/spec/anthropic_sdk.py). upstream_sha256 is the sha256 of the "
        "sha256sum manifest of the package's anthropic/types/**/*.py files, sorted by path relative to "
        "site-packages (`find anthropic/types -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum`), "
        "each file first checked against the wheel's RECORD. temperature, top_p and top_k, which this SDK "
        "no longer has, are added by the overlay (x-swama-extension: anthropic), as is the request_too_large "
        "error Anthropic documents for 413."
    ),
    keep_only_reached=True,
)

# Cohere publishes its API definition for its SDK generator, not as a file to pin: the document is built
# from the types and method parameters of its Python SDK (tools/spec/cohere_sdk.py reads the installed
# package, and refuses any version but `commit`).
COHERE = Source(
    doc="cohere.yaml",
    repo="cohere-ai/cohere-python (PyPI: cohere)",
    path="cohere/base_client.py (BaseCohere.rerank), cohere/v2/client.py (V2Client.rerank), "
         "cohere/types/rerank_response.py, cohere/v2/types/v2rerank_response.py and the modules they import",
    commit="7.3.1",
    commit_date="unknown: read from the installed cohere 7.3.1 wheel on 2026-12-07",
    operations=(
        Operation("post", "/v1/rerank", "/v1/rerank", "routes.rerank:rerank_v1", operation_id="rerank",
                  error_schema="Error"),
        Operation("post", "/v2/rerank", "/v2/rerank", "routes.rerank:rerank_v2", operation_id="rerankV2",
                  error_schema="Error"),
    ),
    component_prefix="Cohere",
    note=(
        "Cohere publishes no OpenAPI file to pin. The document is built from the cohere Python SDK at "
        "upstream_commit (its PyPI version), which Fern generates from Cohere's own API definition: the "
        "request bodies are the keyword parameters of BaseCohere.rerank (v1) and V2Client.rerank (v2) as "
        "one model each, the answers the SDK's RerankResponse and V2RerankResponse, turned into JSON "
        "Schema by pydantic (tools/spec/cohere_sdk.py). The error body, {\"message\"}, has no SDK type and "
        "is stated by the tool. upstream_sha256 is the sha256 of the sha256sum manifest of the .py files "
        "of cohere/types, cohere/v2/types and the four client modules, sorted by path relative to "
        "site-packages, each first checked against the wheel's RECORD."
    ),
    keep_only_reached=True,
)

SOURCES = {"openai": OPENAI, "decisions": DECISIONS, "systemone": SYSTEMONE, "clef_flash": WORKERS_AI,
           "tokenize": TOKENIZE, "anthropic": ANTHROPIC, "cohere": COHERE,
           "score": SCORE}
