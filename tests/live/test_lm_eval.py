"""lm-evaluation-harness against a live server through /v1/completions, as evaluations run it: its
`local-completions` model scores a multiple-choice task by log-likelihood (echo with logprobs, the
prompt's tokens read back) and runs a generate_until task, on tiny local tasks, offline.

lm-eval runs in a subprocess: Hugging Face's libraries read HF_HUB_OFFLINE when they are imported,
which another test of this session may already have done."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from live_server import LiveServer

pytest.importorskip("lm_eval")

SMOL = "smollm2"
LIMIT_S = 170  # the whole run, lm-eval's imports included

MULTIPLE_CHOICE = [
    {"question": "What is the capital of France?", "choices": ["Paris", "London", "Berlin"], "answer": 0},
    {"question": "How many legs does a spider have?", "choices": ["six", "eight", "four"], "answer": 1},
    {"question": "What colour is the sky on a clear day?", "choices": ["green", "red", "blue"], "answer": 2},
]
GENERATION = [
    {"text": "The capital of France is", "answer": "Paris"},
    {"text": "The capital of Italy is", "answer": "Rome"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _tasks(folder: Path) -> None:
    mc = _jsonl(folder / "mc.jsonl", MULTIPLE_CHOICE)
    gen = _jsonl(folder / "gen.jsonl", GENERATION)
    (folder / "swama_mc.yaml").write_text(textwrap.dedent(f"""\
        task: swama_mc
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {mc}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{answer}}}}"
        metric_list:
          - metric: acc
            aggregation: mean
            higher_is_better: true
        """))
    (folder / "swama_gen.yaml").write_text(textwrap.dedent(f"""\
        task: swama_gen
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {gen}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{{{text}}}}"
        doc_to_target: "{{{{answer}}}}"
        generation_kwargs:
          until: [".", "\\n"]
          max_gen_toks: 8
          do_sample: false
        filter_list:
          - name: strip
            filter:
              - function: remove_whitespace
              - function: take_first
        metric_list:
          - metric: exact_match
            aggregation: mean
            higher_is_better: true
            ignore_case: true
            ignore_punctuation: true
        """))


RUN = """
import json, sys
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

base_url, model, tokenizer, tasks = sys.argv[1:5]
out = simple_evaluate(
    model="local-completions",
    model_args={"base_url": base_url, "model": model, "tokenizer_backend": "huggingface",
                "tokenizer": tokenizer, "num_concurrent": 1, "max_retries": 1},
    tasks=["swama_mc", "swama_gen"], task_manager=TaskManager(include_path=tasks), limit=3, batch_size=2,
    log_samples=False, bootstrap_iters=0)
print("RESULTS " + json.dumps(out["results"], default=str))
"""


def test_lm_eval_local_completions(model_server: LiveServer, smollm2_dir: Path, tmp_path: Path) -> None:
    _tasks(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
           "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([sys.executable, "-c", RUN, model_server.v1 + "/completions", SMOL, str(smollm2_dir),
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=LIMIT_S)
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULTS "))
    results = json.loads(line[len("RESULTS "):])
    assert results["swama_mc"]["sample_len"] == 3 and results["swama_gen"]["sample_len"] == 2, results
    acc = results["swama_mc"]["acc,none"]
    exact = results["swama_gen"]["exact_match,strip"]
    assert math.isfinite(acc) and 0 <= acc <= 1, results
    assert math.isfinite(exact) and 0 <= exact <= 1, results
    # SmolLM2 knows these: the log-likelihoods and the generations reached lm-eval intact.
    assert acc > 0 and exact > 0, results
