"""POST /tokenize and POST /detokenize: vLLM's tokenizer routes, on any installed language or vision model.

The chat form's messages and tools are the chat route's components (the tokenize document copies
them), so they are read by the chat route's own conversion: the same turns, the same tools, the same
refusals, and the engine renders them as it renders a chat completion's prompt."""

from __future__ import annotations

from typing import Any

from swama.engine.client import Sampling, Task, Tokenized, TokenizeJob
from swama.generated.tokenize_models import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeRequest,
)
from swama.handlers.http.pipeline import Call, route
from swama.handlers.routes.chat import tools_from, turns_from
from swama.handlers.routes.tokenize_wording import DETOKENIZE_RULES, TOKENIZE_RULES, refuse_unhandled
from swama.handlers.routes.turns import attach_images, chat_request, image_refs


async def _chat_job(call: Call, form: TokenizeChatRequest) -> tuple[str, TokenizeJob]:
    turns = turns_from(form.messages)
    # The chat route's conversion (adjacent system turns merged, tools in the template's form); the
    # context limit is not applied here, only reported.
    chat = chat_request(turns, sampling=Sampling(), context_limit=call.settings.context_limit,
                        tools=tools_from(form.tools))
    installed = call.engine.model_for(form.model, Task.GENERATE)
    await attach_images(call.engine, chat, image_refs(turns), installed,
                        private_allowed=call.settings.allow_private_urls)
    return installed.id, TokenizeJob(
        messages=chat.messages, tools=chat.tools, images=chat.images, add_special_tokens=form.add_special_tokens,
        add_generation_prompt=form.add_generation_prompt, continue_final_message=form.continue_final_message,
        template_kwargs=dict(form.chat_template_kwargs or {}), token_strs=bool(form.return_token_strs))


def _answer(result: Tokenized) -> dict[str, Any]:
    return {"count": len(result.ids), "max_model_len": result.max_model_len, "tokens": result.ids,
            "token_strs": result.token_strs}


@route(TOKENIZE_RULES)
async def tokenize(call: Call, parsed: TokenizeRequest) -> dict[str, Any]:
    form = parsed.root
    refuse_unhandled(form)
    if isinstance(form, TokenizeCompletionRequest):
        model_id = call.engine.model_for(form.model, Task.GENERATE).id
        job = TokenizeJob(prompt=form.prompt, add_special_tokens=form.add_special_tokens,
                          token_strs=bool(form.return_token_strs))
    else:
        model_id, job = await _chat_job(call, form)
    return _answer(await call.engine.tokenize(model_id, job))


@route(DETOKENIZE_RULES)
async def detokenize(call: Call, parsed: DetokenizeRequest) -> dict[str, Any]:
    model_id = call.engine.model_for(parsed.model, Task.GENERATE).id
    ids = [token.root for token in parsed.tokens]  # each id is a constrained RootModel of the generator's
    return {"prompt": await call.engine.detokenize(model_id, ids)}
