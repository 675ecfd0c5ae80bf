"""Embedding speed: swama's /v1/embeddings against direct mlx-embeddings calls, in one run.

    python -m tools.bench.embeddings [--model-dir DIR] [--runs N] [--write docs/benchmarks.md]

For 1, 32 and 256 inputs of mixed length (all-MiniLM-L6-v2 by default, from the test cache) it
measures embeddings per second four ways on the same machine, alternating runs: the swama server
over HTTP, swama's engine in process, a direct mlx-embeddings loop (one model call per text, as a
script would write it), and one mlx-embeddings `generate` call over the whole list (padded to the
longest text). It also checks that every way gives the same vectors.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from swama.engine.runtime import reexec_with_fast_blas
from tools.bench.common import (
    Server,
    add_write_option,
    build_store,
    free_port,
    machine_facts,
    markdown_table,
    median,
    package_version,
    publish,
    server_env,
    temp_dir,
    test_cache_dir,
    today,
)

TITLE = "Embeddings: swama vs direct mlx-embeddings calls"
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
SIZES = (1, 32, 256)
WORDS = ("the quick brown fox jumps over a lazy dog while markets rally and rain falls on quiet streets "
         "as engineers ship code that reads data from remote sensors every morning").split()


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60))) + "." for _ in range(n)]


def default_minilm_dir() -> Path | None:
    cache = test_cache_dir()
    folder = cache / "minilm"
    return folder if (folder / "model.safetensors").is_file() else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="an embedding model folder (default: MiniLM)")
    parser.add_argument("--runs", type=int, default=3)
    add_write_option(parser)
    args = parser.parse_args(argv)
    model_dir = args.model_dir or default_minilm_dir()
    if model_dir is None:
        sys.exit("No model folder given and no test cache found: run `swama pull minilm` and pass --model-dir")

    import mlx.core as mx
    from mlx_embeddings.utils import generate

    from swama.engine.kinds.embeddings import embed, tokenize
    from swama.engine.serving.loaders import load_model

    model = load_model(MINILM_ID, model_dir)  # float32 on the CPU, as the server loads it
    wrapper_texts = {n: texts(n, seed=n) for n in SIZES}

    def engine(batch: list[str]) -> np.ndarray:
        return embed(model, tokenize(model, batch)).vectors

    def direct_loop(batch: list[str]) -> np.ndarray:
        rows = []
        for text in batch:
            ids = mx.array([model.tokenizer(text)["input_ids"]])
            rows.append(np.array(model.model(ids).text_embeds[0]))
        return np.stack(rows)

    def direct_batch(batch: list[str]) -> np.ndarray:
        return np.array(generate(model.model, model.tokenizer, texts=batch).text_embeds)

    results: dict[str, dict[int, float]] = {k: {} for k in ("http", "engine", "loop", "batch")}
    worst = 0.0
    with temp_dir("bench-embeddings-") as tmp:
        store = build_store(Path(tmp) / "store", model_dir, MINILM_ID)
        port = free_port()
        server = Server("swama", [sys.executable, "-m", "swama.handlers.cli", "serve", "--host", "127.0.0.1",
                                  "--port", str(port), "--log-level", "warning"], port, "/v1/models",
                        env=server_env({"SWAMA_MODELS": str(store)}))
        with server, httpx.Client(base_url=server.base_url, timeout=600) as client:
            def http(batch: list[str]) -> np.ndarray:
                r = client.post("/v1/embeddings", json={"model": MINILM_ID, "input": batch})
                r.raise_for_status()
                return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)

            ways = {"http": http, "engine": engine, "loop": direct_loop, "batch": direct_batch}
            for fn in ways.values():  # warm-up: model load, first kernels
                fn(wrapper_texts[1])
            for n in SIZES:
                times: dict[str, list[float]] = {k: [] for k in ways}
                for _ in range(args.runs):
                    outputs = {}
                    for name, fn in ways.items():
                        start = time.perf_counter()
                        outputs[name] = fn(wrapper_texts[n])
                        times[name].append(time.perf_counter() - start)
                    for name in ways:
                        worst = max(worst, float(np.abs(outputs[name] - outputs["loop"]).max()))
                for name in ways:
                    results[name][n] = n / median(times[name])

    header = ["inputs", "swama HTTP (emb/s)", "swama engine", "mlx-embeddings loop", "mlx-embeddings batch",
              "HTTP / loop", "HTTP / batch"]
    rows = [[str(n), f"{results['http'][n]:.1f}", f"{results['engine'][n]:.1f}", f"{results['loop'][n]:.1f}",
             f"{results['batch'][n]:.1f}", f"{results['http'][n] / results['loop'][n]:.2f}x",
             f"{results['http'][n] / results['batch'][n]:.2f}x"] for n in SIZES]
    table = markdown_table(header, rows)
    facts = {**machine_facts(), "mlx-embeddings": package_version("mlx-embeddings")}
    body = (f"Measured {today()} with `python -m tools.bench.embeddings` on all-MiniLM-L6-v2 (float32), "
            f"inputs of 4-60 words, median of {args.runs} alternating runs. HTTP includes JSON encoding of the "
            f"vectors. Largest difference between any two ways: {worst:.1e}.\n\n{table}\n\n"
            + "\n".join(f"- {k}: {v}" for k, v in facts.items()))
    publish(TITLE, body, args.write)


if __name__ == "__main__":
    reexec_with_fast_blas(sys.argv[1:], module="tools.bench.embeddings")
    main()
