"""Speculative decoding, side by side: swama with prompt-lookup drafting (`--speculative auto`) against
swama decoding one token per step (`--speculative off`) and against mlx_lm.server, in one run.

    python -m tools.bench.speculative [--model-dir DIR] [--workloads a,b,c] [--clients 1 8] [--requests N]
                                      [--rounds N] [--max-tokens N] [--dtype auto|float32|bfloat16|float16]
                                      [--draft-tokens N] [--servers auto,off,mlx_lm]
                                      [--write [docs/benchmarks.md]]

Three workloads, every request streamed at temperature 0 with its own first line (no prompt cache
can answer it), every server getting exactly the same requests:

- a, code edit: a ~150-line Python module in the prompt and "return the whole file with this one
  change: rename function parse_row to parse_record"; max_tokens 512. The answer copies the prompt.
- b, agent turn: a Codex-shaped turn: ~1.5k tokens of agent rules, shell / apply_patch / update_plan
  tools, a shell call whose output holds a file listing and a source file, and the user asking for
  an edit, so the answer echoes paths and code; max_tokens 256.
- c, plain chat: a short story prompt, a different one per request; max_tokens 256. Little to copy.

At every client count the clients start together and each sends `--requests` requests back to back.
Reported per server, workload and client count: completion tokens per second over the wall time of
the level (tokens from the streamed usage chunk), the median time to the first content token, the
median decode speed of one request (its tokens after the first over the time after the first) and,
for swama, what drafting did: accepted / drafted draft tokens and tokens per decode step, read
from the deltas of the draft counters on GET /metrics (any metric whose name speaks of drafts) or,
failing that, from a draft field of the usage chunk, whichever this swama has. With `--rounds N`
(default 3) every server starts N times, in reversed order every other round; a throughput or a ratio
is the median of the rounds with their min-max spread, a TTFT the median over all their requests.

`--dtype` (default auto: float32 on a CPU, bfloat16 on a GPU) is what every server computes in: swama
casts at load (SWAMA_DTYPE), mlx_lm.server gets a copy of the folder in that dtype unless it is
stored so. The tool runs unchanged on a CUDA machine.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.bench.chat import (
    Sample,
    Target,
    _Stream,
    exit_on_sigterm,
    load_average,
    mlx_lm_target,
    resolve_model_dir,
    sse_data,
    swama_target,
)
from tools.bench.common import (
    BENCHMARKS_MD,
    REPO_ROOT,
    Server,
    build_store,
    facts_lines,
    floating_dtype,
    free_port,
    gpu_facts,
    machine_facts,
    markdown_table,
    median,
    model_files,
    publish,
    ratio,
    temp_dir,
    today,
    write_float32_copy,
)

SECTION = "Speculative decoding: prompt lookup (swama auto) vs swama off vs mlx_lm.server"
DTYPES = ("auto", "float32", "bfloat16", "float16")

# ---------------------------------------------------------------------------------------------
# Workload (a): a code edit that copies a file back


CODE_FILE = r'''"""Inventory records: read a CSV export, check every line, and summarise stock by warehouse."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

REQUIRED = ("sku", "name", "warehouse", "quantity", "unit_price", "received")


class RecordError(ValueError):
    """A line of the export that cannot be read."""

    def __init__(self, line_no: int, message: str) -> None:
        super().__init__(f"line {line_no}: {message}")
        self.line_no = line_no


@dataclass(frozen=True)
class Item:
    sku: str
    name: str
    warehouse: str
    quantity: int
    unit_price: Decimal
    received: date

    @property
    def value(self) -> Decimal:
        return self.unit_price * self.quantity


@dataclass
class Warehouse:
    name: str
    items: list[Item] = field(default_factory=list)

    def add(self, item: Item) -> None:
        if item.warehouse != self.name:
            raise ValueError(f"{item.sku} belongs to {item.warehouse}, not {self.name}")
        self.items.append(item)

    @property
    def total_quantity(self) -> int:
        return sum(item.quantity for item in self.items)

    @property
    def total_value(self) -> Decimal:
        return sum((item.value for item in self.items), Decimal("0"))

    def low_stock(self, threshold: int = 5) -> list[Item]:
        return sorted((i for i in self.items if i.quantity < threshold), key=lambda i: i.quantity)


def parse_quantity(text: str, line_no: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise RecordError(line_no, f"quantity {text!r} is not a whole number") from None
    if value < 0:
        raise RecordError(line_no, f"quantity {value} is negative")
    return value


def parse_price(text: str, line_no: int) -> Decimal:
    cleaned = text.replace("$", "").replace(",", "").strip()
    try:
        return Decimal(cleaned).quantize(Decimal("0.01"))
    except ArithmeticError:
        raise RecordError(line_no, f"price {text!r} is not a number") from None


def parse_date(text: str, line_no: int) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise RecordError(line_no, f"date {text!r} is not YYYY-MM-DD") from None


def parse_row(row: dict[str, str], line_no: int) -> Item:
    missing = [key for key in REQUIRED if not (row.get(key) or "").strip()]
    if missing:
        raise RecordError(line_no, "missing " + ", ".join(missing))
    return Item(
        sku=row["sku"].strip().upper(),
        name=row["name"].strip(),
        warehouse=row["warehouse"].strip().lower(),
        quantity=parse_quantity(row["quantity"], line_no),
        unit_price=parse_price(row["unit_price"], line_no),
        received=parse_date(row["received"], line_no),
    )


def read_items(text: str) -> tuple[list[Item], list[RecordError]]:
    reader = csv.DictReader(io.StringIO(text))
    items: list[Item] = []
    errors: list[RecordError] = []
    for line_no, row in enumerate(reader, start=2):
        try:
            items.append(parse_row(row, line_no))
        except RecordError as exc:
            errors.append(exc)
    return items, errors


class Inventory:
    def __init__(self) -> None:
        self.warehouses: dict[str, Warehouse] = {}

    def add(self, item: Item) -> None:
        warehouse = self.warehouses.setdefault(item.warehouse, Warehouse(item.warehouse))
        warehouse.add(item)

    @classmethod
    def from_csv(cls, text: str) -> tuple[Inventory, list[RecordError]]:
        inventory = cls()
        items, errors = read_items(text)
        for item in items:
            inventory.add(item)
        return inventory, errors

    def find(self, sku: str) -> list[Item]:
        sku = sku.strip().upper()
        return [i for w in self.warehouses.values() for i in w.items if i.sku == sku]

    def by_month(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for warehouse in self.warehouses.values():
            for item in warehouse.items:
                counts[item.received.strftime("%Y-%m")] += item.quantity
        return dict(sorted(counts.items()))


def format_money(value: Decimal) -> str:
    return f"${value:,.2f}"


def summary_lines(inventory: Inventory, threshold: int = 5) -> list[str]:
    lines = []
    for name in sorted(inventory.warehouses):
        warehouse = inventory.warehouses[name]
        lines.append(f"{name}: {warehouse.total_quantity} units, {format_money(warehouse.total_value)}")
        for item in warehouse.low_stock(threshold):
            lines.append(f"  low: {item.sku} {item.name} ({item.quantity} left)")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: inventory.py EXPORT.csv")
        return 2
    with open(argv[1], encoding="utf-8") as f:
        inventory, errors = Inventory.from_csv(f.read())
    for error in errors:
        print(f"skipped {error}")
    print("\n".join(summary_lines(inventory)))
    return 1 if errors else 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv))
'''
RENAME = ("parse_row", "parse_record")


def code_edit_messages(index: int) -> list[dict[str, Any]]:
    old, new = RENAME
    system = f"Request {index} (code edit). You are a careful coding assistant. You answer with code only."
    user = (f"Here is inventory.py:\n\n```python\n{CODE_FILE}```\n\nReturn the whole file with this one change: "
            f"rename function {old} to {new} (its definition and every call). Answer with the complete file "
            "in one ```python block and nothing else.")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# ---------------------------------------------------------------------------------------------
# Workload (b): a Codex-shaped agent turn

AGENT_RULES = """You are a coding agent running in a terminal on the user's computer. You and the user share one \
workspace, and your job is to finish the user's task: read the code, make the change, check it, and report back \
briefly. Be precise, safe and helpful.

# How you work

- Keep going until the task is completely resolved before ending your turn. Only stop when you are sure the \
problem is solved and the change is verified, or when you need something only the user can give.
- Do not guess. When you are not sure about the content of a file or the structure of the repository, use your \
tools to read the files and gather what you need.
- Before you call a tool, send the user one short sentence saying what you are about to do and why, so that they \
can follow your work. Group related actions into one note.
- Plan before you act when the task has several steps: use update_plan to list the steps, mark one step as \
in_progress at a time, and mark steps completed as you finish them. Skip the plan for simple tasks.
- Work inside the current working directory. Never touch files outside the workspace unless the user asks you to.

# Reading and searching

- Use the shell tool to run commands. Prefer `rg` over `grep` and `rg --files` over `find`: they are much faster \
and respect .gitignore.
- Read files in chunks of at most 250 lines with `sed -n START,ENDp FILE`, and read the surrounding code before \
you change a function, so that your edit fits the file's conventions.
- When a command fails, read its error message, fix the cause and try again; do not repeat the same command \
unchanged.

# Editing files

- Always use apply_patch to edit files. Never write files with `cat`, `echo` or a here-document, and never use \
`sed -i` or other in-place editors.
- A patch is plain text that starts with `*** Begin Patch` and ends with `*** End Patch`. Each file change \
starts with `*** Update File: PATH`, `*** Add File: PATH` or `*** Delete File: PATH`.
- In an update, every hunk starts with `@@` followed by the enclosing class or function, then three lines of \
unchanged context, the lines to remove prefixed with `-`, the lines to add prefixed with `+`, and three more lines \
of context. Context lines start with a single space.
- Paths in a patch are relative to the working directory; never use absolute paths.
- Keep changes minimal and focused on the task. Fix the problem at its root rather than patching symptoms, and do \
not fix unrelated bugs or reformat code you did not change.
- Keep the existing style: naming, typing, docstrings, error handling, line length. Do not add comments that only \
repeat what the code says, and never add copyright or license headers.
- Do not rename public functions, change signatures or move files unless the task asks for it; when it does, \
update every caller in the same patch.

# Checking your work

- When the repository has tests, run the ones closest to your change first, then the wider suite if it is fast. \
Use `pytest -q PATH` for Python projects.
- When there are no tests for the code you changed and the project has a test folder, add a small test next to \
the existing ones.
- Run the project's formatter and linter when it has them configured, and fix what they report in the lines you \
touched.
- Never claim that a check passed when you did not run it; say what you could not run and why.

# Instructions in the repository

- Repositories often contain AGENTS.md files. They hold instructions for agents working in the folder that \
contains them and in every folder below it: coding conventions, how to run the tests, what not to touch.
- When you change a file, follow every AGENTS.md whose folder contains that file; a deeper file takes precedence \
over a shallower one, and the user's own instructions in this conversation take precedence over both.
- If an AGENTS.md asks you to run checks after a change, run them, even when the change looks trivial.

# Sandbox and approvals

- Commands run in a sandbox: the workspace is writable, the rest of the file system is read-only, and the \
network is off. When a command fails because of the sandbox, say so and ask the user before retrying it outside \
the sandbox; explain in one sentence why the command needs it.
- Long-running commands such as servers or watchers must not block your turn: do not start them unless the \
task needs it, and stop them before you finish.
- When a command would take longer than two minutes, tell the user and prefer a narrower variant, such as one \
test file instead of the whole suite.

# Showing code to the user

- When you show code in an answer, use fenced code blocks with the language named, and show only the lines \
that matter with enough context to find them.
- When you mention a function, class or command, wrap its name in backticks. When you list several changes, \
list them in the order a reviewer would read them, file by file.
- Never invent output: only quote command output that you actually saw in this session.

# Safety

- Do not run commands that delete data, rewrite history or reach the network unless the user asked for exactly \
that. Never run `git reset --hard`, `git push --force` or `rm -rf` on paths you did not create.
- Do not commit, and do not create branches, unless the user explicitly asks you to.
- Never print, copy or upload secrets, tokens or credentials you come across in the workspace.

# Your final answer

- End your turn with a short summary for the user: what you changed, in which files, and how you checked it.
- Refer to files by their relative path with an optional line number, like `src/app.py:42`; do not paste whole \
files the user can open themselves.
- Use plain sentences and short bullet lists; no headings for short answers, and no more than ten lines unless \
the user asked for detail.
- When you could not finish, say what is left and what you suggest as the next step."""

AGENT_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "shell",
        "description": "Runs a shell command in the workspace and returns its output.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments."},
            "workdir": {"type": "string", "description": "The working directory for the command."},
            "timeout_ms": {"type": "number", "description": "How long the command may run, in milliseconds."}},
            "required": ["command"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "apply_patch",
        "description": "Applies a patch in the *** Begin Patch / *** End Patch format to files in the workspace.",
        "parameters": {"type": "object", "properties": {
            "input": {"type": "string", "description": "The whole patch, from *** Begin Patch to *** End Patch."}},
            "required": ["input"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "update_plan",
        "description": "Updates the task plan: a list of steps, each pending, in_progress or completed.",
        "parameters": {"type": "object", "properties": {
            "explanation": {"type": "string"},
            "plan": {"type": "array", "items": {"type": "object", "properties": {
                "step": {"type": "string"}, "status": {"type": "string",
                                                       "enum": ["pending", "in_progress", "completed"]}},
                "required": ["step", "status"]}}},
            "required": ["plan"], "additionalProperties": False}}},
]

AGENT_LISTING = """pyproject.toml
README.md
src/netclient/__init__.py
src/netclient/client.py
src/netclient/errors.py
src/netclient/retry.py
tests/test_client.py
tests/test_retry.py"""

AGENT_SOURCE = '''"""A small HTTP client with retries and JSON helpers."""

from __future__ import annotations

import time
from typing import Any

import httpx

from netclient.errors import ClientError, ServerError
from netclient.retry import backoff_delays


class HttpClient:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = f"{self.base_url}/{path.lstrip('/')}"
        last: Exception | None = None
        for delay in backoff_delays(3):
            try:
                response = self._http.request(method, url, **kwargs)
            except httpx.TransportError as exc:
                last = exc
                time.sleep(delay)
                continue
            if response.status_code >= 500:
                last = ServerError(response.status_code, response.text)
                time.sleep(delay)
                continue
            if response.status_code >= 400:
                raise ClientError(response.status_code, response.text)
            return response
        raise ServerError(0, f"gave up after 3 attempts: {last}")

    def get_json(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).json()

    def post_json(self, path: str, body: Any) -> Any:
        return self.request("POST", path, json=body).json()

    def close(self) -> None:
        self._http.close()
'''

AGENT_TASK = ("The number of retries in src/netclient/client.py is hard-coded to 3. Make it configurable: add a "
              "max_retries parameter (default 3) to HttpClient.__init__, store it, and use it in request() for "
              "backoff_delays and in the error message.")
AGENT_FOLLOW_UP = ("That is the file. Apply the edit now with apply_patch: show the complete patch for "
                   "src/netclient/client.py, then summarise the change in one line.")


def agent_messages(index: int, native_tools: bool) -> list[dict[str, Any]]:
    """The turn as the OpenAI chat API carries it (`native_tools`), or flattened to plain text the way swama
    renders tools for a chat template that ignores them, so that every server sees the same prompt."""
    command = ["bash", "-lc", "rg --files && sed -n 1,200p src/netclient/client.py"]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"command": command, "workdir": "."})}}
    output = f"Exit code: 0\nWall time: 0.1 seconds\nOutput:\n{AGENT_LISTING}\n{AGENT_SOURCE}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Request {index} (agent turn).\n{AGENT_RULES}"},
        {"role": "user", "content": AGENT_TASK},
        {"role": "assistant", "content": "I'll list the files and read the client first.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
        {"role": "user", "content": AGENT_FOLLOW_UP},
    ]
    if native_tools:
        return messages
    from swama.engine.text.chat_prompt import _fallback_history, with_tool_instructions

    return with_tool_instructions(_fallback_history(messages), AGENT_TOOLS)


def template_renders_tools(model_dir: Path) -> bool:
    """Whether the folder's chat template mentions tools at all (SmolLM2's does not)."""
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in model_dir.glob("*.jinja")]
    config = model_dir / "tokenizer_config.json"
    if config.is_file():
        texts.append(str(json.loads(config.read_text(encoding="utf-8")).get("chat_template") or ""))
    return any("tools" in t for t in texts)


# ---------------------------------------------------------------------------------------------
# Workload (c): plain chat

_WHO = ("lighthouse keeper", "baker", "pilot", "teacher", "miner", "weaver", "doctor", "sailor", "farmer", "clockmaker")
_WHAT = ("a message in a bottle", "a broken compass", "an old map", "a silver key", "a lost letter",
         "a violin with no strings", "a talking crow", "a locked box", "a painted stone", "a forgotten diary")
_WHERE = ("on a stormy night", "at the market", "in a library", "under a bridge", "on an island", "in a mill",
          "at the top of a tower", "in a cave", "in the snow", "on the last day of summer")


def story_messages(index: int) -> list[dict[str, Any]]:
    who, what, where = _WHO[index % 10], _WHAT[(index * 3 + 1) % 10], _WHERE[(index * 7 + 2) % 10]
    return [{"role": "system", "content": f"Request {index} (story). You are a helpful assistant."},
            {"role": "user", "content": f"Write a short story about a {who} who finds {what} {where}."}]


@dataclass(frozen=True)
class Workload:
    key: str
    name: str
    max_tokens: int
    messages: Callable[[int], list[dict[str, Any]]]
    tools: list[dict[str, Any]] | None = None


def workloads(keys: list[str], max_tokens: int | None, native_tools: bool) -> list[Workload]:
    every = {
        "a": Workload("a", "code edit", max_tokens or 512, code_edit_messages),
        "b": Workload("b", "agent turn", max_tokens or 256, lambda i: agent_messages(i, native_tools),
                      AGENT_TOOLS if native_tools else None),
        "c": Workload("c", "plain chat", max_tokens or 256, story_messages),
    }
    return [every[k] for k in keys]


def request_body(model: str, workload: Workload, index: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": workload.messages(index), "temperature": 0,
                            "max_tokens": workload.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if workload.tools:
        body["tools"] = workload.tools
    return body


# ---------------------------------------------------------------------------------------------
# Draft counters: /metrics and the usage chunk (both optional; their names are not fixed)

DRAFT_WORDS = ("draft", "accept", "reject", "speculat")
SUMMED_LABELS = ("model",)  # summed over: one model is served; other labels (a step's kind) stay in the key
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition to {sample key: value}: counters and untyped samples only (gauges,
    histograms and summaries say nothing as deltas), `_created` samples left out. A key is the sample's
    name with its labels other than `model`, e.g. `swama_decode_steps_total{kind="plain"}`; samples
    that differ only in `model` are summed. A counter declared without samples yet (a labelled counter
    nothing has counted) is there as `NAME_total` 0."""
    skipped: set[str] = set()
    counters: list[str] = []
    totals: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("# TYPE"):
            parts = line.split()
            if len(parts) >= 4 and parts[3] in ("gauge", "histogram", "summary", "gaugehistogram", "stateset"):
                skipped.add(parts[2])
            elif len(parts) >= 4 and parts[3] == "counter":
                counters.append(parts[2].removesuffix("_total"))
            continue
        if not line or line.startswith("#"):
            continue
        match = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line)
        if match is None:
            continue
        name, rest = match.group(0), line[match.end():].lstrip()
        labels: list[tuple[str, str]] = []
        if rest.startswith("{"):
            end = rest.rfind("}")
            if end < 0:
                continue
            labels = sorted((k, v) for k, v in _LABEL.findall(rest[1:end]) if k not in SUMMED_LABELS)
            rest = rest[end + 1:]
        fields = rest.split()
        if not fields or name.endswith("_created"):
            continue
        if any(name == f or (name.startswith(f + "_") and name[len(f) + 1:] in ("bucket", "sum", "count", "gcount",
                                                                                "gsum")) for f in skipped):
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
        totals[key] = totals.get(key, 0.0) + value
    for family in counters:
        if not any(k == family or k.startswith((family + "_", family + "{")) for k in totals):
            totals[family + "_total"] = 0.0
    return totals


def draft_metrics(values: dict[str, float]) -> dict[str, float]:
    """The samples that speak of drafting: a draft word in the name or labels, or plain steps (the other
    kind of a drafting batch's steps)."""
    return {k: v for k, v in values.items()
            if any(w in k.lower() for w in DRAFT_WORDS) or ("step" in k.lower() and "plain" in k.lower())}


def metric_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if before is None or after is None:
        return {}
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


@dataclass
class Drafting:
    """What drafting did over some requests; None where the server does not say."""

    drafted: float | None = None  # draft tokens verified, accepted or not
    accepted: float | None = None  # draft tokens accepted
    steps: float | None = None  # speculative decode steps (one wider pass verifying drafts)
    plain_steps: float | None = None  # plain decode steps (one token a row)
    emitted: float | None = None  # tokens the speculative steps emitted, when the server counts them
    decode_tokens: float | None = None  # completion tokens (every one, the first too, leaves from a decode step)

    @property
    def acceptance(self) -> float | None:
        if self.drafted is None or self.accepted is None or self.drafted <= 0:
            return None
        return self.accepted / self.drafted

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens a speculative step emitted when the server counts them, else tokens per decode step of
        either kind; all rows of the batch together."""
        if self.emitted is not None and self.steps:
            return self.emitted / self.steps
        if self.decode_tokens is not None and self.steps is not None and self.plain_steps is not None:
            total = self.steps + self.plain_steps
            return self.decode_tokens / total if total > 0 else None
        return None

    def __add__(self, other: Drafting) -> Drafting:
        def plus(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else (a or 0.0) + (b or 0.0)

        return Drafting(*(plus(getattr(self, f), getattr(other, f)) for f in
                          ("drafted", "accepted", "steps", "plain_steps", "emitted", "decode_tokens")))


def classify_metrics(deltas: dict[str, float]) -> Drafting:
    """Draft counters by what their keys (name and labels) say: accepted, rejected, plain and speculative
    steps, emitted tokens, drafted tokens. Rates, ratios, times and sizes are not token counts: ignored."""
    found: dict[str, float] = {}
    for key, value in draft_metrics(deltas).items():
        low = key.lower()
        if any(w in low for w in ("rate", "ratio", "share", "fraction", "seconds", "bytes")):
            continue
        if "step" in low or "pass" in low or "verif" in low:
            kind = "plain_steps" if "plain" in low else "steps"
        elif "accept" in low:
            kind = "accepted"
        elif "reject" in low:
            kind = "rejected"
        elif "emit" in low:
            kind = "emitted"
        elif "draft" in low:
            kind = "drafted"
        else:
            continue
        found[kind] = found.get(kind, 0.0) + value
    drafted = found.get("drafted")
    if drafted is None and "accepted" in found and "rejected" in found:
        drafted = found["accepted"] + found["rejected"]
    return Drafting(drafted, found.get("accepted"), found.get("steps"), found.get("plain_steps"), found.get("emitted"))


def usage_drafts(usage: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """(accepted, rejected) draft tokens from any numeric usage field whose name speaks of drafts, at
    any depth (e.g. completion_tokens_details.accepted_prediction_tokens); a field named for drafted
    tokens without 'reject' in it counts as accepted, which is what a usage chunk reports."""
    accepted: float | None = None
    rejected: float | None = None

    def walk(node: Any) -> None:
        nonlocal accepted, rejected
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value)
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            low = key.lower()
            if "reject" in low:
                rejected = (rejected or 0.0) + value
            elif any(w in low for w in ("draft", "accept", "speculat")):
                accepted = (accepted or 0.0) + value

    walk(usage)
    return accepted, rejected


def scrape(server: Server) -> dict[str, float] | None:
    try:
        response = httpx.get(server.base_url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    return parse_metrics(response.text) if response.status_code == 200 else None


# ---------------------------------------------------------------------------------------------
# Requests and levels


@dataclass
class Result:
    index: int
    sample: Sample
    text: str
    usage: dict[str, Any]


@dataclass
class _TextStream(_Stream):
    parts: list[str] = field(default_factory=list)

    def feed(self, chunk: dict[str, Any], now: float) -> None:
        super().feed(chunk, now)
        for choice in chunk.get("choices") or []:
            self.parts.append((choice.get("delta") or {}).get("content") or "")


def stream_request(http: httpx.Client, server: Server, body: dict[str, Any], index: int) -> Result:
    state = _TextStream(start=time.perf_counter())
    with http.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:500]}")
        for data in sse_data(response.iter_lines()):
            state.feed(json.loads(data), time.perf_counter())
    return Result(index, state.sample(time.perf_counter()), "".join(state.parts), state.usage or {})


@dataclass
class Level:
    """One workload at one client count, on one server, in one round."""

    workload: str
    clients: int
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0
    errors: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # draft counter deltas over the level

    @property
    def completion_tokens(self) -> int:
        return sum(r.sample.completion_tokens for r in self.results)

    @property
    def tokens_per_second(self) -> float:
        return ratio(self.completion_tokens, self.wall)

    def drafting(self) -> Drafting:
        """From /metrics's draft counters; accepted (and rejected) draft tokens from the usage chunks where
        /metrics has no such counter. A server that says nothing gives all None."""
        found = classify_metrics(self.metrics)
        found.decode_tokens = float(self.completion_tokens)
        if found.accepted is None:
            pairs = [usage_drafts(r.usage) for r in self.results]
            accepted = [a for a, _ in pairs if a is not None]
            rejected = [r for _, r in pairs if r is not None]
            if accepted or self.usage_counts_drafts():
                found.accepted = sum(accepted)
            if found.drafted is None and rejected:
                found.drafted = found.accepted + sum(rejected)
        return found

    def usage_counts_drafts(self) -> bool:
        return any(usage_drafts(r.usage)[0] is not None for r in self.results)

    def drafting_sources(self) -> set[str]:
        sources = set()
        if classify_metrics(self.metrics) != Drafting():
            sources.add("/metrics")
        if self.usage_counts_drafts():
            sources.add("usage")
        return sources


def run_level(target: Target, server: Server, workload: Workload, clients: int, requests: int, base: int,
              timeout: float, metrics: bool) -> Level:
    level = Level(workload.key, clients)
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client(c: int) -> None:
        with httpx.Client(timeout=timeout) as http:
            barrier.wait()
            for r in range(requests):
                index = base + c * requests + r
                try:
                    result = stream_request(http, server, request_body(target.model, workload, index), index)
                except Exception as exc:  # reported, and the level is marked
                    with lock:
                        level.errors.append(str(exc)[:200])
                    continue
                with lock:
                    level.results.append(result)

    before = scrape(server) if metrics else None
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level.wall = time.perf_counter() - start
    if metrics:
        level.metrics = draft_metrics(metric_deltas(before, scrape(server)))
    return level


@dataclass
class Contender:
    key: str  # auto | off | mlx_lm
    target: Target
    metrics: bool  # whether it serves /metrics


def run_contender(contender: Contender, plan: list[Workload], counts: list[int], requests: int,
                  timeout: float) -> list[Level]:
    target = contender.target
    print(f"\n== {target.label} ({target.weights}), load average {load_average()}", flush=True)
    levels = []
    with target.start(free_port()) as server, httpx.Client(timeout=timeout) as http:
        for workload in plan:  # warm-up: loads the model and runs every prompt shape once
            warm = Workload(workload.key, workload.name, min(16, workload.max_tokens), workload.messages,
                            workload.tools)
            stream_request(http, server, request_body(target.model, warm, 0), 0)
        base = 1
        for workload in plan:
            for clients in counts:
                level = run_level(target, server, workload, clients, requests, base, timeout, contender.metrics)
                base += clients * requests
                levels.append(level)
                drafting = level.drafting()
                extra = ""
                if drafting.acceptance is not None:
                    extra += f", acceptance {drafting.acceptance:.2f}"
                if drafting.accepted is not None:
                    extra += f", {drafting.accepted:.0f} accepted draft tokens"
                if drafting.tokens_per_step is not None:
                    extra += f", {drafting.tokens_per_step:.2f} tokens/step"
                print(f"  {workload.name:<11} {clients:>3} clients: {level.tokens_per_second:7.1f} tok/s, median "
                      f"TTFT {median(r.sample.ttft for r in level.results) * 1000:7.0f} ms, decode "
                      f"{median(r.sample.tokens_per_second for r in level.results):6.1f} tok/s per request, "
                      f"{len(level.results)} requests, {level.completion_tokens} tokens in {level.wall:6.1f} s"
                      + extra + (f", {len(level.errors)} errors: {level.errors[0]}" if level.errors else ""),
                      flush=True)
                if level.metrics:
                    print("      draft counters: " + ", ".join(f"{k} +{v:g}" for k, v in sorted(level.metrics.items())),
                          flush=True)
    return levels


# ---------------------------------------------------------------------------------------------
# Figures


def spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(median, min, max) of the finite values; NaNs when there are none."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    return median(finite), min(finite), max(finite)


def fmt_spread(values: list[float], pattern: str = "{:.1f}", suffix: str = "") -> str:
    mid, low, high = spread(values)
    if math.isnan(mid):
        return "n/a"
    text = pattern.format(mid) + suffix
    if len(values) > 1:
        text += f" ({pattern.format(low)}–{pattern.format(high)})"
    return text


def round_ratios(a: list[Level], b: list[Level]) -> list[float]:
    """Each round's throughput ratio a / b (the rounds ran the two servers in the same stretch of time)."""
    return [ratio(x.tokens_per_second, y.tokens_per_second) for x, y in zip(a, b, strict=False)]


def same_text(a: list[Level], b: list[Level]) -> tuple[int, int]:
    """Requests (by round and index) whose text is identical on both servers, out of those both answered."""
    same = total = 0
    for x, y in zip(a, b, strict=False):
        theirs = {r.index: r.text for r in y.results}
        for r in x.results:
            if r.index in theirs:
                total += 1
                same += r.text == theirs[r.index]
    return same, total


def fmt_opt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None or math.isnan(value) else pattern.format(value)


def report(contenders: list[Contender], runs: dict[str, list[list[Level]]], plan: list[Workload],
           args: argparse.Namespace, command: str, model_dir: Path, served: dict[str, str], load: str,
           native_tools: bool) -> str:
    keys = [c.key for c in contenders]
    labels = {c.key: c.target.label for c in contenders}

    def rounds_of(key: str, w: Workload, clients: int) -> list[Level]:
        return [lv for per_round in runs.get(key, []) for lv in per_round
                if lv.workload == w.key and lv.clients == clients]

    main_rows, detail_rows = [], []
    sources: set[str] = set()
    for w in plan:
        for clients in args.clients:
            got = {k: rounds_of(k, w, clients) for k in keys}
            row = [w.name, str(clients)]
            row += [fmt_spread([lv.tokens_per_second for lv in got[k]]) for k in keys]
            if "auto" in got and "mlx_lm" in got:
                row.append(fmt_spread(round_ratios(got["auto"], got["mlx_lm"]), "{:.2f}", "x"))
            if "auto" in got and "off" in got:
                row.append(fmt_spread(round_ratios(got["auto"], got["off"]), "{:.2f}", "x"))
            main_rows.append(row)
            detail = [w.name, str(clients)]
            detail += [fmt_opt(median(r.sample.ttft for lv in got[k] for r in lv.results) * 1000, "{:.0f}")
                       for k in keys]
            detail += [fmt_opt(median(r.sample.tokens_per_second for lv in got[k] for r in lv.results), "{:.1f}")
                       for k in keys]
            detail += [fmt_opt(median(r.sample.completion_tokens for lv in got[k] for r in lv.results), "{:.0f}")
                       for k in keys]
            if "auto" in got:
                drafting = Drafting()
                for lv in got["auto"]:
                    drafting = drafting + lv.drafting()
                    sources |= lv.drafting_sources()
                tokens = sum(lv.completion_tokens for lv in got["auto"])
                detail += [fmt_opt(drafting.acceptance, "{:.2f}"),
                           fmt_opt(None if drafting.accepted is None else ratio(drafting.accepted, tokens), "{:.2f}"),
                           fmt_opt(drafting.tokens_per_step, "{:.2f}")]
                if "off" in got:
                    same, total = same_text(got["auto"], got["off"])
                    detail.append(f"{same}/{total}")
            detail_rows.append(detail)

    header = ["workload", "clients", *(f"{labels[k]} tok/s" for k in keys)]
    if "auto" in keys and "mlx_lm" in keys:
        header.append(f"{labels['auto']} vs {labels['mlx_lm']}")
    if "auto" in keys and "off" in keys:
        header.append(f"{labels['auto']} vs {labels['off']}")
    detail_header = ["workload", "clients", *(f"{labels[k]} TTFT ms" for k in keys),
                     *(f"{labels[k]} decode tok/s per request" for k in keys),
                     *(f"{labels[k]} tokens/request" for k in keys)]
    if "auto" in keys:
        detail_header += ["acceptance (accepted/drafted)", "accepted drafts per completion token",
                          "tokens per decode step"]
        if "off" in keys:
            detail_header.append(f"same text as {labels['off']}")

    errors = sum(len(lv.errors) for per_key in runs.values() for per_round in per_key for lv in per_round)
    off_drafts = [d for lv in (lv for per_round in runs.get("off", []) for lv in per_round)
                  for d in [lv.drafting().drafted or lv.drafting().accepted] if d]
    found = sorted({name for per_round in runs.get("auto", []) for lv in per_round for name in lv.metrics})
    prompt_tokens = {w.name: median(r.sample.prompt_tokens for per_key in runs.values() for per_round in per_key
                                    for lv in per_round if lv.workload == w.key for r in lv.results
                                    if r.sample.prompt_tokens is not None) for w in plan}
    described = {
        "a": f"a {CODE_FILE.count(chr(10))}-line Python module in the prompt and \"return the whole "
             f"file with this one change: rename function {RENAME[0]} to {RENAME[1]}\"",
        "b": "Codex-shaped: ~1.4k tokens of agent rules, shell / apply_patch / update_plan tools, a shell call whose "
             "output lists the files and prints a source file, then the user asking for the edit as a patch"
             + (" (tools sent in the request's tools field)" if native_tools else
                " (the model's chat template renders no tools, so the tools and the tool call are sent as text, "
                "the way swama renders them for such a template: every server sees the same prompt)"),
        "c": "a short story, a different subject per request: little to copy from the prompt",
    }
    workload_lines = [f"{w.name}: {described[w.key]}; max_tokens {w.max_tokens}, prompt ~"
                      f"{fmt_opt(prompt_tokens[w.name], '{:.0f}')} tokens" for w in plan]
    server_lines = []
    for c in contenders:
        if c.key == "mlx_lm":
            server_lines.append(f"{c.target.label}: `mlx_lm.server` with its defaults, computing in "
                                f"{served['mlx_lm']}; it can only speculate with a --draft-model, and no smaller "
                                "model with SmolLM2's tokenizer is at hand offline, so it decodes one token per step")
        else:
            server_lines.append(f"{c.target.label}: `swama serve --speculative {c.key}"
                                + (f" --draft-tokens {args.draft_tokens}" if args.draft_tokens else "")
                                + f"` (continuous batching, defaults otherwise), computing in {served['swama']}")
    emitted = any(lv.drafting().emitted is not None for per_round in runs.get("auto", []) for lv in per_round)
    drafting_note = ("drafting figures are swama auto's over all rounds, from the deltas of its /metrics draft "
                     f"counters over each level ({', '.join(f'`{k}`' for k in found)})" if found else
                     "this swama exposes no draft counters on /metrics: acceptance and tokens per step are n/a")
    if "usage" in sources:
        drafting_note += ("; accepted draft tokens from the usage chunk's draft field where /metrics has no counter "
                          "of them")
    drafting_note += ("; acceptance: accepted / drafted draft tokens; accepted drafts per completion token: the share "
                      "of the answers that came from verified drafts; tokens per decode step: "
                      + ("tokens the speculative steps emitted over those steps" if emitted else
                         "completion tokens over the decode steps, speculative and plain")
                      + ", all rows of the batch together (one per row and step without drafting, so at most the client count "
                        "there); same text: "
                      "requests whose answer is identical to swama off's")
    notes = [
        *workload_lines,
        f"each client sends {args.requests} streamed chat request(s) back to back, temperature 0, every request "
        "with its own first line; tok/s: completion tokens of all requests (from the usage chunk) over the wall "
        "time of the whole level, prefills included; TTFT: request sent to first content delta; decode tok/s per "
        "request: (completion tokens - 1) / (time from the first content delta to the finish chunk), the decode "
        "speed one client sees, without its prefill; TTFT and decode tok/s: medians over all requests",
        *server_lines,
        "servers run one at a time, with the same environment and the same BLAS (named under Machine), each "
        "warmed up with one short request per workload"
        + (f"; {args.rounds} rounds, the order of the servers reversed every other round: tok/s and ratios are "
           "the median of the rounds' figures (each ratio taken within its round), min–max in brackets"
           if args.rounds > 1 else ""),
        drafting_note,
    ]
    if off_drafts:
        notes.append(f"swama off reported drafting ({sum(off_drafts):.0f} draft tokens): check the server's mode")
    notes.append(f"request errors: {errors}")
    table_main = markdown_table(header, main_rows)
    table_detail = markdown_table(detail_header, detail_rows)
    return "\n\n".join([
        f"Streamed `POST /v1/chat/completions` with {', '.join(str(c) for c in args.clients)} concurrent client(s) "
        f"on `{model_dir.name}` (stored as {floating_dtype(model_dir)}, served in {served['dtype']} by every "
        f"server). Measured {today()} with:\n\n```\n{command}\n```",
        table_main,
        table_detail,
        "Notes:\n\n" + "\n".join(f"- {n}" for n in notes),
        "Machine:\n\n" + facts_lines({**machine_facts(), **gpu_facts(), "load average (1/5/15 min)": load}),
    ])


# ---------------------------------------------------------------------------------------------
# Main


def resolve_dtype(choice: str) -> str:
    if choice != "auto":
        return choice
    from swama.engine.runtime import will_use_gpu

    return "bfloat16" if will_use_gpu() else "float32"


def write_dtype_copy(src: Path, dst: Path, dtype: str) -> Path:
    """A copy of the model folder `src` in `dst` whose floating weights are `dtype`."""
    if dtype == "float32":
        return write_float32_copy(src, dst)
    import mlx.core as mx

    dst.mkdir(parents=True, exist_ok=True)
    target = getattr(mx, dtype)
    for path in model_files(src):
        if path.suffix != ".safetensors":
            if path.name == "config.json":
                data = json.loads(path.read_text(encoding="utf-8"))
                data["torch_dtype"] = dtype
                (dst / path.name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            elif path.is_dir():
                shutil.copytree(path, dst / path.name)
            else:
                shutil.copy2(path, dst / path.name)
            continue
        weights, metadata = mx.load(str(path), return_metadata=True)
        weights = {k: v.astype(target) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}
        mx.save_safetensors(str(dst / path.name), weights, metadata=metadata)
        del weights
    return dst


def split_list(values: list[str]) -> list[str]:
    """`--clients 1 8`, `--clients 1,8` and `--clients "1, 8"` alike."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


SERVER_KEYS = ("auto", "off", "mlx_lm")
WORKLOAD_NAMES = {"a": "a", "code": "a", "b": "b", "agent": "b", "c": "c", "chat": "c"}


def display_command(argv: list[str]) -> str:
    """The command as run, with paths of this machine shown relative to the repository or by name."""
    shown = []
    for arg in argv:
        path = Path(arg)
        if path.is_absolute():
            try:
                arg = str(path.relative_to(REPO_ROOT))
            except ValueError:
                arg = f"DIR/{path.name}"
        shown.append(arg)
    return shlex.join(["python", "-m", "tools.bench.speculative", *shown])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.speculative", description=__doc__.split("\n\n")[0],
                                     epilog="quick check: --rounds 1 --clients 1 --workloads c --max-tokens 16")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="an MLX model folder (default: the test cache's smollm2-mlx)")
    parser.add_argument("--workloads", nargs="+", default=["a", "b", "c"],
                        help="a (code edit), b (agent turn), c (plain chat); space- or comma-separated "
                             "(default a b c)")
    parser.add_argument("--clients", nargs="+", default=["1", "8"],
                        help="client counts, space- or comma-separated (default 1 8)")
    parser.add_argument("--requests", type=int, default=1, help="requests per client at each count (default 1)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="start every server this many times, in alternating order (default 3)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="max_tokens of every request (default per workload: 512, 256, 256)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="what every server computes in (default auto: float32 on a CPU, bfloat16 on a GPU)")
    parser.add_argument("--draft-tokens", type=int, default=None,
                        help="swama's --draft-tokens (default: the server's own)")
    parser.add_argument("--servers", nargs="+", default=list(SERVER_KEYS),
                        help="which of auto (swama --speculative auto), off (swama --speculative off) and mlx_lm "
                             "(mlx_lm.server) to run (default all three)")
    parser.add_argument("--tools", choices=("auto", "native", "text"), default="auto",
                        help="how the agent turn carries its tools: in the tools field (native), or as text in the "
                             "messages (text); auto: native when the model's chat template renders tools")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per request (default 1800)")
    parser.add_argument("--write", nargs="?", type=Path, const=BENCHMARKS_MD, default=None, metavar="MD",
                        help=f"write the results as a section of MD (default docs/{BENCHMARKS_MD.name})")
    args = parser.parse_args(argv)
    try:
        args.clients = [int(c) for c in split_list(args.clients)]
    except ValueError:
        parser.error("--clients takes whole numbers")
    try:
        args.workloads = list(dict.fromkeys(WORKLOAD_NAMES[w.lower()] for w in split_list(args.workloads)))
    except KeyError as exc:
        parser.error(f"unknown workload {exc.args[0]!r}: choose from a, b, c")
    args.servers = [s.replace("mlx_lm.server", "mlx_lm").replace("mlx-lm", "mlx_lm") for s in split_list(args.servers)]
    if unknown := [s for s in args.servers if s not in SERVER_KEYS]:
        parser.error(f"unknown server {unknown[0]!r}: choose from {', '.join(SERVER_KEYS)}")
    args.servers = [s for s in SERVER_KEYS if s in args.servers]
    if not args.clients or min(args.clients) < 1 or not args.workloads or not args.servers:
        parser.error("--clients, --workloads and --servers need at least one value each, client counts at least 1")
    if args.rounds < 1 or args.requests < 1 or (args.max_tokens is not None and args.max_tokens < 2):
        parser.error("--rounds and --requests must be at least 1, --max-tokens at least 2")
    if args.draft_tokens is not None and not 1 <= args.draft_tokens <= 32:
        parser.error("--draft-tokens must be between 1 and 32")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    model_dir = resolve_model_dir(args.model_dir)
    command = display_command(sys.argv[1:] if argv is None else argv)
    dtype = resolve_dtype(args.dtype)
    native_tools = args.tools == "native" or (args.tools == "auto" and template_renders_tools(model_dir))
    plan = workloads(args.workloads, args.max_tokens, native_tools)
    stored = floating_dtype(model_dir)
    served = {"dtype": dtype,
              "swama": f"{dtype} ({'as stored' if stored == dtype else 'cast at load'})",
              "mlx_lm": f"{dtype} ({'as stored' if stored == dtype else 'a converted copy of the folder'})"}
    with ExitStack() as stack:
        contenders: list[Contender] = []
        if "auto" in args.servers or "off" in args.servers:
            store = build_store(Path(stack.enter_context(temp_dir("bench-speculative-store-"))), model_dir)
            for mode in ("auto", "off"):
                if mode in args.servers:
                    env = {"SWAMA_SPECULATIVE": mode, "SWAMA_DTYPE": dtype}
                    if args.draft_tokens is not None:
                        env["SWAMA_DRAFT_TOKENS"] = str(args.draft_tokens)
                    contenders.append(Contender(mode, swama_target(store, served["swama"], f"swama {mode}", env), True))
        if "mlx_lm" in args.servers:
            folder = model_dir
            if stored != dtype:
                print(f"writing a {dtype} copy of the model folder for mlx_lm.server ...", flush=True)
                folder = write_dtype_copy(model_dir, Path(stack.enter_context(temp_dir("bench-speculative-copy-")))
                                          / "model", dtype)
            contenders.append(Contender("mlx_lm", mlx_lm_target("mlx_lm.server", folder, served["mlx_lm"]), False))
        load_before = load_average()
        runs: dict[str, list[list[Level]]] = {c.key: [] for c in contenders}
        for r in range(args.rounds):
            # Alternate the order, so that a slow drift of the machine's load favours no server.
            for contender in contenders[:: -1 if r % 2 else 1]:
                runs[contender.key].append(run_contender(contender, plan, args.clients, args.requests, args.timeout))
        load = f"{load_before} at the start, {load_average()} at the end"
    publish(SECTION, report(contenders, runs, plan, args, command, model_dir, served, load, native_tools), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
