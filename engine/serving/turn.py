"""What one scheduler step holds, as rank 0 decides it and shares it with the other ranks.

Every rank keeps the same batch, prompt cache and decision runs, so the plan names only what rank 0
alone can know: which requests join (their prompt tokens, token budget, sampling and output constraint, with a seed
rank 0 drew when the client gave none), which rows leave (their clients went away or met a stop
sequence), which decision work runs. The forward passes that follow are the same on every rank.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from swama.engine.text.generator import Sampling
from swama.engine.text.grammar import Constraint


@dataclass
class Insert:
    """A request joining the batch: its rendered prompt, its token budget and its sampling. Each rank
    resumes it from its own prompt cache; the ranks then agree on the prefix (serving/scheduler.py)."""

    ids: list[int]
    budget: int
    sampling: Sampling
    constraint: Constraint | None = None  # a structured output: every rank masks the same tokens
    batch: bool = False  # a batch job's line: every rank's admission orders it the same way
    keep: bool = False  # its prompt's cache is kept longer: every rank evicts the same entries


@dataclass
class DecisionPrefill:
    """A decision request's questions prepared and their shared prefix read into the cache."""

    key: int
    job: Any  # decide.DecisionJob
    prefix_reuse: bool


@dataclass
class DecisionBatch:
    """A decision request's next questions scored in its own batched passes, with rank 0's bounds."""

    key: int
    max_rows: int | None
    logits_bytes: int
    cache_bytes: int


@dataclass
class PromptScore:
    """A prompt's tokens scored in one forward pass (log probabilities for /v1/completions' echo)."""

    ids: list[int]
    top: int
    temperature: float


@dataclass
class Turn:
    inserts: list[Insert] = field(default_factory=list)
    removals: list[int] = field(default_factory=list)  # batch rows (uids) taken out
    task: DecisionPrefill | DecisionBatch | PromptScore | None = None
    # The decision pass of this step: None when there is none; else the rows (run key, question
    # index) launched now, possibly none while the pass launched last step is read back.
    decision_rows: list[tuple[int, int]] | None = None
    forget: list[int] = field(default_factory=list)  # decision runs that ended

    @property
    def empty(self) -> bool:
        return not (self.inserts or self.removals or self.task or self.decision_rows is not None or self.forget)

    def encode(self) -> bytes:
        return b"" if self.empty else pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decode(payload: bytes) -> Turn:
        # The payload comes from rank 0 of this group: processes this server started itself.
        return pickle.loads(payload) if payload else Turn()
