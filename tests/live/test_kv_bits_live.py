"""The routes on a server whose key/value caches are quantized (--kv-bits 8, then 4), held to the same
assertions as on the full-precision server: one representative of each route module's own tests, run
here against it, and the setting's own tests. The route modules test each route's behaviour; these
test that quantized caches serve it: batched, concurrent and cancelled rows (chat), seeded sampling
with sibling choices (completions), streamed events with the answer read (responses, Anthropic's
messages), a prompt cache hit (messages), and decisions.

Decisions read their prompts with full-precision caches whatever --kv-bits says (their caches live
for one pass), so the decision tests here include the one that compares scores with a direct
full-precision forward pass."""

from __future__ import annotations

import re

import anthropic
import httpx
import openai
import pytest
from conftest import SMOLLM2_ID, TINY_ID
from test_chat_live import test_concurrent_clients_and_a_disconnect  # noqa: F401  (collected here, quantized)
from test_completions_live import test_seeded_sampling_repeats  # noqa: F401
from test_decisions_live import (  # noqa: F401
    smollm2,
    test_scores_equal_a_direct_computation,
    test_systemone_with_the_typesafe_sdk,
)
from test_messages_live import (  # noqa: F401
    test_prompt_cache_reads_show_in_usage,
    test_stream_events_match_the_sdk_accumulator,
)
from test_responses_live import test_streaming_events_validate_and_count_up  # noqa: F401

from live_server import LiveServer, rerun_against_kv_server

pytestmark = pytest.mark.slow


model_server, _answers_at_4_bits = rerun_against_kv_server()


@pytest.fixture
def client(request: pytest.FixtureRequest, kv_server: LiveServer) -> openai.OpenAI | anthropic.Anthropic:
    """The client each collected test expects: its module's own (the messages tests take Anthropic's)."""
    if request.function.__module__ == "test_messages_live":
        return anthropic.Anthropic(base_url=kv_server.url, api_key="local", max_retries=0, timeout=300)
    return openai.OpenAI(base_url=kv_server.v1, api_key="sk-local", max_retries=0, timeout=300)


def test_the_catalog_and_metrics_say_what_is_in_force(kv_server: LiveServer, client: openai.OpenAI) -> None:
    catalog = {m["name"]: m for m in httpx.get(f"{kv_server.v1}/models", timeout=30).json()["models"]}
    bits = catalog[SMOLLM2_ID]["x_kv_cache"]["bits"]
    assert bits in (4, 8)
    assert catalog[SMOLLM2_ID]["x_kv_cache"] == {"bits": bits, "group_size": 32, "quantize_after": 0}
    # The tiny model's heads of 16 values cannot be grouped: it keeps full precision, and says so.
    assert catalog[TINY_ID]["x_kv_cache"] == {"bits": None, "group_size": None, "quantize_after": None}
    client.chat.completions.create(model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    text = httpx.get(f"{kv_server.url}/metrics", timeout=30).text
    assert re.search(rf'^swama_kv_bits{{model="{SMOLLM2_ID}"}} {bits}\.0$', text, re.M), text[-2000:]
