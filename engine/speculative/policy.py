"""When a batch drafts, and how far: per row, its acceptance so far; per batch, what a wider pass costs.

A speculative step runs one pass of 1 + m positions for every row, so its cost is the batch's, while
its gain is each row's: a row whose drafts are accepted at rate `a` per token gains
a + a² + … + a^m tokens over the one a plain step gives it. `auto` picks the width that gives the
most tokens per second by that sum and by the measured time of passes of each width at this batch
size (`Costs`), and takes a plain, pipelined step when no width beats it; `ngram` and `draft` always
verify the drafts they find. A row whose lookups keep finding nothing, or whose drafts keep being
rejected, rests for a while (longer each time) so the batch can run plain steps back to back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from swama.engine.settings import EngineSettings
from swama.engine.speculative.ngram import LONGEST, SHORTEST, PromptLookup

MODES = ("off", "ngram", "draft", "auto")
PRIOR_ACCEPTED, PRIOR_TRIALS = 1.0, 2.0  # a new row's acceptance: one in two, until it has drafted
DECAY = 0.7  # weight of a row's earlier verifications against its latest
SLOPE = 0.12  # before any measurement: each extra position costs this fraction of a plain pass
MARGIN = 1.15  # a wider pass must promise this much more than a plain step
REST_CAP = 32  # steps a row rests at most before it looks again
PROBE_EVERY, PROBE_CAP = 8, 64  # steps a row with drafts goes unverified before auto verifies a few anyway
PROBE_GAP = 32  # plain steps in a row the batch takes before it spends a step on a probe
PROBE_WIDTH = 4  # drafted tokens a probe verifies


@dataclass(eq=False)
class Row:
    """One row's drafting state."""

    able: bool  # no logits processor that must see every token once (log probabilities, a grammar)
    greedy: bool
    lookup: PromptLookup | None = None
    accepted: float = PRIOR_ACCEPTED  # decayed sums: accepted drafts, and verifications of a draft token
    trials: float = PRIOR_TRIALS
    misses: int = 0  # lookups or verifications in a row that gained nothing
    rest: int = 0  # steps left before it drafts again
    idle: int = 0  # steps since its drafts were last verified
    probe_every: int = PROBE_EVERY

    @property
    def rate(self) -> float:
        return self.accepted / self.trials

    def expected(self, m: int) -> float:
        """Tokens a step gives this row with `m` drafted tokens to verify."""
        a = self.rate
        return 1.0 + sum(a ** j for j in range(1, m + 1))

    @property
    def due(self) -> bool:
        """Whether auto should verify this row's drafts even at a loss: its acceptance is only known
        from verifications (and a busy batch may have stopped verifying any)."""
        return self.idle >= self.probe_every

    def verified(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.idle = 0
        self.probe_every = PROBE_EVERY if accepted else min(PROBE_CAP, 2 * self.probe_every)
        self.accepted = DECAY * self.accepted + accepted
        self.trials = DECAY * self.trials + accepted + (1 if accepted < drafted else 0)
        self._gained(accepted > 0)

    def looked_up(self, found: bool) -> None:
        if not found:
            self._gained(False)

    def _gained(self, gained: bool) -> None:
        if gained:
            self.misses = 0
            return
        self.misses += 1
        if self.misses >= 2:
            self.rest = min(REST_CAP, 2 ** (self.misses - 1))


@dataclass(frozen=True)
class Speculation:
    """How a model's batch drafts: the mode (`MODES`) and the most tokens a row drafts in one step."""

    mode: str = "off"
    max_draft: int = 8
    ngram: tuple[int, int] = (SHORTEST, LONGEST)  # the n-gram sizes prompt lookup matches, shortest first
    # Choose widths from measured pass times; off on ranks, where every rank must choose alike.
    measured: bool = True

    @property
    def on(self) -> bool:
        return self.mode != "off"


def speculation_of(settings: EngineSettings) -> Speculation:
    """What the server's options ask of every batch (--speculative, --draft-tokens)."""
    return Speculation(settings.speculative, settings.draft_tokens)


def for_device(speculation: Speculation, gpu: bool) -> Speculation:
    """`auto` drafts on the CPU only. A GPU decodes a step in milliseconds, in which the host work of
    a speculative step (lookups, reading the pass back before the next one) costs more than drafts
    save: on an H200, SmolLM2 with auto ran at 0.81-0.85x of plain decoding at 1 client and about
    0.5x at 8 (docs/benchmarks.md). `ngram` and `draft` still draft there when asked."""
    if gpu and speculation.mode == "auto":
        return replace(speculation, mode="off")
    return speculation


def _bucket(rows: int) -> int:
    return min(rows.bit_length(), 6)  # 1, 2-3, 4-7, …, 32+


@dataclass
class Costs:
    """Measured seconds of a pass of each width, per batch-size bucket (decayed means)."""

    seconds: dict[tuple[int, int], float] = field(default_factory=dict)
    measured: bool = True
    plain_run: int = 0  # plain steps since the last wider one

    def record(self, rows: int, width: int, seconds: float) -> None:
        self.plain_run = self.plain_run + 1 if width == 1 else 0
        if not self.measured:
            return
        key = (_bucket(rows), width)
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def ratio(self, rows: int, width: int) -> float:
        """A pass of `width` positions per row over a plain one, at this batch size."""
        if width == 1:
            return 1.0
        bucket = _bucket(rows)
        plain, wide = self.seconds.get((bucket, 1)), self.seconds.get((bucket, width))
        if plain and wide:
            return wide / plain
        return 1.0 + SLOPE * (width - 1)


def choose_width(mode: str, rows: list[Row | None], drafts: list[list[int]], costs: Costs, batch: int) -> int:
    """Positions per row of this step's pass: 1 for a plain step."""
    longest = max((len(d) for d in drafts), default=0)
    if longest == 0 or mode != "auto":
        return 1 + longest
    best_width, best = 1, 0.0
    for m in range(1, longest + 1):
        gain = sum(row.expected(min(m, len(d))) if row is not None else 1.0 for row, d in zip(rows, drafts, strict=True))
        value = gain / costs.ratio(batch, 1 + m)
        if value > best:
            best_width, best = 1 + m, value
    if best > batch * MARGIN:
        return best_width
    if costs.plain_run < PROBE_GAP:  # probes are rare, whatever the number of rows that are due
        return 1
    probes = [len(d) for row, d in zip(rows, drafts, strict=True) if d and row is not None and row.due]
    return 1 + min(max(probes), PROBE_WIDTH) if probes else 1
