"""The routes on a server whose key/value caches are quantized (--kv-bits 8, then 4), held to the same
assertions as on the full-precision server: the route modules' own tests, run here against it.

Decisions read their prompts with full-precision caches whatever --kv-bits says (their caches live
for one pass), so the decision tests here include the one that compares scores with a direct
full-precision forward pass."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from conftest import SMOLLM2_ID, TINY_ID
from test_chat_live import (  # noqa: F401  (collected here, against the quantized server)
    test_concurrent_clients_and_a_disconnect,
    test_max_tokens_gives_length,
    test_non_streaming_answer,
    test_stop_sequences,
    test_streaming_answer,
    test_tool_round_trip,
)
from test_completions_live import (  # noqa: F401
    test_a_stream_gives_the_same_text,
    test_a_string_prompt,
    test_prompts_and_n_give_choices_in_openai_order,
    test_seeded_sampling_repeats,
    test_the_text_is_its_tokens_text,
)
from test_decisions_live import (  # noqa: F401
    smollm2,
    test_deterministic_and_independent_of_chat,
    test_openai_sdk_decisions,
    test_scores_equal_a_direct_computation,
    test_systemone_with_the_typesafe_sdk,
)
from test_responses_live import (  # noqa: F401
    test_function_call_round_trip,
    test_non_streaming_response,
    test_sdk_streaming,
    test_streaming_events_validate_and_count_up,
)

from live_server import LiveServer, rerun_against_kv_server

pytestmark = pytest.mark.slow


model_server, _answers_at_4_bits = rerun_against_kv_server()


@pytest.fixture(scope="module")
def client(kv_server: LiveServer) -> openai.OpenAI:
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
