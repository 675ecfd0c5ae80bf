"""A request's choices join the batch in one turn (engine/serving/siblings.py): held until all have
come, or until the wait runs out for one that never comes."""

from __future__ import annotations

from precision import F64_ARITHMETIC

from swama.engine.serving.siblings import WAIT, Siblings


def _siblings() -> Siblings[tuple[str, tuple[str, int] | None]]:
    return Siblings(lambda job: job[1])


def test_choices_are_held_until_every_one_has_come() -> None:
    s = _siblings()
    a0, a1, a2 = ("a0", ("a", 3)), ("a1", ("a", 3)), ("a2", ("a", 3))
    alone = ("x", None)
    assert s.admit([a0, alone], now=0.0) == [alone]
    assert s and s.held() == [a0]
    assert s.admit([a1], now=0.01) == []
    assert s.admit([a2], now=0.02) == [a0, a1, a2]
    assert not s and s.held() == []


def test_a_group_that_never_completes_goes_at_its_deadline() -> None:
    s = _siblings()
    b0 = ("b0", ("b", 2))
    assert s.admit([b0], now=10.0) == []
    assert abs(s.wait(None, now=10.1) - (WAIT - 0.1)) < F64_ARITHMETIC  # float64 times near 10
    assert s.wait(0.05, now=10.1) == 0.05  # an earlier heartbeat still wakes the scheduler
    assert s.admit([], now=10.0 + WAIT / 2) == []
    assert s.admit([], now=10.0 + WAIT) == [b0]
    assert s.wait(None) is None


def test_one_choice_and_no_group_pass_at_once() -> None:
    s = _siblings()
    one, plain = ("c0", ("c", 1)), ("p", None)
    assert s.admit([one, plain], now=0.0) == [one, plain]
    assert not s
