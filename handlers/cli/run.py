"""`swama run`: one prompt, one streamed reply; through a running server when there is one."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx

from swama.engine.client import (
    DECISION,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    EMBEDDING,
    RERANKER,
    SPEECH_TO_TEXT,
    TEXT_TO_SPEECH,
    ChatRequest,
    EngineError,
    EngineSettings,
    Finished,
    ReasoningDelta,
    RuntimeSettings,
    Sampling,
    Task,
    TextDelta,
    WrongModel,
    model_files,
    open_engine,
    read,
    require,
)
from swama.handlers.cli.options import add_options, given
from swama.handlers.http.settings import ServerSettings
from swama.handlers.media.images import Image, ImageError, check_image, check_images, data_url, open_images


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="generate a reply to one prompt",
                         description="Generate a reply to PROMPT with MODEL, streamed to the terminal. Uses a "
                                     "running server when one answers, else runs the model in this process. "
                                     "Installs the model first when it is missing.")
    run.add_argument("model", help="model alias or id (see `swama list`)")
    run.add_argument("prompt", help="the user message")
    run.add_argument("-i", "--image-paths", action="append", metavar="IMAGE", default=None,
                     help="a PNG, JPEG or WebP image to show a vision model, placed before the prompt "
                          "(repeat for up to 4 images)")
    run.add_argument("-t", "--temperature", type=float, default=DEFAULT_TEMPERATURE,
                     help=f"sampling temperature (default {DEFAULT_TEMPERATURE})")
    run.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, help=f"nucleus sampling (default {DEFAULT_TOP_P:g})")
    run.add_argument("-n", "--max-tokens", type=int, default=None, help="stop after this many tokens")
    run.add_argument("--repetition-penalty", type=float, default=None)
    stream = run.add_mutually_exclusive_group()
    stream.add_argument("-s", "--stream", dest="stream", action="store_true", default=True,
                        help="print tokens as they come (default)")
    stream.add_argument("--no-stream", dest="stream", action="store_false", help="print the whole reply at once")
    add_server_options(run)
    add_options(run, EngineSettings, only=["context_limit"])
    add_options(run, RuntimeSettings)
    run.set_defaults(func=run_prompt)


def add_server_options(command: argparse.ArgumentParser) -> None:
    """Where a running server is looked for (the server's own defaults) and how to skip it."""
    command.add_argument("--direct", action="store_true", help="never use a running server")
    command.add_argument("--server-host", default=default_of_server("host"), metavar="HOST",
                         help="the running server's address (default %(default)s)")
    command.add_argument("--server-port", type=int, default=default_of_server("port"), metavar="PORT",
                         help="the running server's port (default %(default)s)")


def default_of_server(name: str) -> object:
    return ServerSettings.model_fields[name].default


def server_url(args: argparse.Namespace) -> str | None:
    if args.direct:
        return None
    url = f"http://{args.server_host}:{args.server_port}/v1"
    try:
        httpx.get(url + "/models", timeout=2).raise_for_status()
    except httpx.HTTPError:
        return None
    return url


def _images(args: argparse.Namespace) -> list[Image]:
    """The `-i` files, read and checked by the same rules the server applies."""
    images = []
    for path in args.image_paths or []:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise SystemExit(f"error: cannot read image {path}: {exc.strerror}") from None
        try:
            images.append(check_image(data, path))
        except ImageError as exc:
            raise SystemExit(f"error: {exc.message}") from None
    try:
        check_images(images)
    except ImageError as exc:
        raise SystemExit(f"error: {exc.message}") from None
    return images


def _content(args: argparse.Namespace, images: list[Image]) -> str | list[dict]:
    """The user message: the images first, then the prompt, as data URLs for the server."""
    if not images:
        return args.prompt
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    return [*parts, {"type": "text", "text": args.prompt}]


def _body(args: argparse.Namespace, images: list[Image]) -> dict:
    body = {"model": args.model, "messages": [{"role": "user", "content": _content(args, images)}],
            "temperature": args.temperature, "top_p": args.top_p, "stream": args.stream}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if args.repetition_penalty is not None:
        body["repetition_penalty"] = args.repetition_penalty
    if "context_limit" in given(args, EngineSettings):
        body["context_limit"] = args.context_limit
    return body


def _via_server(url: str, args: argparse.Namespace, images: list[Image]) -> int:
    body = _body(args, images)
    with httpx.Client(timeout=None) as client:
        if not args.stream:
            r = client.post(url + "/chat/completions", json=body)
            if r.status_code != 200:
                print(f"error: {r.json()['error']['message']}", file=sys.stderr)
                return 1
            print(r.json()["choices"][0]["message"]["content"])
            return 0
        with client.stream("POST", url + "/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                print(f"error: {r.json()['error']['message']}", file=sys.stderr)
                return 1
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"]
                print(delta.get("content") or "", end="", flush=True)
    print()
    return 0


async def _in_process(args: argparse.Namespace, images: list[Image]) -> int:
    settings = read(EngineSettings, **given(args, EngineSettings))
    engine = open_engine(settings)
    content: str | list[dict] = args.prompt
    if images:
        content = [*({"type": "image"} for _ in images), {"type": "text", "text": args.prompt}]
    request = ChatRequest(
        messages=[{"role": "user", "content": content}],
        sampling=Sampling(temperature=args.temperature, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty),
        max_tokens=args.max_tokens, context_limit=settings.context_limit,
        images=await open_images(images))
    parts = []
    try:
        model = engine.model_for(args.model, Task.GENERATE)
        async for event in engine.chat(model.id, request):
            if isinstance(event, ReasoningDelta) and args.stream:
                # A thinking model's thinking: shown as it comes, dimmed, on stderr (stdout is the answer).
                print(f"\033[2m{event.text}\033[0m" if sys.stderr.isatty() else event.text, end="",
                      file=sys.stderr, flush=True)
            elif isinstance(event, TextDelta):
                if args.stream:
                    print(event.text, end="", flush=True)
                else:
                    parts.append(event.text)
            elif isinstance(event, Finished):
                print("".join(parts) if not args.stream else "")
    except EngineError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        await engine.close()
    return 0


# What to use instead of `run` for the models that do not generate text.
OTHER_USES = {
    EMBEDDING: "it turns text into vectors: POST /v1/embeddings on `swama serve` "
               "(e.g. the openai SDK's client.embeddings.create(model=\"{name}\", input=[...]))",
    SPEECH_TO_TEXT: "it transcribes audio: swama transcribe FILE -m {name}",
    TEXT_TO_SPEECH: "it speaks text: POST /v1/audio/speech on `swama serve` "
                    "(e.g. the openai SDK's client.audio.speech.create(model=\"{name}\", input=..., voice=...))",
    DECISION: "it answers typed questions: POST /v1/systemone on `swama serve`",
    RERANKER: "it ranks documents for a query: POST /v2/rerank on `swama serve` "
              "(e.g. the cohere SDK's ClientV2(...).rerank(model=\"{name}\", query=..., documents=[...]))",
}


def run_prompt(args: argparse.Namespace) -> int:
    images = _images(args)
    model = model_files().find_or_pull(args.model)  # the CLI installs on first use; the server never downloads
    try:
        require(model, Task.GENERATE, args.model)  # the engine's check, before a server is asked
    except WrongModel:
        if model.kind not in OTHER_USES:
            raise
        article = "an" if model.kind[0] in "aeiou" else "a"
        use = OTHER_USES[model.kind].format(name=args.model)
        print(f"error: {model.id} is {article} {model.kind} model and does not chat; {use}", file=sys.stderr)
        return 2
    url = server_url(args)
    if url is not None:
        return _via_server(url, args, images)
    return asyncio.run(_in_process(args, images))
