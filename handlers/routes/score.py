"""POST /v1/score: vLLM's score route over the rerank door (engine/decisions/rerank.py): each
(text_1, text_2) pair scored as /v2/rerank scores a query and a document, p(yes) in [0, 1].

Pairs are formed as vLLM forms them: one text_1 against every text_2 (1:N, the text_1 prefilled once),
or two lists of one length by position (N:N, one rerank per distinct text_1, run side by side).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import Response

from swama.engine.client import RerankJob, Task
from swama.generated.score_models import ScoreRequest, ScoreTexts
from swama.handlers.http.errors import bad_request
from swama.handlers.http.pipeline import Call, RouteRules, route
from swama.handlers.routes.rerank import reranked

SCORE_RULES = RouteRules(handled=frozenset({"model", "text_1", "text_2", "truncate_prompt_tokens"}))


def texts_of(value: ScoreTexts) -> list[str]:
    inner = value.root
    return [inner] if isinstance(inner, str) else list(inner.root)


def pairs_of(first: list[str], second: list[str]) -> dict[str, list[int]]:
    """Each distinct text_1 and the positions of the text_2 it is scored against."""
    if len(first) == 1:
        return {first[0]: list(range(len(second)))}
    if len(first) != len(second):
        raise bad_request(f"text_1 and text_2 hold {len(first)} and {len(second)} texts: give one text_1 for "
                          "every text_2, or one text_1 for all of them.", param="text_2")
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(first):
        groups.setdefault(text, []).append(i)
    return groups


@route(SCORE_RULES)
async def create_score(call: Call, request: ScoreRequest) -> Response:
    first, second = texts_of(request.text_1), texts_of(request.text_2)
    groups = pairs_of(first, second)
    model = call.engine.model(request.model)  # 404 before any work on the model
    call.engine.require(model, Task.RERANK)
    limit = request.truncate_prompt_tokens.root if request.truncate_prompt_tokens is not None else -1
    jobs = {query: RerankJob(query, [second[i] for i in positions], context_limit=call.settings.context_limit,
                             max_tokens_per_doc=None if limit < 0 else max(limit, 1))
            for query, positions in groups.items()}
    results = await asyncio.gather(*(reranked(call, model.id, job) for job in jobs.values()))
    scores = [0.0] * len(second)
    tokens = 0
    for positions, result in zip(groups.values(), results, strict=True):
        tokens += result.input_tokens
        for position, score in zip(positions, result.scores, strict=True):
            scores[position] = score
    body = {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": request.model,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}
    return Response(json.dumps(body), media_type="application/json")
