"""Rerank speed: one query over 100 passages of about 200 tokens, as one /v2/rerank request, against
one /v1/decisions request per passage, and against the engine alone, in one run.

    python -m tools.bench.rerank [--model-dir DIR | --shape qwen3-0.6b] [--docs 100] [--clients 16]
                                 [--runs 3] [--write [MD]]

- rerank: one `POST /v2/rerank` with every passage (the query prefilled once, the passages scored in
  the decision scorer's batched passes);
- decisions, one per passage: the same yes/no question about each passage as its own
  `POST /v1/decisions` request (the same prompt: input `Query: ...`, the passage in the question),
  sent by `--clients` concurrent clients, as a client without a rerank route would;
- engine alone: the rerank request's decision job run in process on the same model (no HTTP, no
  scheduler), the ceiling for the route.

Documents per second = passages / wall time; median of `--runs` alternating runs with the spread. The
passages are made of sentences from a fixed word list (seeded), each about 200 tokens. `--shape`
builds a random-weight model of that shape (tools.bench.gpu) for a GPU; by default the SmolLM2 test
model.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from swama.engine.runtime import reexec_with_fast_blas
from tools.bench.common import (
    Server,
    add_write_option,
    build_store,
    free_port,
    gpu_facts,
    machine_facts,
    markdown_table,
    median,
    publish,
    resolve_model_dir,
    server_env,
    temp_dir,
    today,
)

TITLE = "Rerank: 1 query x 100 passages, /v2/rerank against one decision request per passage"
QUERY = "Which passage explains how engineers read data from remote sensors?"
WORDS = ("the quick brown fox jumps over a lazy dog while markets rally and rain falls on quiet streets as "
         "engineers ship code that reads data from remote sensors every morning before the trains leave town "
         "and farmers count their sheep under a pale winter sky").split()


def passages(n: int, words: int = 150, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + "." for _ in range(n)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.rerank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None, help="an MLX language model (default: SmolLM2)")
    parser.add_argument("--shape", default=None, help="a random-weight model of this shape (tools.bench.gpu)")
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/swama-gpu/shaped"))
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    add_write_option(parser)
    args = parser.parse_args(argv)
    if args.shape:
        from tools.bench.gpu import build_shape, find_donor

        model_dir, model_id = build_shape(args.shape, args.models_dir, find_donor(None, args.models_dir)), "bench/model"
    else:
        model_dir, model_id = resolve_model_dir(args.model_dir)
    documents = passages(args.docs)

    from swama.engine.decisions.rerank import RELEVANCE, RerankJob, decision_job

    times: dict[str, list[float]] = {"rerank": [], "decisions": [], "engine": []}
    tokens = 0
    with temp_dir("bench-rerank-") as tmp:
        store = build_store(Path(tmp) / "store", model_dir, model_id)
        port = free_port()
        server = Server("swama", [sys.executable, "-m", "swama.handlers.cli", "serve", "--host", "127.0.0.1",
                                  "--port", str(port), "--log-level", "warning"], port, "/v1/models",
                        env=server_env({"SWAMA_MODELS": str(store)}))
        with server, httpx.Client(base_url=server.base_url, timeout=1800) as client:
            def rerank() -> int:
                r = client.post("/v2/rerank", json={"model": model_id, "query": QUERY, "documents": documents})
                r.raise_for_status()
                return int(r.json()["meta"]["tokens"]["input_tokens"])

            def decide(document: str) -> None:
                body = {"model": model_id, "input": f"Query: {QUERY}",
                        "questions": [{"type": "predicate", "name": "relevant",
                                       "instructions": RELEVANCE.format(document=document)}]}
                r = client.post("/v1/decisions", json=body)
                r.raise_for_status()

            def decisions() -> None:
                with ThreadPoolExecutor(args.clients) as pool:
                    list(pool.map(decide, documents))

            rerank()  # warm-up: model load, first shapes
            decide(documents[0])
            for _ in range(args.runs):
                start = time.perf_counter()
                tokens = rerank()
                times["rerank"].append(time.perf_counter() - start)
                start = time.perf_counter()
                decisions()
                times["decisions"].append(time.perf_counter() - start)

        # The ceiling, once the server is gone: the same decision job in this process.
        from swama.engine.decisions.decide import DecisionRun
        from swama.engine.text.language import load_language_model

        model = load_language_model(model_id, model_dir)
        job = decision_job(RerankJob(QUERY, documents, context_limit=32768))
        for i in range(args.runs + 1):
            start = time.perf_counter()
            run = DecisionRun(model, job)
            run.start()
            while not run.done:
                run.score_batch()
            run.result()
            if i:  # the first run compiles and warms
                times["engine"].append(time.perf_counter() - start)

    rate = {k: args.docs / median(v) for k, v in times.items()}
    spread = {k: (args.docs / max(v), args.docs / min(v)) for k, v in times.items()}
    rows = [[name, f"{rate[key]:.1f}", f"{spread[key][0]:.1f}-{spread[key][1]:.1f}", f"{rate[key] / rate['engine']:.2f}x"]
            for name, key in (("/v2/rerank, one request", "rerank"),
                              (f"/v1/decisions, one request per passage ({args.clients} clients)", "decisions"),
                              ("engine alone (the decision job in process)", "engine"))]
    table = markdown_table(["way", "passages/s (median)", "spread", "of the engine alone"], rows)
    command = (f"bash tools/gpu.sh env python3 -m tools.bench.rerank --shape {args.shape}" if args.shape
               else "python -m tools.bench.rerank")
    body = (f"Measured {today()} with `{command} --docs {args.docs} --clients {args.clients} "
            f"--runs {args.runs}` on {model_id}: one query over {args.docs} passages of about "
            f"{tokens // max(args.docs, 1)} tokens each ({tokens} input tokens in the rerank request). "
            f"/v2/rerank is {rate['rerank'] / rate['decisions']:.2f}x one decision request per passage.\n\n{table}\n\n"
            + "\n".join(f"- {k}: {v}" for k, v in {**machine_facts(), **gpu_facts()}.items())
            + f"\n- runs: {args.runs}, spread {statistics.pstdev(times['rerank']):.2f} s (rerank)")
    publish(TITLE + (f" ({args.shape})" if args.shape else ""), body, args.write)


if __name__ == "__main__":
    reexec_with_fast_blas(sys.argv[1:], module="tools.bench.rerank")
    main()
