"""One decode step, taken apart: mlx-lm's forward over its batch cache against swama's compiled step
(engine/text/compiled_step) over fixed-capacity slots, with MLX's masked attention and (on CUDA)
with swama's span-attention kernel, on the same random model, in one process.

    python -m tools.bench.decode_step [--shape qwen3-0.6b] [--rows 1,8,64,256] [--context 128]
                                      [--steps 64] [--rounds 3] [--json OUT]

For each row count both sides hold `--context` tokens a row (one prefill of random tokens), then
decode `--steps` greedy tokens the way the serving batch does: build the next step's graph, launch
it (`mx.async_eval`), then read the previous step's tokens back while the device computes. Per step
it reports the host time building the graph, the time `async_eval` takes to encode the kernels
(`launch`), the time waiting for the tokens (`wait`), the whole step, tokens/s, and the operations
in one step's graph (from `mx.export_to_dot`: all, and those that are views and launch nothing).
Medians over `--rounds`. No tokenizer and no folder are needed: the model is built in memory from
the shape's config (tools/testmodels/tiny.py), its weights random in the device's dtype.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

VIEWS = {"Broadcast", "Reshape", "Squeeze", "ExpandDims", "Slice", "Transpose", "AsStrided", "Split"}


def build(shape: str) -> Any:
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    from swama.engine.runtime import compute_dtype
    from swama.engine.text import gated_delta_cuda
    from tools.testmodels.tiny import shaped_config

    gated_delta_cuda.install()  # as a loaded model has it: both sides' linear layers take the kernel on CUDA

    config = shaped_config(shape)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    dtype = compute_dtype()
    mx.random.seed(0)
    from mlx.utils import tree_map

    model.update(tree_map(lambda p: (mx.random.normal(p.shape) * 0.02).astype(dtype), model.parameters()))
    mx.eval(model.parameters())
    return model


HISTOGRAMS: dict[str, Any] = {}


def count_ops(name: str, *outputs: Any) -> tuple[int, int]:
    import collections

    import mlx.core as mx

    text = io.StringIO()
    mx.export_to_dot(text, *outputs)
    labels = re.findall(r'label ="([^"]+)"', text.getvalue())
    HISTOGRAMS[name] = collections.Counter(labels).most_common()
    return len(labels), sum(1 for label in labels if label in VIEWS)


class Side:
    """One way to run a decode step: `start(rows, context)`, then `step(tokens)` -> next tokens (lazy)."""

    name = ""

    def start(self, rows: int, context: int) -> Any: ...
    def step(self, tokens: Any) -> Any: ...


class MlxLm(Side):
    name = "mlx-lm forward"

    def __init__(self, model: Any) -> None:
        self.model = model

    def start(self, rows: int, context: int) -> Any:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        # One batch cache a layer, as the admission merges them (a hybrid's linear layers too).
        own = [make_prompt_cache(self.model) for _ in range(rows)]
        self.cache = [layer.merge([c[i] for c in own]) for i, layer in enumerate(own[0])]
        prompt = mx.random.randint(0, 1000, (rows, context))
        mx.eval(self.model(prompt, cache=self.cache))
        return mx.zeros((rows,), dtype=mx.uint32)

    def step(self, tokens: Any) -> Any:
        import mlx.core as mx

        return mx.argmax(self.model(tokens[:, None], cache=self.cache)[:, -1, :], axis=-1).astype(mx.uint32)


class Compiled(Side):
    def __init__(self, model: Any, attention: str) -> None:
        from swama.engine.text.compiled_step.forward import Decoder

        self.decoder = Decoder(model, attention)
        self.name = f"compiled, {attention}"

    def start(self, rows: int, context: int) -> Any:
        import mlx.core as mx

        d = self.decoder
        cache = d.batch_cache([0] * rows)
        mx.eval(d.model(mx.random.randint(0, 1000, (rows, context)), cache=cache))
        self.store = d.new_store()
        self.store.adopt(cache)
        return mx.zeros((self.store.slots,), dtype=mx.uint32)

    def step(self, tokens: Any) -> Any:
        import mlx.core as mx

        s = self.store
        s.ensure(s.occupied(), max(s.ends) + 1)
        logits, s.keys, s.values, s.states = self.decoder.step(tokens, mx.array(s.starts), mx.array(s.ends), s.keys,
                                                               s.values, s.states)
        s.ends = [e + 1 if u else e for e, u in zip(s.ends, s.used, strict=True)]
        return mx.argmax(logits, axis=-1).astype(mx.uint32)


def run(side: Side, rows: int, context: int, steps: int) -> dict[str, Any]:
    import mlx.core as mx

    tokens = side.start(rows, context)
    mx.eval(tokens)
    parts = {"graph": [], "launch": [], "wait": [], "step": []}
    ops = views = 0
    previous = tokens
    for i in range(steps + 3):
        t0 = time.perf_counter()
        nxt = side.step(previous)
        t1 = time.perf_counter()
        if i == 2:
            ops, views = count_ops(f"{side.name}, {rows} rows", nxt)
        mx.async_eval(nxt)
        t2 = time.perf_counter()
        previous.tolist()
        t3 = time.perf_counter()
        previous = nxt
        if i >= 3:  # the first steps trace and warm up
            for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
                parts[k].append(v)
    mx.eval(previous)
    out = {k: statistics.median(v) * 1000 for k, v in parts.items()}
    out["tokens_per_second"] = rows / (out["step"] / 1000)
    out["ops"], out["views"] = ops, views
    return out


def measure(shape: str, rows: list[int], context: int, steps: int, rounds: int) -> list[dict[str, Any]]:
    import mlx.core as mx

    model = build(shape)
    # The fusion leaves mlx-lm's modules as views of the fused weights: every side reads the same.
    sides = [MlxLm(model), Compiled(model, "masked")]
    from swama.engine.text.compiled_step.attention import kernel_available

    if kernel_available(sides[1].decoder.head_dim):
        sides.append(Compiled(model, "kernel"))
    results = []
    for n in rows:
        for side in sides:
            runs = [run(side, n, context, steps) for _ in range(rounds)]
            row = {"rows": n, "side": side.name, "ops": runs[0]["ops"], "views": runs[0]["views"]}
            for key in ("graph", "launch", "wait", "step", "tokens_per_second"):
                values = [r[key] for r in runs]
                row[key] = statistics.median(values)
                row[key + "_spread"] = [min(values), max(values)]
            results.append(row)
            print(f"{n:>4} rows  {side.name:<17} {row['tokens_per_second']:>9,.0f} tok/s  step {row['step']:6.2f} ms "
                  f"(graph {row['graph']:.2f}, launch {row['launch']:.2f}, wait {row['wait']:.2f})  "
                  f"ops {row['ops']} ({row['views']} views)", flush=True)
            mx.clear_cache()
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-0.6b", help="a shape of tools/testmodels/tiny.py")
    parser.add_argument("--rows", default="1,8,64,256", help="batch sizes, comma-separated")
    parser.add_argument("--context", type=int, default=128, help="tokens each row holds before decoding")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side and batch size (medians)")
    parser.add_argument("--histogram", action="store_true", help="print each step graph's operations by kind")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from swama.engine.runtime import activate_device

    activate_device()
    results = measure(args.shape, [int(x) for x in args.rows.split(",") if x.strip()], args.context, args.steps,
                      args.rounds)
    if args.histogram:
        for name, counts in HISTOGRAMS.items():
            print(f"{name}: " + ", ".join(f"{label} {n}" for label, n in counts))
    if args.json is not None:
        args.json.write_text(json.dumps({"steps": results, "operations": HISTOGRAMS}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
