"""The choices of one request join the batch in the same turn.

A request for n choices (/v1/completions `n`, or several prompts) is n generations, each submitted to
the scheduler on its own. A row's logits depend, in their last bits, on the rows beside it in each
step, so a seeded choice that joined alone one time and beside its siblings the next could sample
other tokens. Held here until every sibling has arrived, the choices of a request that runs alone
take the same steps every time. A sibling that never comes (its preparation failed, its client
left) holds the others back at most WAIT seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

J = TypeVar("J")
WAIT = 0.5  # seconds a request's first choice waits for the others


@dataclass
class _Group(Generic[J]):
    deadline: float
    count: int
    jobs: list[J] = field(default_factory=list)


@dataclass
class Siblings(Generic[J]):
    key_of: Callable[[J], tuple[str, int] | None]  # a job's request's (group id, choices in the group)
    _groups: dict[str, _Group[J]] = field(default_factory=dict)

    def admit(self, arrived: Iterable[J], now: float | None = None) -> list[J]:
        """Of the jobs `arrived` and those held, the ones to insert now, in arrival order: jobs of no
        group, and the groups complete or past their deadline."""
        now = time.monotonic() if now is None else now
        out: list[J] = []
        for job in arrived:
            key = self.key_of(job)
            if key is None or key[1] <= 1:
                out.append(job)
                continue
            group = self._groups.setdefault(key[0], _Group(now + WAIT, key[1]))
            group.jobs.append(job)
        for name, group in list(self._groups.items()):
            if len(group.jobs) >= group.count or now >= group.deadline:
                out.extend(group.jobs)
                del self._groups[name]
        return out

    def wait(self, idle: float | None, now: float | None = None) -> float | None:
        """How long the scheduler may sleep: `idle` (None: until woken), or less, until a held group's
        deadline."""
        if not self._groups:
            return idle
        now = time.monotonic() if now is None else now
        left = max(0.0, min(g.deadline for g in self._groups.values()) - now)
        return left if idle is None else min(idle, left)

    def held(self) -> list[J]:
        return [job for group in self._groups.values() for job in group.jobs]

    def clear(self) -> None:
        self._groups.clear()

    def __bool__(self) -> bool:
        return bool(self._groups)
