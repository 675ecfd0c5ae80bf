"""`swama run`: one prompt, one streamed reply; through a running server when there is one."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import httpx

from swama.engine.generator import ChatRequest, Finished, Sampling, TextDelta
from swama.engine.service import Engine, EngineOptions
from swama.engine.sources import pull
from swama.engine.store import ModelStore
from swama.handlers.settings import Settings


def _server_url(args: argparse.Namespace) -> str | None:
    if args.direct:
        return None
    url = f"http://{args.server_host}:{args.server_port}/v1"
    try:
        httpx.get(url + "/models", timeout=2).raise_for_status()
    except httpx.HTTPError:
        return None
    return url


def _body(args: argparse.Namespace) -> dict:
    body = {"model": args.model, "messages": [{"role": "user", "content": args.prompt}],
            "temperature": args.temperature, "top_p": args.top_p, "stream": args.stream}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if args.repetition_penalty is not None:
        body["repetition_penalty"] = args.repetition_penalty
    if args.context_limit is not None:
        body["context_limit"] = args.context_limit
    return body


def _via_server(url: str, args: argparse.Namespace) -> int:
    body = _body(args)
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


async def _in_process(args: argparse.Namespace) -> int:
    settings = Settings()
    engine = Engine(EngineOptions(models_root=settings.models_root, context_limit=settings.context_limit))
    request = ChatRequest(
        messages=[{"role": "user", "content": args.prompt}],
        sampling=Sampling(temperature=args.temperature, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty),
        max_tokens=args.max_tokens, context_limit=args.context_limit or settings.context_limit)
    parts = []
    async for event in engine.chat(engine.resolve_language_model(args.model), request):
        if isinstance(event, TextDelta):
            if args.stream:
                print(event.text, end="", flush=True)
            else:
                parts.append(event.text)
        elif isinstance(event, Finished):
            print("".join(parts) if not args.stream else "")
    await engine.close()
    return 0


def run(args: argparse.Namespace) -> int:
    store = ModelStore(Settings().models_root)
    if store.find(args.model) is None:
        pull(store, args.model)  # the CLI installs on first use; the server never downloads
    url = _server_url(args)
    if url is not None:
        return _via_server(url, args)
    return asyncio.run(_in_process(args))
