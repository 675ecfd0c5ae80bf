"""Which requests ask for their prompt's cache to be kept longer: prompt_cache_key on chat completions
and responses, cache_control anywhere on Anthropic messages (the engine evicts those caches last)."""

from __future__ import annotations

from typing import Any

from swama.generated.openai_models import CreateChatCompletionRequest, CreateResponse
from swama.generated.routes import OPERATIONS
from swama.handlers.routes import chat, messages, responses

USER = [{"role": "user", "content": "Hi"}]


def test_chat_completions_keep_a_prompt_with_a_prompt_cache_key() -> None:
    def kept(extra: dict[str, Any]) -> bool:
        parsed = CreateChatCompletionRequest.model_validate({"model": "m", "messages": USER, **extra})
        return chat.request_from(parsed, 4096)[0].keep_prompt

    assert kept({"prompt_cache_key": "agent-1"}) and not kept({})


def test_responses_keep_a_prompt_with_a_prompt_cache_key() -> None:
    def kept(extra: dict[str, Any]) -> bool:
        parsed = CreateResponse.model_validate({"model": "m", "input": "Hi", **extra})
        return responses.response_request(parsed, context_limit=4096).chat.keep_prompt

    assert kept({"prompt_cache_key": "agent-1"}) and not kept({}) and not kept({"prompt_cache_key": ""})


def test_messages_keep_a_prompt_that_sets_cache_control_anywhere() -> None:
    model = OPERATIONS["createMessage"].request_model

    def kept(body: dict[str, Any]) -> bool:
        parsed = model.model_validate({"model": "m", "max_tokens": 8, **body})
        return messages.request_from(parsed, 4096)[0].keep_prompt

    ephemeral = {"type": "ephemeral"}
    assert kept({"system": [{"type": "text", "text": "Be brief.", "cache_control": ephemeral}], "messages": USER})
    assert kept({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi",
                                                               "cache_control": ephemeral}]}]})
    assert kept({"messages": USER, "cache_control": ephemeral})
    assert not kept({"system": "Be brief.", "messages": USER})
