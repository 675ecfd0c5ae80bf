"""Thinking kept apart from the answer, for models whose chat template thinks.

Qwen3 writes `<think>…</think>` before its answer; templates such as Qwen3.5's or DeepSeek-R1's open the
block in the prompt itself. `markers(model)` finds a model's think markers (none: the model does not
think, and nothing here applies), `prompt_opens(…)` whether a rendered prompt leaves a block open,
`ReasoningSplitter` splits generated text into thinking and answer, and `ThinkingBudget` is the logits
processor that closes a block once it has used its token budget.

How a request asks (`ChatRequest.thinking`): None keeps the template's default; True or False is
passed to the template as its thinking switch (`enable_thinking`, which mlx-lm's tokenizer maps to
the template's own name for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swama.engine.model import LoadedModel

# Effort names of the OpenAI routes (chat `reasoning_effort`, responses `reasoning.effort`) as a
# switch and a token budget: none/minimal turn thinking off; low and medium bound it; high, xhigh
# and max leave it to max_tokens.
EFFORT_BUDGETS: dict[str, tuple[bool, int | None]] = {
    "none": (False, None), "minimal": (False, None), "low": (True, 1024), "medium": (True, 4096),
    "high": (True, None), "xhigh": (True, None), "max": (True, None),
}

# Generated tokens before which a block must have opened to count as thinking.
OPENING_WINDOW = 8


@dataclass(frozen=True)
class ThinkMarkers:
    start: str
    end: str
    end_ids: tuple[int, ...]  # what a budget forces to close the block


def _find_markers(tokenizer: Any) -> ThinkMarkers | None:
    if getattr(tokenizer, "has_thinking", False):
        start, end = tokenizer.think_start, tokenizer.think_end
    else:  # markers that are not single tokens of the vocabulary, named by the template itself
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or "<think>" not in template or "</think>" not in template:
            return None
        start, end = "<think>", "</think>"
    return ThinkMarkers(start, end, tuple(tokenizer.encode(end, add_special_tokens=False)))


@dataclass(frozen=True)
class _Found:
    """Kept beside a model: its think markers, None where it does not think."""

    markers: ThinkMarkers | None


def markers(model: LoadedModel) -> ThinkMarkers | None:
    """The model's think markers, or None for a model that does not think (kept with the model)."""
    return model.beside.setdefault(_Found, lambda: _Found(_find_markers(model.tokenizer))).markers


def prompt_opens(found: ThinkMarkers | None, text: str) -> bool:
    """Whether a rendered prompt ends inside a think block (its answer starts as thinking)."""
    return found is not None and text.rfind(found.start) > text.rfind(found.end)


def effort(name: str | None) -> tuple[bool | None, int | None]:
    """An OpenAI effort name as (thinking switch, budget); (None, None) when none is given."""
    if name is None:
        return None, None
    return EFFORT_BUDGETS[name]


class ReasoningSplitter:
    """Feeds on answer text; returns (thinking, answer) text that is safe to show.

    Thinking starts when the prompt left a block open, or when the output opens one before any
    answer text. Text that may be part of a marker is held back until decided, and so is whitespace
    at the edges of the thinking: the newlines around it are the template's, not the model's words."""

    def __init__(self, found: ThinkMarkers, opened: bool) -> None:
        self.start, self.end = found.start, found.end
        self.state = "open" if opened else "before"  # before | open | inside | closed | after
        self.buffer = ""

    @property
    def thinking(self) -> bool:
        return self.state in ("open", "inside")

    def feed(self, text: str) -> tuple[str, str]:
        self.buffer += text
        thought, answer = "", ""
        while True:
            if self.state == "before":
                lead = self.buffer.lstrip()
                if lead.startswith(self.start):
                    self.buffer, self.state = lead[len(self.start):], "open"
                    continue
                if self.start.startswith(lead):
                    return thought, answer  # still maybe an opening marker
                self.state = "after"
                continue
            if self.state == "open":  # the newline after the marker is not thinking
                self.buffer = self.buffer.lstrip("\n")
                if not self.buffer:
                    return thought, answer
                self.state = "inside"
                continue
            if self.state == "inside":
                at = self.buffer.find(self.end)
                if at >= 0:
                    thought += self.buffer[:at].rstrip()
                    self.buffer, self.state = self.buffer[at + len(self.end):], "closed"
                    continue
                keep = _partial_suffix(self.buffer, self.end)
                body = self.buffer[: len(self.buffer) - keep]
                shown = body.rstrip()  # trailing whitespace waits: the marker may follow it
                thought += shown
                self.buffer = self.buffer[len(shown):]
                return thought, answer
            if self.state == "closed":  # the blank line between thinking and answer is the template's
                self.buffer = self.buffer.lstrip()
                if not self.buffer:
                    return thought, answer
                self.state = "after"
                continue
            answer += self.buffer
            self.buffer = ""
            return thought, answer

    def finish(self) -> tuple[str, str]:
        """What is held back once the output ends: unclosed thinking stays thinking."""
        rest, self.buffer = self.buffer, ""
        if self.state in ("open", "inside"):
            return rest.rstrip(), ""
        if self.state == "closed":
            return "", rest.lstrip()
        return "", rest


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ThinkingBudget:
    """The logits processor that closes a think block after `budget` thinking tokens: from then on
    it allows only the closing marker's tokens, one per step, and then steps aside.

    mlx-lm calls it once per step with the row's tokens so far (the first call: the prompt's), so
    each later call reads the token sampled last. Marker text is matched on a few decoded tokens,
    as a marker need not be one token."""

    once_per_token = True  # keeps state per call: speculative steps do not draft for its row

    def __init__(self, tokenizer: Any, found: ThinkMarkers, opened: bool, budget: int) -> None:
        self.tokenizer = tokenizer
        self.found = found
        # How many recent tokens can hold each marker (a few beside it: merges at its edges).
        self.windows = {m: len(tokenizer.encode(m, add_special_tokens=False)) + 2 for m in (found.start, found.end)}
        self.budget = budget
        self.state = "inside" if opened else "before"  # before | inside | forcing | done
        self.calls = 0
        self.used = 0  # thinking tokens so far
        self.recent: list[int] = []
        self.forced = 0  # closing tokens forced so far

    def _saw(self, marker: str) -> bool:
        return marker in self.tokenizer.decode(self.recent[-self.windows[marker]:])

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        self.calls += 1
        if self.calls > 1 and self.state != "done":
            self.recent.append(int(tokens[-1].item()))
            if self.state == "before":
                if self._saw(self.found.start):
                    self.state, self.recent = "inside", []
                elif len(self.recent) >= OPENING_WINDOW:
                    self.state = "done"  # the answer began without thinking
            elif self.state == "inside":
                self.used += 1
                if self._saw(self.found.end):
                    self.state = "done"
            elif self.state == "forcing" and self.forced == len(self.found.end_ids):
                self.state = "done"
        if self.state == "inside" and self.used >= self.budget:
            self.state = "forcing"
        if self.state != "forcing":
            return logits
        token = self.found.end_ids[self.forced]
        self.forced += 1
        keep = mx.arange(logits.shape[-1]) == token
        return mx.where(keep, logits, mx.array(-mx.inf, dtype=logits.dtype))
