"""POST /tokenize and /detokenize: the routes' own wording for what their generated models refuse.

/tokenize takes one of two bodies (vLLM's completion and chat forms). A body that fails both would
get pydantic's errors for both; the form is told by its key instead ("prompt" or "messages") and
the body worded as that form alone: the chat form as /v1/chat/completions words its messages and
tools, the completion form with the OpenAI default."""

from __future__ import annotations

from typing import Any

import pydantic

from swama.generated.tokenize_models import TokenizeChatRequest, TokenizeCompletionRequest
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import DEFAULT_RULES, RouteRules
from swama.handlers.http.schema_errors import openai_schema_error
from swama.handlers.routes.chat_wording import schema_error as chat_schema_error


def _form_error(exc: pydantic.ValidationError, data: Any = None) -> ApiError:
    if not isinstance(data, dict):
        return openai_schema_error(exc, data)
    has_prompt, has_messages = "prompt" in data, "messages" in data
    if has_prompt and has_messages:
        return bad_request("Send either 'prompt' (text to tokenize) or 'messages' (a chat to render and "
                           "tokenize), not both.", param="messages")
    if not has_prompt and not has_messages:
        return bad_request("Missing required field: 'prompt' (text to tokenize) or 'messages' (a chat to "
                           "render and tokenize).", code="missing_required_parameter", param="prompt")
    form, worded = ((TokenizeChatRequest, chat_schema_error) if has_messages
                    else (TokenizeCompletionRequest, openai_schema_error))
    try:
        form.model_validate(data)
    except pydantic.ValidationError as alone:
        return worded(alone, data)
    return openai_schema_error(exc, data)  # not reached: the form failed inside the union as well


# The request model is a union of the two forms (a RootModel whose one field is `root`); the fields
# each form acts on are checked by the handler (routes/tokenize.py `refuse_unhandled`).
TOKENIZE_RULES = RouteRules(schema_error=_form_error, handled=frozenset({"root"}))
COMPLETION_FIELDS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
CHAT_FIELDS = frozenset({"model", "messages", "add_generation_prompt", "continue_final_message",
                         "add_special_tokens", "return_token_strs", "chat_template_kwargs", "tools"})
DETOKENIZE_RULES = RouteRules(handled=frozenset({"model", "tokens"}))


def refuse_unhandled(form: pydantic.BaseModel) -> None:
    """A field the form's model accepts but the route does not act on is refused by name, never
    ignored (what the pipeline does for a route whose body is one model)."""
    handled = CHAT_FIELDS if isinstance(form, TokenizeChatRequest) else COMPLETION_FIELDS
    for name in sorted(form.model_fields_set - handled):
        if getattr(form, name) is not None:
            raise DEFAULT_RULES.unhandled(name)
