"""Text and chats to token ids and back, as a language or vision model reads them (POST /tokenize and
/detokenize).

A chat is rendered by the same code as a chat completion's prompt (chat_prompt.build_prompt, with the
model's template, tools natively or described in the system message), so with the default options
its count is the `usage.prompt_tokens` that /v1/chat/completions reports for the same messages. A
text prompt is encoded as /v1/completions encodes one. Nothing is trimmed to fit: the count says
how long the prompt is, and `max_model_len` what the server would let it be.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from swama.engine.errors import BadInput
from swama.engine.kinds.tasks import IMAGES_NEED_VISION
from swama.engine.kinds.vision import MULTIMODAL_CONTEXT_LIMIT, vision_of
from swama.engine.model import LoadedModel
from swama.engine.text.chat_prompt import TemplateOptions, build_prompt
from swama.engine.text.generator import native_tools

# Parameters of `apply_chat_template` itself: chat_template_kwargs may set template variables, never
# these (they would change what the call returns, or swap the model's template for the client's).
TEMPLATE_CALL_PARAMETERS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})
BOTH_PROMPTS = ("add_generation_prompt and continue_final_message cannot both be true; set add_generation_prompt "
                "to false to continue the final message.")


@dataclass
class TokenizeJob:
    """What to tokenize: a text `prompt`, or chat `messages` (with `tools` and `images`) in the form
    `ChatRequest.messages` takes them."""

    prompt: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    images: list[Any] = field(default_factory=list)  # PIL images for the messages' image parts, in order
    # Special tokens the tokenizer adds on its own (a BOS, say); a chat's template writes its own.
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    token_strs: bool = False  # also each token as the vocabulary writes it

    def check(self) -> None:
        """BadInput for options that contradict each other; cheap, so it runs before a model loads."""
        if self.prompt is None and not self.messages:
            raise BadInput("A prompt or at least one message is required.")
        if self.add_generation_prompt and self.continue_final_message:
            raise BadInput(BOTH_PROMPTS, param="continue_final_message")
        for name in sorted(self.template_kwargs):
            if name in TEMPLATE_CALL_PARAMETERS:
                raise BadInput(f"chat_template_kwargs may not set '{name}'; it is a parameter of the template "
                               "call, not a variable of the template.", param="chat_template_kwargs")


@dataclass(frozen=True)
class Tokenized:
    ids: list[int]
    token_strs: list[str] | None
    max_model_len: int  # the context limit this prompt is held to when it is generated from


def _options(job: TokenizeJob) -> dict[str, Any]:
    """Only what differs from a chat completion's rendering, so the default renders the same call."""
    options = dict(job.template_kwargs)
    if not job.add_generation_prompt:
        options["add_generation_prompt"] = False
    if job.continue_final_message:
        options["continue_final_message"] = True
    return options


def _chat_ids(model: LoadedModel, job: TokenizeJob) -> list[int]:
    if not model.has_chat_template:
        raise BadInput("This model has no chat template; it cannot tokenize messages.")
    vision = vision_of(model)
    if job.images and vision is None:
        raise BadInput(IMAGES_NEED_VISION, code="invalid_image")
    options = _options(job)
    tokenizer = TemplateOptions(model.tokenizer, options) if options else model.tokenizer
    # No limit: build_prompt trims a prompt that does not fit, and the count is of the whole prompt.
    prompt = build_prompt(tokenizer, job.messages, job.tools, sys.maxsize, native_tools(model))
    if job.images:  # the processor expands each image's placeholder, as a chat completion's prefill does
        return vision.process(prompt.text, job.images).ids
    if job.add_special_tokens:
        return list(model.tokenizer.encode(prompt.text, add_special_tokens=True))
    return prompt.ids


def tokens_of(model: LoadedModel, job: TokenizeJob, context_limit: int) -> Tokenized:
    """The job's tokens on `model` (a worker thread: tokenizers and templates are CPU work)."""
    job.check()
    if job.prompt is not None:
        ids = list(model.tokenizer.encode(job.prompt, add_special_tokens=job.add_special_tokens))
    else:
        ids = _chat_ids(model, job)
    strs = None
    if job.token_strs:  # the response promises strings: an id without one (a tokenizer writes none) is ""
        strs = [s if isinstance(s, str) else "" for s in _tokenizer_of(model).convert_ids_to_tokens(ids)]
    limit = min(context_limit, MULTIMODAL_CONTEXT_LIMIT) if job.images else context_limit
    return Tokenized(ids, strs, limit)


def _tokenizer_of(model: LoadedModel) -> Any:
    """The Hugging Face tokenizer under mlx-lm's wrapper (the wrapper forwards attributes, not len())."""
    return getattr(model.tokenizer, "_tokenizer", model.tokenizer)


def vocabulary_size(model: LoadedModel) -> int:
    """How many ids the tokenizer can write, added tokens included: the ids /detokenize takes."""
    return len(_tokenizer_of(model))


def text_of(model: LoadedModel, ids: list[int]) -> str:
    """The text of token ids, special tokens included, as the tokenizer decodes them."""
    size = vocabulary_size(model)
    bad = next((t for t in ids if not 0 <= t < size), None)
    if bad is not None:
        raise BadInput(f"Token id {bad} is outside the model's vocabulary (0-{size - 1}).", param="tokens")
    return model.tokenizer.decode(ids)
