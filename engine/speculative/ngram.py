"""Prompt lookup: drafts copied from the row's own text.

Output that repeats its input (a file returned with one change, an agent echoing paths and code,
a quoted passage) continues the way the earlier copy did. The index maps every n-gram of the row's
tokens (prompt and output so far, n = 1 .. `longest`) to where its latest occurrence ends; a draft
is what followed the latest earlier occurrence of the row's last n tokens, the longest n that has
one (at least `shortest`, since a single repeated token predicts little). Indexing a token costs
`longest` dictionary writes, so the index grows with the row and a lookup costs the same at any
length.
"""

from __future__ import annotations

LONGEST = 4  # n-gram sizes tried, longest first
SHORTEST = 2


class PromptLookup:
    def __init__(self, longest: int = LONGEST, shortest: int = SHORTEST) -> None:
        self.longest, self.shortest = longest, shortest
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self._before: dict[tuple[int, ...], int] = {}  # the occurrence before the latest

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, tokens: list[int]) -> None:
        """Index tokens that follow the ones already indexed."""
        seq = self.tokens
        for token in tokens:
            seq.append(token)
            end = len(seq)
            for n in range(1, min(self.longest, end) + 1):
                key = tuple(seq[end - n:end])
                last = self._ends.get(key)
                if last is not None:
                    self._before[key] = last
                self._ends[key] = end

    def draft(self, last: int, k: int) -> list[int]:
        """Up to `k` tokens to follow the indexed tokens and then `last` (not yet indexed)."""
        if k <= 0:
            return []
        seq = self.tokens
        for n in range(self.longest, self.shortest - 1, -1):
            if n - 1 > len(seq):
                continue
            end = self._ends.get((*seq[len(seq) - n + 1:], last) if n > 1 else (last,))
            if end is not None:
                # The earlier copy goes on with seq[end:], then `last` where it reaches the end.
                drafted = seq[end:end + k]
                if len(drafted) < k and end + len(drafted) == len(seq):
                    drafted.append(last)
                return drafted
        return []

    def follow(self, k: int) -> list[int]:
        """Up to `k` tokens to follow the indexed tokens themselves (what followed the latest earlier
        occurrence of their last n tokens): a guess at the token being sampled now, then a draft."""
        seq = self.tokens
        for n in range(self.longest, self.shortest - 1, -1):
            if n > len(seq):
                continue
            key = tuple(seq[len(seq) - n:])
            end = self._ends.get(key)
            if end == len(seq):  # that is the suffix itself: the occurrence before it
                end = self._before.get(key)
            if end is not None:
                return seq[end:end + k]
        return []
