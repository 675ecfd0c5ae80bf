"""LoRA adapters per row (engine/adapters/): decode speed of 8 rows with 0, 1 or 4 distinct adapters in the
batch, against the base model alone and against the adapter merged into the weights, in one run.

    python -m tools.bench.adapters [--model-dir DIR | --shape qwen3-0.6b] [--rows 8] [--context 128]
                                   [--steps 64] [--rank 8] [--repeats 3] [--write [MD]]

Every run is the batch's decode step as the scheduler runs it: the rows' caches hold `--context`
prompt tokens (read in one forward), then `--steps` forwards of one token a row, each row fed its own
greedy token, evaluated step by step. Decode tok/s = rows x steps / time; median of `--repeats` with
the spread, each repeat timing every run once, in turn (so drift in the machine's speed falls on all). The adapters are random (rank `--rank`, on every linear layer of every layer: q, k, v, o,
gate, up, down), which costs what a trained one costs.

- base, no adapters: the model as loaded, its layers never wrapped;
- base rows beside loaded adapters: the same rows once four adapters are loaded (no row selects one);
- 1 adapter: every row the same adapter (one product per layer, no gather);
- 4 adapters: two rows each (`mx.gather_mm` picks each row's matrices);
- merged: one adapter folded into the weights with mlx-lm's own `fuse` (what serving one adapter
  alone, or mlx-lm's server, costs): the ceiling for one adapter.

`--shape` builds a random-weight model of that shape (tools.bench.gpu) for a GPU; by default the SmolLM2
test model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench.common import (
    add_write_option,
    machine_facts,
    markdown_table,
    publish,
    resolve_model_dir,
    today,
)

TITLE = "LoRA adapters per row: decode with 0, 1 and 4 adapters in the batch, against the base and merged weights"
MERGED = "merged: 1 adapter fused into the weights (mlx-lm's fuse)"
KEYS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def decode_seconds(net: Any, rows: int, context: int, steps: int, bank: Any = None, slots: Any = None) -> float:
    """Seconds for `steps` decode steps of `rows` rows after a `context`-token prompt each."""
    import contextlib

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    chosen = bank.selected(slots) if bank is not None else contextlib.nullcontext()
    with chosen:
        cache = make_prompt_cache(net)
        prompt = mx.random.randint(0, 1000, (rows, context))
        logits = net(prompt, cache=cache)[:, -1, :]
        token = mx.argmax(logits, axis=-1)
        mx.eval(token, [c.state for c in cache])
        start = time.perf_counter()
        for _ in range(steps):
            token = mx.argmax(net(token[:, None], cache=cache)[:, -1, :], axis=-1)
            mx.eval(token)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.adapters", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--shape", default=None, help="a random-weight model of this shape (tools.bench.gpu)")
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/swama-gpu/shaped"))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    add_write_option(parser)
    args = parser.parse_args(argv)
    from swama.engine.runtime import activate_device, reexec_with_fast_blas

    reexec_with_fast_blas(sys.argv[1:] if argv is None else argv, module="tools.bench.adapters")
    activate_device()
    command = " ".join(["python -m tools.bench.adapters", *(sys.argv[1:] if argv is None else argv)])

    import mlx.core as mx
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import load_adapters

    from swama.engine.adapters.bank import AdapterBank
    from swama.engine.text.language import load_language_model
    from tools.testmodels.lora import random_adapter

    if args.shape:
        from tools.bench.gpu import build_shape, find_donor

        folder = build_shape(args.shape, args.models_dir, find_donor(None, args.models_dir))
    else:
        folder, _ = resolve_model_dir(args.model_dir)
    rows, runs = args.rows, {}
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as tmp:
        adapters = [random_adapter(folder, Path(tmp) / f"a{i}", rank=args.rank, keys=KEYS, seed=i) for i in range(4)]

        configs: list[tuple[str, Any, Any, Any]] = []
        model = load_language_model("bench", folder)
        dtype = str(next(iter(model.model.parameters()["model"]["embed_tokens"].values())).dtype)
        configs.append(("base, no adapters", load_language_model("plain", folder).model, None, None))
        bank = AdapterBank(model.model, 4)
        slots = [bank.acquire(f"a{i}", path) for i, path in enumerate(adapters)]
        configs.append(("base rows beside 4 loaded adapters", model.model, bank, None))
        configs.append(("1 adapter (every row)", model.model, bank, slots[0]))
        configs.append((f"4 adapters ({rows / 4:g} rows each)", model.model, bank, [slots[i % 4] for i in range(rows)]))
        merged = load_language_model("merged", folder).model
        load_adapters(merged, str(adapters[0]))
        merged.update_modules(tree_unflatten([(k, m.fuse()) for k, m in merged.named_modules() if hasattr(m, "fuse")]))
        configs.append((MERGED, merged, None, None))
        for _name, net, held, chosen in configs:  # warm-up: kernels, graph shapes
            decode_seconds(net, rows, args.context, 4, held, chosen)
        for _ in range(args.repeats):  # round robin: each repeat measures every run once
            for name, net, held, chosen in configs:
                seconds = decode_seconds(net, rows, args.context, args.steps, held, chosen)
                runs.setdefault(name, []).append(rows * args.steps / seconds)
        for name, rates in runs.items():
            print(f"{name}: {statistics.median(rates):,.1f} tok/s", flush=True)

    base = statistics.median(runs["base, no adapters"])
    merged_rate = statistics.median(runs[MERGED])
    table = markdown_table(
        ["run", "decode tok/s (median)", "spread", "vs base", "vs merged"],
        [[name, f"{statistics.median(v):,.1f}", f"{min(v):,.1f}-{max(v):,.1f}",
          f"{statistics.median(v) / base:.2f}x", f"{statistics.median(v) / merged_rate:.2f}x"] for name, v in runs.items()])
    def of(name: str) -> float:
        return statistics.median(runs[name])

    one, four = of("1 adapter (every row)"), of(f"4 adapters ({rows / 4:g} rows each)")
    reading = (f"**Reading.** With one adapter on every row the batch decodes at {one / base:.2f}x the base model's "
               f"speed and {one / merged_rate:.2f}x the speed of that adapter merged into the weights (what serving "
               f"one fine-tune as its own model costs); with four adapters in the batch at {four / base:.2f}x and "
               f"{four / merged_rate:.2f}x, in one forward, where merged weights would need four models and four "
               f"batches. Rows without an adapter beside loaded ones run at "
               f"{of('base rows beside 4 loaded adapters') / base:.2f}x the base.")
    facts = {**machine_facts(), "device": str(mx.default_device()), "weights": dtype}
    body = "\n\n".join([
        f"Model folder `{folder.name}` ({dtype}); {rows} rows, {args.context}-token prompts, {args.steps} decode "
        f"steps, adapters of rank {args.rank} on all seven linear layers of every layer; median of {args.repeats}, "
        "every run once in each repeat, in turn. "
        f"Measured {today()} with:\n\n```\n{command}\n```",
        table,
        reading,
        "Machine:\n\n" + "\n".join(f"- {k}: {v}" for k, v in facts.items()),
    ])
    publish(TITLE + (f" ({args.shape})" if args.shape else ""), body, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
