"""POST /v1/rerank and /v2/rerank: Cohere's rerank wire over the decision scorer (engine/decisions/rerank.py).

The two versions differ in their bodies only: v1 takes documents as strings or objects of string
fields (ranked on `text`, or on the fields `rank_fields` names) and can return each document with its
result; v2 takes strings and can cut each to `max_tokens_per_doc` tokens. Both answer the results
sorted by relevance, highest first, at most `top_n` of them.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence

from fastapi import Response

from swama.engine.client import Cancelled, RerankJob, RerankResult, Task
from swama.generated.cohere_models import CohereRerankRequest, CohereV2RerankRequest
from swama.handlers.http.errors import bad_request
from swama.handlers.http.pipeline import Call, RouteRules, route
from swama.handlers.http.streaming import collect_or_cancel

# Fields each version acts on; the others its SDK sends (v1: max_chunks_per_doc, v2: relevant_spans,
# priority) are refused by name, not ignored.
V1_RULES = RouteRules(handled=frozenset({"model", "query", "documents", "top_n", "rank_fields", "return_documents"}))
V2_RULES = RouteRules(handled=frozenset({"model", "query", "documents", "top_n", "max_tokens_per_doc"}))
MAX_TOKENS_PER_DOC = 4096  # v2's default, Cohere's
DOCUMENTS_PER_SEARCH_UNIT = 100  # Cohere bills one search unit per query over up to 100 documents


def document_text(document: str | dict[str, str], index: int, rank_fields: Sequence[str] | None) -> str:
    """What a v1 document is ranked on: the string, an object's `text`, or the `rank_fields` it names
    as `field: value` lines."""
    if isinstance(document, str):
        return document
    # Every object carries its text (Cohere's rule; a returned document is read by its `text`), and
    # whatever else rank_fields names.
    for name, why in [("text", "an object document needs text"), *((f, "rank_fields names it") for f in rank_fields or ())]:
        if name not in document:
            raise bad_request(f"documents[{index}] has no '{name}' field to rank on ({why}).", param=f"documents.{index}")
    if not rank_fields:
        return document["text"]
    return "\n".join(f"{name}: {document[name]}" for name in rank_fields)


async def reranked(call: Call, model_id: str, job: RerankJob) -> RerankResult:
    """The engine's one result for `job` on a model that can rerank; a client that leaves cancels it."""
    async for result in collect_or_cancel(call.request, call.engine.rerank(model_id, job)):
        return result
    raise Cancelled()


async def _scores(call: Call, model_name: str, job: RerankJob) -> RerankResult:
    model = call.engine.model(model_name)  # 404 before any other work
    call.engine.require(model, Task.RERANK)
    return await reranked(call, model.id, job)


def _answer(result: RerankResult, top_n: int | None, version: str,
            documents: Sequence[str | dict[str, str]] | None = None) -> Response:
    order = sorted(range(len(result.scores)), key=lambda i: -result.scores[i])[:top_n]
    results = []
    for i in order:
        item: dict = {"index": i, "relevance_score": result.scores[i]}
        if documents is not None:
            doc = documents[i]
            item["document"] = {"text": doc} if isinstance(doc, str) else dict(doc)
        results.append(item)
    meta = {"api_version": {"version": version},
            "billed_units": {"search_units": math.ceil(len(result.scores) / DOCUMENTS_PER_SEARCH_UNIT)},
            "tokens": {"input_tokens": result.input_tokens}}
    body = {"id": str(uuid.uuid4()), "results": results, "meta": meta}
    return Response(json.dumps(body), media_type="application/json")


@route(V1_RULES)
async def rerank_v1(call: Call, request: CohereRerankRequest) -> Response:
    documents = list(request.documents)
    rank_fields = request.rank_fields.root if request.rank_fields is not None else None
    texts = [document_text(d, i, rank_fields) for i, d in enumerate(documents)]
    job = RerankJob(request.query, texts, context_limit=call.settings.context_limit)
    result = await _scores(call, request.model, job)
    top_n = request.top_n.root if request.top_n is not None else None
    return _answer(result, top_n, "1", documents if request.return_documents else None)


@route(V2_RULES)
async def rerank_v2(call: Call, request: CohereV2RerankRequest) -> Response:
    limit = request.max_tokens_per_doc.root if request.max_tokens_per_doc is not None else MAX_TOKENS_PER_DOC
    job = RerankJob(request.query, list(request.documents), context_limit=call.settings.context_limit,
                    max_tokens_per_doc=limit)
    result = await _scores(call, request.model, job)
    top_n = request.top_n.root if request.top_n is not None else None
    return _answer(result, top_n, "2")
