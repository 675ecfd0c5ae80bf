"""Reranking through the decision scorer: each document's relevance to a query is the probability a
chat model gives "yes" when asked whether the document is relevant, read from its next-token scores.

A rerank request becomes one decision job: the query is the job's input (the shared prefix every
question continues: chat header and query, prefilled once), and each document is one yes/no question
whose text holds the document (its own suffix). So many documents go through the scorer's batched
passes over one prefix, and requests pack with other decision work as any decision request does.

    input:    Query: {query}
    question: Is the following true? Document: {document}
              The document above answers the query.
              Answer with yes or no only.

(the question lines are the decision prompt's own, engine/decisions/scorer/prompt.py). The score is
p(yes) normalized over yes and no, in [0, 1].

A model whose card gives its own reranking prompt is asked in that format instead, the prompt
finished by hand rather than by the chat template: Qwen3-Reranker (told by its name: its config is a
plain Qwen3ForCausalLM) is asked as its card asks, with the card's default instruction, and scored on
its "yes" and "no" tokens, which is the card's own score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swama.engine.decisions.decide import DecisionJob
from swama.engine.decisions.scorer.questions import predicate_view

QUERY = "Query: {query}"
# The claim after the document: asked before it ("the document below is relevant ..."), a small model
# judges whether the document is true rather than whether it answers (SmolLM2-135M's MRR on the tests'
# relevance set: 0.32 with the claim first, 0.41 after; chance is 0.34).
RELEVANCE = "Document: {document}\nThe document above answers the query."


@dataclass(frozen=True)
class CardFormat:
    """A model card's reranking prompt: `prefix` + `body` (query and document) + `suffix`."""

    prefix: str
    body: str  # with {instruction}, {query} and {document}
    suffix: str
    instruction: str

    def prompt(self, query: str, document: str) -> str:
        return self.prefix + self.body.format(instruction=self.instruction, query=query, document=document) + self.suffix


QWEN3_RERANKER = CardFormat(
    prefix='<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
           'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
    body="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)


def card_format(*names: str | None) -> CardFormat | None:
    """The card's reranking prompt of the model these names (its id, its source) call, if it has one."""
    if any(name and "qwen3-reranker" in name.lower() for name in names):
        return QWEN3_RERANKER
    return None


@dataclass(frozen=True)
class RerankJob:
    query: str
    documents: Sequence[str]
    context_limit: int
    max_tokens_per_doc: int | None = None  # longer documents are cut to this many tokens first


@dataclass(frozen=True)
class RerankResult:
    scores: list[float]  # per document, in request order
    input_tokens: int  # every token the scorer read: the shared prefix once, each document's suffix


def decision_job(job: RerankJob, card: CardFormat | None = None) -> DecisionJob:
    if card is not None:
        views = [predicate_view("relevant")] * len(job.documents)
        prompts = [card.prompt(job.query, d) for d in job.documents]
        return DecisionJob(job.query, views, context_limit=job.context_limit, prompts=prompts)
    views = [predicate_view(RELEVANCE.format(document=d)) for d in job.documents]
    return DecisionJob(QUERY.format(query=job.query), views, context_limit=job.context_limit)


