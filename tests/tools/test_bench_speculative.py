"""The speculative-decoding benchmark's pure parts (tools/bench/speculative.py): prompts, /metrics parsing,
draft figures and the spread of rounds. No server is started."""

from __future__ import annotations

import math

import pytest
from precision import F64_ARITHMETIC

from tools.bench import speculative as bench
from tools.bench.chat import Sample

METRICS = '''# HELP swama_generated_tokens_total Tokens generated
# TYPE swama_generated_tokens_total counter
swama_generated_tokens_total{model="m"} 300.0
# TYPE swama_generated_tokens_created gauge
swama_generated_tokens_created{model="m"} 1.7e9
# TYPE swama_accepted_draft_tokens_total counter
swama_accepted_draft_tokens_total{model="m"} 120.0
# TYPE swama_draft_tokens counter
swama_draft_tokens_total{model="m"} 200.0
# TYPE swama_decode_steps counter
swama_decode_steps_total{model="m",kind="speculative"} 40.0
swama_decode_steps_total{model="m",kind="plain"} 60.0
# TYPE swama_kv_cache_usage gauge
swama_kv_cache_usage 0.5
# TYPE swama_time_to_first_token_seconds histogram
swama_time_to_first_token_seconds_bucket{model="m",le="0.1"} 3.0
swama_time_to_first_token_seconds_count{model="m"} 3.0
swama_time_to_first_token_seconds_sum{model="m"} 0.2
# TYPE swama_draft_acceptance_rate gauge
swama_draft_acceptance_rate{model="m"} 0.6
# HELP swama_rejected_draft_tokens_total Nothing counted yet
# TYPE swama_rejected_draft_tokens_total counter
'''


def test_parse_metrics_keeps_counters_by_their_labels_but_model() -> None:
    values = bench.parse_metrics(METRICS)
    assert values['swama_decode_steps_total{kind="plain"}'] == 60.0
    assert values['swama_decode_steps_total{kind="speculative"}'] == 40.0
    assert values["swama_draft_tokens_total"] == 200.0
    assert values["swama_rejected_draft_tokens_total"] == 0.0  # declared, nothing counted yet
    assert "swama_draft_tokens_total_total" not in values and "swama_decode_steps_total" not in values
    assert not any(k.startswith(("swama_kv_cache", "swama_time_to_first", "swama_draft_acceptance")) for k in values)
    assert not any(k.endswith("_created") for k in values)


def test_parse_metrics_sums_models_and_survives_odd_lines() -> None:
    text = 'x_draft_total{model="a"} 1\nx_draft_total{model="b"} 2 1700000000\nnot a metric line\nx_draft_total{model="c"} NaN\n'
    assert bench.parse_metrics(text) == {"x_draft_total": 3.0}


def test_draft_figures_from_metric_deltas() -> None:
    before = bench.parse_metrics(METRICS)
    after = {k: v * 2 for k, v in before.items()}
    drafting = bench.classify_metrics(bench.draft_metrics(bench.metric_deltas(before, after)))
    assert (drafting.drafted, drafting.accepted, drafting.steps, drafting.plain_steps) == (200, 120, 40, 60)
    assert drafting.acceptance == pytest.approx(0.6, abs=F64_ARITHMETIC)
    drafting.decode_tokens = 250
    assert drafting.tokens_per_step == pytest.approx(2.5, abs=F64_ARITHMETIC)


def test_other_counter_names_are_read_too() -> None:
    deltas = {"spec_accepted_tokens_total": 30.0, "spec_rejected_tokens_total": 10.0,
              "speculative_verify_steps_total": 8.0, "speculative_emitted_tokens_total": 48.0,
              "unrelated_total": 5.0}
    drafting = bench.classify_metrics(deltas)
    assert drafting.acceptance == pytest.approx(0.75, abs=F64_ARITHMETIC)
    assert drafting.tokens_per_step == pytest.approx(6.0, abs=F64_ARITHMETIC)
    assert bench.classify_metrics({"swama_generated_tokens_total": 9.0}) == bench.Drafting()


def test_usage_drafts_at_any_depth() -> None:
    assert bench.usage_drafts({"completion_tokens": 10, "accepted_draft_tokens": 4}) == (4, None)
    nested = {"completion_tokens_details": {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 2}}
    assert bench.usage_drafts(nested) == (3, 2)
    assert bench.usage_drafts({"completion_tokens": 10}) == (None, None)
    assert bench.usage_drafts(None) == (None, None)


def _result(index: int, text: str, tokens: int, usage: dict | None = None) -> bench.Result:
    sample = Sample(ttft=0.1, decode_seconds=1.0, wall=1.1, completion_tokens=tokens, content_deltas=tokens,
                    prompt_tokens=50, cached_tokens=None, finish_reason="length", from_usage=True)
    return bench.Result(index, sample, text, usage or {})


def test_level_falls_back_to_usage_and_compares_texts() -> None:
    level = bench.Level("a", 1, [_result(1, "x", 11, {"accepted_draft_tokens": 6})], wall=2.0)
    drafting = level.drafting()
    assert (drafting.accepted, drafting.drafted, drafting.decode_tokens) == (6, None, 11)
    assert level.drafting_sources() == {"usage"} and level.tokens_per_second == 5.5
    other = bench.Level("a", 1, [_result(1, "x", 11), _result(2, "y", 3)], wall=1.0)
    assert bench.same_text([level], [other]) == (1, 1)
    assert bench.round_ratios([level], [other]) == [pytest.approx(5.5 / 14, abs=F64_ARITHMETIC)]


def test_spread_and_its_format() -> None:
    assert bench.spread([3.0, 1.0, 2.0, math.nan]) == (2.0, 1.0, 3.0)
    assert all(math.isnan(v) for v in bench.spread([]))
    assert bench.fmt_spread([1.5, 1.0, 2.0], "{:.2f}", "x") == "1.50x (1.00–2.00)"
    assert bench.fmt_spread([1.5], "{:.1f}") == "1.5"
    assert bench.fmt_spread([]) == "n/a"


def test_workloads_and_their_prompts() -> None:
    plan = bench.workloads(["a", "b", "c"], None, native_tools=False)
    assert [(w.name, w.max_tokens) for w in plan] == [("code edit", 512), ("agent turn", 256), ("plain chat", 256)]
    assert 140 <= bench.CODE_FILE.count("\n") <= 175 and f"def {bench.RENAME[0]}(" in bench.CODE_FILE
    for w in plan:  # every request its own first line, the same body for the same index
        first, second = bench.request_body("m", w, 1), bench.request_body("m", w, 2)
        assert first["messages"][0]["content"].splitlines()[0] != second["messages"][0]["content"].splitlines()[0]
        assert bench.request_body("m", w, 1) == first and first["temperature"] == 0
    agent = plan[1].messages(1)
    assert "tools" not in bench.request_body("m", plan[1], 1)
    assert all(isinstance(m["content"], str) and m["role"] in ("system", "user", "assistant") for m in agent)
    assert "apply_patch" in agent[0]["content"] and "src/netclient/client.py" in agent[-2]["content"]
    native = bench.workloads(["b"], 64, native_tools=True)[0]
    body = bench.request_body("m", native, 1)
    assert body["max_tokens"] == 64 and [t["function"]["name"] for t in body["tools"]] == [
        "shell", "apply_patch", "update_plan"]
    assert body["messages"][3]["role"] == "tool"


def test_arguments() -> None:
    args = bench.parse_args(["--clients", "1,4", "8", "--workloads", "chat", "a", "--servers", "mlx_lm.server", "auto"])
    assert args.clients == [1, 4, 8] and args.workloads == ["c", "a"] and args.servers == ["auto", "mlx_lm"]
    defaults = bench.parse_args([])
    assert (defaults.clients, defaults.workloads, defaults.rounds) == ([1, 8], ["a", "b", "c"], 3)
    with pytest.raises(SystemExit):
        bench.parse_args(["--workloads", "d"])


def test_command_shows_no_machine_paths() -> None:
    shown = bench.display_command(["--model-dir", "/somewhere/private/smollm2-mlx", "--write",
                                   str(bench.REPO_ROOT / "docs" / "benchmarks.md")])
    assert shown == "python -m tools.bench.speculative --model-dir DIR/smollm2-mlx --write docs/benchmarks.md"
