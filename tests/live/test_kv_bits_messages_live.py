"""Anthropic's Messages route on a server whose key/value caches are quantized (--kv-bits 8, then 4),
held to the assertions it meets at full precision: its module's own tests, run here against it."""

from __future__ import annotations

import anthropic
import pytest
from test_messages_live import (  # noqa: F401  (collected here, against the quantized server)
    test_count_tokens_matches_create_usage,
    test_create_answers_in_anthropics_shape,
    test_prompt_cache_reads_show_in_usage,
    test_raw_stream_has_anthropics_event_names,
    test_stop_sequences_and_max_tokens,
    test_stream_events_match_the_sdk_accumulator,
    test_tool_use_round_trip,
)

from live_server import LiveServer, rerun_against_kv_server

pytestmark = pytest.mark.slow


model_server, _answers_at_4_bits = rerun_against_kv_server()


@pytest.fixture(scope="module")
def client(kv_server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=kv_server.url, api_key="local", max_retries=0, timeout=300)
