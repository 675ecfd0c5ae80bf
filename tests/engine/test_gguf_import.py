"""GGUF import: tiny random models of every supported architecture written with the gguf package's
writer in every quantization type, and the real SmolLM2 file end to end."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mlx_lm import generate, load, stream_generate
from mlx_lm.sample_utils import make_sampler
from precision import F32_LOGIT, F32_UNIT
from transformers import AutoTokenizer

from swama.engine.files.gguf_import import GGUFImportError, ImportOptions, import_gguf, supported_types
from swama.engine.files.gguf_tokenizer import build_tokenizer
from swama.engine.files.sources import PullError, create
from swama.engine.files.store import META, ModelStore
from swama.engine.runtime import compute_dtype
from tools.testmodels.gguf_files import (
    ARCHS,
    TINY_TOKENS,
    decoded,
    llama_cpp_name,
    load_source,
    matrices_as,
    source_weights,
    tokenizer_metadata,
    write_gguf,
)

F32_OUT = ImportOptions(dtype=mx.float32)
PROMPT = [3, 70, 101, 258, 259, 12, 200, 33]  # token ids of the tiny vocabulary


def logits(model: Any, ids: list[int] = PROMPT) -> np.ndarray:
    return np.array(model(mx.array([ids])).astype(mx.float32))[0]


def relative_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def imported_weights(folder: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(folder / "model.safetensors")).items()}


# --------------------------------------------------------------------------------------------
# Every architecture, float32 all the way: the import must be exact
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_round_trips_exactly(tmp_path: Path, arch: str) -> None:
    config, weights = source_weights(arch)
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, config, weights, matrices_as(Q.F32))
    dest = tmp_path / "out"
    summary = import_gguf(path, dest, F32_OUT)
    assert summary.architecture == arch and summary.tensor_types == {"F32": len(weights)}

    written = json.loads((dest / "config.json").read_text())
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "rope_theta", "vocab_size", "max_position_embeddings"):
        assert written[key] == config[key], key
    # GGUF stores it as float32, written back as that float32's shortest decimal: within 2^-24 of itself.
    assert written["rms_norm_eps"] == pytest.approx(config["rms_norm_eps"], rel=F32_UNIT)
    got = imported_weights(dest)
    assert set(got) == set(weights)
    for name, want in weights.items():
        # Gemma's norms are stored as 1 + w (under 4 here): float32 rounds that by at most half its step,
        # 2^-23, and taking the 1 off again is exact.
        bound = 2.0 ** -23 if arch.startswith("gemma") and name.endswith("norm.weight") else 0.0
        np.testing.assert_allclose(got[name], want, rtol=0, atol=bound, err_msg=name)

    model, tokenizer = load(str(dest))
    # The same float32 weights in the same model: equal logits (measured), but for Gemma's norms, each
    # scale off by 2^-24 of itself, which moves logits under 11 by a few 1e-6 at most.
    np.testing.assert_allclose(logits(model), logits(load_source(config, weights)), rtol=0, atol=1e-4)
    assert tokenizer.encode(" the") == [TINY_TOKENS.index("Ġthe")]
    assert len(generate(model, tokenizer, "the", max_tokens=3, sampler=make_sampler(temp=0.0))) > 0


# --------------------------------------------------------------------------------------------
# Every quantization: the decoded values land in place, the logits follow within the type's error
# --------------------------------------------------------------------------------------------

# Relative RMS of the logits of the imported model against the float32 source, per type: the
# quantization's own error (weights off by 0.02% for F16 up to 22% for Q2_K; the tiny random
# model's logits move about 2.7x as much), measured on the tiny llama, with 1.5x margin.
LOGIT_ERROR = {
    Q.F16: 1e-3, Q.BF16: 6e-3, Q.Q8_0: 0.015, Q.Q6_K: 0.05, Q.Q5_0: 0.12, Q.Q5_1: 0.12, Q.Q5_K: 0.12,
    Q.Q4_0: 0.3, Q.Q4_1: 0.25, Q.Q4_K: 0.25, Q.IQ4_NL: 0.27, Q.IQ4_XS: 0.27, Q.Q3_K: 0.5, Q.Q2_K: 0.9,
}  # fmt: skip


@pytest.mark.parametrize("qtype", list(LOGIT_ERROR), ids=lambda t: t.name)
def test_quantized_files_import(tmp_path: Path, qtype: Q) -> None:
    # llama: its Q/K rows are permuted before quantizing, so this also checks that undoing the
    # permutation after decoding lands every row where the source had it.
    config, weights = source_weights("llama")
    path = write_gguf(tmp_path / "model.gguf", "llama", config, weights, matrices_as(qtype))
    dest = tmp_path / "out"
    import_gguf(path, dest, F32_OUT)
    got = imported_weights(dest)
    for name, w in weights.items():
        want = decoded(w, qtype) if w.ndim == 2 else w
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    model, _ = load(str(dest))
    error = relative_rms(logits(model), logits(load_source(config, weights)))
    assert 0 < error < LOGIT_ERROR[qtype]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # random blocks decode to inf and NaN too
def test_every_type_the_library_decodes_is_accepted(tmp_path: Path) -> None:
    """Types the tests cannot encode (the grid I-quants, ternary and FP4 types) as raw blocks:
    whatever they decode to must land in the right tensor, in the right order."""
    config, weights = source_weights("qwen2")
    rng = np.random.default_rng(5)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    rows, cols = weights[q_proj].shape
    tried = []
    for name in supported_types():
        qtype = Q[name]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if qtype in LOGIT_ERROR or qtype == Q.F32 or cols % block:
            continue
        raw = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
        if qtype.name.startswith(("IQ", "TQ")) or qtype == Q.Q8_0:
            raw[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # a finite scale first
        others = {k: v for k, v in weights.items() if k != q_proj}
        path = write_gguf(tmp_path / f"{name}.gguf", "qwen2", config, others, matrices_as(Q.F32),
                          extra={llama_cpp_name("qwen2", q_proj): (raw, qtype)})
        dest = tmp_path / name
        import_gguf(path, dest, F32_OUT)
        want = gguf.quants.dequantize(raw, qtype).reshape(rows, cols)
        np.testing.assert_array_equal(imported_weights(dest)[q_proj], want, err_msg=name)
        tried.append(name)
    assert {"IQ2_XXS", "IQ3_S", "IQ1_S", "TQ2_0"} <= set(tried), tried


def test_a_q4_k_m_style_file_and_its_model_card(tmp_path: Path) -> None:
    """Q4_K_M files mix types: most matrices Q4_K, some Q6_K, the embedding Q5_0 here."""
    config, weights = source_weights("qwen2")

    def mixed(name: str, w: np.ndarray) -> Q:
        if w.ndim == 1:
            return Q.F32
        if "embed" in name:
            return Q.Q5_0
        return Q.Q6_K if name.endswith(("v_proj.weight", "down_proj.weight")) else Q.Q4_K

    path = write_gguf(tmp_path / "tiny-Q4_K_M.gguf", "qwen2", config, weights, mixed,
                      file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    store = ModelStore(tmp_path / "store")
    model = create(store, path, "me/tiny", say=lambda _: None, options=F32_OUT)
    meta = json.loads((model.path / META).read_text())
    assert meta["source"] == "gguf:tiny-Q4_K_M.gguf"
    assert meta["gguf"]["file_type"] == "Q4_K_M"
    assert meta["gguf"]["tensor_types"] == dict(Counter(mixed(n, w).name for n, w in weights.items()).most_common())
    assert set(meta["gguf"]["tensor_types"]) == {"F32", "Q4_K", "Q6_K", "Q5_0"}
    assert meta["converted_to"] == "float32"
    got = imported_weights(model.path)
    for name, w in weights.items():
        np.testing.assert_array_equal(got[name], decoded(w, mixed(name, w)) if w.ndim == 2 else w, err_msg=name)




# --------------------------------------------------------------------------------------------
# Output dtypes and MLX re-quantization
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_output_dtype(tmp_path: Path, dtype: mx.Dtype) -> None:
    config, weights = source_weights("qwen3")
    path = write_gguf(tmp_path / "m.gguf", "qwen3", config, weights, matrices_as(Q.F32))
    summary = import_gguf(path, tmp_path / "out", ImportOptions(dtype=dtype))
    stored = mx.load(str(tmp_path / "out" / "model.safetensors"))
    assert {v.dtype for v in stored.values()} == {dtype}
    assert summary.converted_to == str(dtype).removeprefix("mlx.core.")
    for name, w in weights.items():
        np.testing.assert_array_equal(np.array(stored[name].astype(mx.float32)),
                                      np.array(mx.array(w).astype(dtype).astype(mx.float32)), err_msg=name)


def test_the_default_dtype_is_the_compute_dtype(tmp_path: Path) -> None:
    from swama.engine.runtime import compute_dtype

    config, weights = source_weights("qwen2")
    path = write_gguf(tmp_path / "m.gguf", "qwen2", config, weights, matrices_as(Q.Q8_0))
    import_gguf(path, tmp_path / "out")
    assert {v.dtype for v in mx.load(str(tmp_path / "out" / "model.safetensors")).values()} == {compute_dtype()}


# MLX's affine quantization, groups of 64: like GGUF's types of the same width (see LOGIT_ERROR),
# the tiny model's logits move about 2.7x the weights' error; measured 0.23 for 4 bits.
QUANTIZE_ERROR = {8: 0.02, 4: 0.35}


@pytest.mark.parametrize("bits", [8, 4])
def test_requantize_with_mlx(tmp_path: Path, bits: int) -> None:
    config, weights = source_weights("llama")
    path = write_gguf(tmp_path / "m.gguf", "llama", config, weights, matrices_as(Q.F32))
    dest = tmp_path / "out"
    summary = import_gguf(path, dest, ImportOptions(dtype=mx.float32, quantize_bits=bits))
    assert summary.converted_to == f"MLX affine {bits}-bit (group 64, float32 scales)"
    written = json.loads((dest / "config.json").read_text())
    assert written["quantization"] == {"group_size": 64, "bits": bits}
    stored = mx.load(str(dest / "model.safetensors"))
    matrices = [k for k, w in weights.items() if w.ndim == 2]
    for name in matrices:
        base = name.removesuffix(".weight")
        assert stored[name].dtype == mx.uint32 and f"{base}.scales" in stored and f"{base}.biases" in stored, name
    assert all(stored[k].dtype == mx.float32 for k, w in weights.items() if w.ndim == 1)
    model, _ = load(str(dest))
    error = relative_rms(logits(model), logits(load_source(config, weights)))
    assert 0 < error < QUANTIZE_ERROR[bits]


def test_bad_quantize_bits_are_refused(tmp_path: Path) -> None:
    config, weights = source_weights("qwen2")
    path = write_gguf(tmp_path / "m.gguf", "qwen2", config, weights, matrices_as(Q.F32))
    with pytest.raises(GGUFImportError, match="--quantize takes 4 or 8 bits, not 3"):
        import_gguf(path, tmp_path / "out", ImportOptions(quantize_bits=3))


# --------------------------------------------------------------------------------------------
# Rope variants carried as tensors
# --------------------------------------------------------------------------------------------


def llama3_factors(head_dim: int, theta: float, factor: float) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores for Llama 3.1's rope scaling (low 1, high 4, 8192)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    out = []
    for w in wavelen:
        if w < 8192 / 4:
            out.append(1.0)
        elif w > 8192 / 1:
            out.append(factor)
        else:
            smooth = (8192 / w - 1) / (4 - 1)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_factors_become_its_rope_scaling(tmp_path: Path) -> None:
    config, weights = source_weights("llama")
    config["rope_theta"] = 500000.0
    factors = llama3_factors(config["head_dim"], config["rope_theta"], 8.0)
    path = write_gguf(tmp_path / "m.gguf", "llama", config, weights, matrices_as(Q.F32),
                      extra={"rope_freqs.weight": (factors, None)})
    import_gguf(path, tmp_path / "out", F32_OUT)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert "rope_freqs.weight" not in mx.load(str(tmp_path / "out" / "model.safetensors"))
    load(str(tmp_path / "out"))

    bent = factors.copy()
    bent[len(bent) // 2] *= 1.5
    path = write_gguf(tmp_path / "bent.gguf", "llama", config, weights, matrices_as(Q.F32),
                      extra={"rope_freqs.weight": (bent, None)})
    with pytest.raises(GGUFImportError, match="do not follow Llama 3's rope scaling"):
        import_gguf(path, tmp_path / "bent", F32_OUT)


def test_phi3_long_rope_factors_become_its_rope_scaling(tmp_path: Path) -> None:
    config, weights = source_weights("phi3")
    half = config["hidden_size"] // config["num_attention_heads"] // 2
    long, short = np.linspace(1, 4, half, dtype=np.float32), np.linspace(1, 1.5, half, dtype=np.float32)
    path = write_gguf(tmp_path / "m.gguf", "phi3", config, weights, matrices_as(Q.F32),
                      extra={"rope_factors_long.weight": (long, None), "rope_factors_short.weight": (short, None)})
    import_gguf(path, tmp_path / "out", F32_OUT)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_scaling"]["type"] == "longrope"
    # The float32 factors as stored: JSON keeps a float exactly.
    assert written["rope_scaling"]["long_factor"] == long.tolist()
    assert written["rope_scaling"]["short_factor"] == short.tolist()
    assert written["original_max_position_embeddings"] == config["original_max_position_embeddings"]
    load(str(tmp_path / "out"))


# --------------------------------------------------------------------------------------------
# Refusals: named, and nothing left installed
# --------------------------------------------------------------------------------------------


def test_an_undecodable_tensor_type_is_named_and_nothing_is_installed(tmp_path: Path) -> None:
    config, weights = source_weights("qwen2")
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    ints = np.zeros(weights[q_proj].shape, np.int32)
    others = {k: v for k, v in weights.items() if k != q_proj}
    path = write_gguf(tmp_path / "ints.gguf", "qwen2", config, others, matrices_as(Q.F32),
                      extra={"blk.0.attn_q.weight": (ints, None)})
    with pytest.raises(GGUFImportError) as err:
        import_gguf(path, tmp_path / "out")
    message = str(err.value)
    assert message.startswith("GGUF tensor type I32 is not supported (tensors: blk.0.attn_q.weight)")
    assert "Q4_K" in message.split("supported: ")[1] and "IQ2_XXS" in message
    assert not (tmp_path / "out").exists()

    store = ModelStore(tmp_path / "store")
    with pytest.raises(PullError, match="I32 is not supported"):
        create(store, path, "me/ints", say=lambda _: None)
    assert store.find("me/ints") is None
    assert not any((tmp_path / "store" / ".staging").iterdir())


def test_unknown_architecture_is_refused(tmp_path: Path) -> None:
    config, weights = source_weights("qwen2")
    path = write_gguf(tmp_path / "m.gguf", "mamba", config, weights, matrices_as(Q.F32))
    with pytest.raises(GGUFImportError, match="architecture 'mamba' is not supported; supported: llama, qwen2, "
                                              "qwen3, gemma2, gemma3, phi3"):
        import_gguf(path, tmp_path / "out")


def test_unknown_tensors_are_named(tmp_path: Path) -> None:
    config, weights = source_weights("qwen2")
    path = write_gguf(tmp_path / "m.gguf", "qwen2", config, weights, matrices_as(Q.F32),
                      extra={"blk.0.ssm_conv1d.weight": (np.zeros((4, 4), np.float32), None)})
    with pytest.raises(GGUFImportError, match="GGUF tensors not understood for qwen2: blk.0.ssm_conv1d.weight"):
        import_gguf(path, tmp_path / "out")


@pytest.mark.parametrize("content", [b"", b"GGML\x03\x00\x00\x00", b"GGUF\x03\x00\x00\x00\x05"])
def test_damaged_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFImportError, match="not a GGUF file|truncated or damaged"):
        import_gguf(path, tmp_path / "out")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    config, weights = source_weights("qwen2")
    path = write_gguf(tmp_path / "m.gguf", "qwen2", config, weights, matrices_as(Q.F32))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(GGUFImportError, match="truncated or damaged"):
        import_gguf(path, tmp_path / "out")


def test_unknown_pre_tokenizer_is_refused() -> None:
    with pytest.raises(GGUFImportError, match="pre-tokenizer 'tekken'"):
        build_tokenizer(tokenizer_metadata(pre="tekken"))


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [("smollm", ["1", "2", "3", "4", "5"]), ("llama-bpe", ["123", "45"]), ("default", ["12345"])],
)
def test_pre_tokenizer_digit_split(pre: str, pieces: list[str]) -> None:
    tok = build_tokenizer(tokenizer_metadata(pre=pre))
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("12345")] == pieces
    text = "the theme 12345 <|im_start|>"
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


# --------------------------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct Q4_1 GGUF
# --------------------------------------------------------------------------------------------

# Ids from the original Hugging Face SmolLM2 tokenizer.
SMOLLM2_LABEL_IDS = {
    "yes": 10407, "no": 4607, "Yes": 10539, "No": 5230, " yes": 9805, " no": 787,
    "A": 49, "B": 50, " A": 330, " B": 389,
}  # fmt: skip


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_smollm2_folder_contents(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    # The original Hugging Face SmolLM2-135M-Instruct configuration.
    expected = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    }
    assert {key: config.get(key) for key in expected} == expected
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    weights = mx.load(str(smollm2_dir / "model.safetensors"))
    assert "lm_head.weight" not in weights
    assert {w.dtype for w in weights.values()} == {compute_dtype()}  # float32 on the CPU, bfloat16 on a GPU


@pytest.mark.parametrize(("text", "token_id"), SMOLLM2_LABEL_IDS.items())
def test_smollm2_label_token_ids(smollm2_tokenizer: Any, text: str, token_id: int) -> None:
    assert smollm2_tokenizer.encode(text, add_special_tokens=False) == [token_id]
    assert smollm2_tokenizer.encode(text) == [token_id]  # no BOS is added


@pytest.mark.parametrize(
    "text",
    [
        "The capital of France is Paris.",
        "Order 12345 shipped on 2024-06-01 for $99.95",
        "naïve café, Grüße, 日本語, emoji 🤖🚀, tabs\tand\nnewlines  double  spaces ",
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    ],
)
def test_smollm2_round_trip(smollm2_tokenizer: Any, text: str) -> None:
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert smollm2_tokenizer.decode(ids) == text


def test_smollm2_special_and_digit_tokens(smollm2_tokenizer: Any) -> None:
    assert smollm2_tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert smollm2_tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]
    assert smollm2_tokenizer.eos_token == "<|im_end|>"
    # SmolLM2's pre-tokenizer splits numbers into single digits.
    assert smollm2_tokenizer.encode("2024", add_special_tokens=False) == [
        smollm2_tokenizer.convert_tokens_to_ids(d) for d in "2024"
    ]


def test_smollm2_chat_template(smollm2_dir: Path, smollm2_tokenizer: Any) -> None:
    rendered = smollm2_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (smollm2_dir / "chat_template.jinja").read_text() == smollm2_tokenizer.chat_template


@pytest.mark.slow
def test_smollm2_greedy_generation(smollm2_dir: Path) -> None:
    model, tokenizer = load(str(smollm2_dir))
    # float32 on any device: this checks the importer, not the compute dtype (the chat turn's first
    # word is a near-tie, "The" 0.08 above "L", that bfloat16's rounding of the weights turns around).
    model.set_dtype(mx.float32)
    greedy = make_sampler(temp=0.0)
    assert "Paris" in generate(model, tokenizer, "The capital of France is", max_tokens=3, sampler=greedy)
    # The chat turn is the sharper check: with Q/K rows left in llama.cpp's order the model
    # still completes the plain prompt but answers this one with an immediate end of turn.
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    assert "Paris" in generate(model, tokenizer, prompt, max_tokens=8, sampler=greedy)
    assert 2 in tokenizer.eos_token_ids


def test_tiny_model_generates(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["vocab_size"] == 49152
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert (tiny_model_dir / "chat_template.jinja").is_file()
    model, tokenizer = load(str(tiny_model_dir))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    responses = list(stream_generate(model, tokenizer, prompt, max_tokens=4, sampler=make_sampler(temp=0.0)))
    assert 1 <= len(responses) <= 4
    assert all(0 <= r.token < config["vocab_size"] for r in responses)


@pytest.mark.slow
def test_smollm2_logits_match_transformers_gguf_loader(smollm2_dir: Path, smollm2_gguf: Path) -> None:
    """transformers reads the same file through its own GGUF loader (the gguf package's decoding,
    its own name mapping and Q/K un-permutation) into a float32 PyTorch model: both models give
    the same logits. The importer before the gguf package wrote float16 and was 0.041 apart."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    ours, tokenizer = load(str(smollm2_dir))
    ours.set_dtype(mx.float32)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    reference = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name,
                                                     dtype=torch.float32)
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits[0].numpy()
    got = logits(ours, ids)
    # Measured 1.2e-4: float32 sums in another order, on another BLAS (tests/precision.py).
    assert np.abs(got - want).max() < F32_LOGIT
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_swama_create_converts_and_swama_list_shows_the_card(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    config, weights = source_weights("qwen3")
    path = write_gguf(tmp_path / "tiny-Q8_0.gguf", "qwen3", config, weights, matrices_as(Q.Q8_0),
                      file_type=gguf.LlamaFileType.MOSTLY_Q8_0)
    env = {**os.environ, "SWAMA_MODELS": str(tmp_path / "store")}
    cli = [sys.executable, "-m", "swama.handlers.cli"]
    done = subprocess.run([*cli, "create", str(path), "--name", "me/tiny", "--quantize", "8"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Installed me/tiny" in done.stdout + done.stderr
    assert "MLX affine 8-bit" in done.stdout + done.stderr
    listed = json.loads(subprocess.run([*cli, "list", "--format", "json"], env=env, capture_output=True, text=True,
                                       timeout=120, check=True).stdout)
    [model] = listed
    assert model["source"] == "gguf:tiny-Q8_0.gguf"
    assert model["gguf"]["file_type"] == "Q8_0" and model["gguf"]["architecture"] == "qwen3"
    assert model["gguf"]["tensor_types"]["Q8_0"] == sum(w.ndim == 2 for w in weights.values())
    assert model["converted_to"].startswith("MLX affine 8-bit (group 64")

    refused = subprocess.run([*cli, "create", str(path), "--name", "me/other", "--quantize", "3"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--quantize" in refused.stderr
