"""Prompt format 1: the per-question content string (values become text through
``questions.render_text``)."""

from __future__ import annotations

from collections.abc import Sequence

from .questions import QuestionView

PROMPT_FORMAT_VERSION = 1

CHOICE_CLOSING = "Answer with the letter of one option only."
SCORE_CLOSING = "Answer with the number of one level only."
YES_NO_CLOSING = "Answer with yes or no only."
YES_NO_OPENING = "Is the following true?"


def _is_blank(text: str) -> bool:
    return not text.strip()


def build_content(text: str, view: QuestionView, labels: Sequence[str]) -> str:
    """The user message for one question: ``text``, a blank line, then the question lines.

    There is no trailing newline. Option names are inserted raw; a detail is shown only when it
    is not ``""``.
    """
    if len(labels) != view.option_count:
        raise ValueError(f"{len(labels)} labels for {view.option_count} options")
    lines: list[str] = []
    if view.kind == "yes_no":
        lines.append(YES_NO_OPENING if _is_blank(view.question) else f"{YES_NO_OPENING} {view.question}")
        lines.extend(
            f"{label}: {detail}" for label, detail in zip(labels, view.option_details, strict=True) if detail
        )
        lines.append(YES_NO_CLOSING)
    elif view.kind == "choice":
        if not _is_blank(view.question):
            lines.append(f"Question: {view.question}")
        for label, name, detail in zip(labels, view.option_names, view.option_details, strict=True):
            lines.append(f"{label}: {name} - {detail}" if detail else f"{label}: {name}")
        lines.append(CHOICE_CLOSING)
    elif view.kind == "score":
        if not _is_blank(view.question):
            lines.append(f"Question: {view.question}")
        lines.extend(f"{label}: {level}" for label, level in zip(labels, view.option_details, strict=True))
        lines.append(SCORE_CLOSING)
    else:
        raise ValueError(f"unknown question kind {view.kind!r}")
    return "\n".join([text, "", *lines])
