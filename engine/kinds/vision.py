"""Vision-language models through mlx-vlm, behind the interface the generator and the scorer use.

An mlx-vlm model is a vision tower plus a language model. The engine drives the language model the
way it drives an mlx-lm model: `LanguageView` gives it mlx-lm's call shape (`view(ids, cache=...,
input_embeddings=...)` returning logits, `make_cache()`), so text-only requests, generation and
decision scoring run on vision models unchanged. A prompt with images is first turned into input
embeddings (`VisionSupport.encode`): the processor expands each image into its image tokens and
prepares the pixels, the vision tower encodes them once, and the result feeds the language model.

Multimodal rotary positions (the Qwen-VL family) live on the language model object between calls.
Each view owns that state for its own request and puts it back before every call, so requests that
take turns on one model never read each other's positions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swama.engine.files.kinds import VISION
from swama.engine.model import LoadedModel, cast_for_device, eos_ids_of

# Positional state mlx-vlm's mRoPE language models keep between calls.
_POSITION_STATE = ("_position_ids", "_rope_deltas")
# Processor outputs that are not model inputs of their own.
_NOT_MODEL_INPUTS = ("input_ids", "pixel_values", "attention_mask", "token_type_ids", "mm_token_type_ids")

LOW_DETAIL_SIDE = 512  # `detail: "low"` on every image of a decision: fit within 512 px per side
MULTIMODAL_CONTEXT_LIMIT = 4096  # a prompt with images must stay strictly below this many tokens


@dataclass
class Processed:
    """A prompt through the processor: token ids with the image tokens expanded, and pixels."""

    ids: list[int]
    pixel_values: Any
    mask: Any
    extra: dict[str, Any]
    image_tokens: int
    last_image_index: int  # -1 without images; a shared prefix must reach past it


@dataclass
class Prefill:
    """What the language model needs to prefill a prompt with images: its token ids, the input
    embeddings (image features already in place) and the extra inputs the model computed with them
    (multimodal positions and the like)."""

    ids: list[int]
    embeddings: Any  # mx.array (1, len(ids), hidden)
    extra: dict[str, Any] = field(default_factory=dict)
    image_tokens: int = 0

    def head(self, n: int) -> Prefill:
        """The first `n` tokens (n covers every image token), for a shared decision prefix."""
        extra = dict(self.extra)
        if "position_ids" in extra:
            extra["position_ids"] = extra["position_ids"][..., :n]
        head = Prefill(self.ids[:n], self.embeddings[:, :n], extra, self.image_tokens)
        _evaluate([head.embeddings, extra.get("position_ids")])
        return head


class LanguageView:
    """mlx-lm's model interface over an mlx-vlm language model, with per-request positional state."""

    def __init__(self, language_model: Any) -> None:
        self.language_model = language_model
        self._state: dict[str, Any] = {}
        self._prefill: Prefill | None = None

    @property
    def layers(self) -> Any:
        return self.language_model.layers

    def make_cache(self) -> list[Any]:
        from mlx_vlm.models.cache import make_prompt_cache

        return make_prompt_cache(self.language_model)

    def expect(self, prefill: Prefill) -> None:
        """The next call with input embeddings prefills `prefill` (its extra inputs go with it)."""
        self._prefill = prefill

    def __call__(self, inputs: Any, cache: Any = None, input_embeddings: Any = None) -> Any:
        lm = self.language_model
        for name in _POSITION_STATE:
            if hasattr(lm, name):
                setattr(lm, name, self._state.get(name))
        extra: dict[str, Any] = {}
        if input_embeddings is not None and self._prefill is not None:
            extra = self._prefill.extra
        out = lm(inputs, inputs_embeds=input_embeddings, cache=cache, **extra)
        self._state = {name: getattr(lm, name) for name in _POSITION_STATE if hasattr(lm, name)}
        # Evaluated now: a request's next call may run on another worker thread, and MLX cannot
        # evaluate a lazy array on a thread other than the one whose stream built it.
        _evaluate(self._state.values())
        return out.logits


def _evaluate(values: Any) -> None:
    import mlx.core as mx

    arrays = [v for v in values if isinstance(v, mx.array)]
    if arrays:
        mx.eval(arrays)


def fit_within(image: Any, side: int) -> Any:
    """`image` scaled down (never up) so that neither side exceeds `side` pixels."""
    width, height = image.size
    if max(width, height) <= side:
        return image
    scale = side / max(width, height)
    return image.resize((max(1, round(width * scale)), max(1, round(height * scale))))


class VisionSupport:
    """The vision half of a loaded mlx-vlm model: its processor and its image encoder."""

    def __init__(self, model: Any, processor: Any) -> None:
        self.model = model
        self.processor = processor
        self.image_token_id = _image_token_id(model, processor)

    def view(self) -> LanguageView:
        return LanguageView(self.model.language_model)

    def process(self, prompt: str, images: Sequence[Any]) -> Processed:
        """A rendered prompt whose image placeholders stand for `images` (PIL images, in order),
        through the model's processor: image tokens expanded, pixels resized and normalized."""
        from mlx_vlm.utils import prepare_inputs

        rgb = [image if image.mode == "RGB" else image.convert("RGB") for image in images]
        inputs = prepare_inputs(self.processor, images=rgb, prompts=[prompt])
        ids = inputs["input_ids"][0].tolist()
        extra = {k: v for k, v in inputs.items() if k not in _NOT_MODEL_INPUTS and v is not None}
        _evaluate([inputs["pixel_values"], inputs.get("attention_mask"), *extra.values()])
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        return Processed(ids, inputs["pixel_values"], inputs.get("attention_mask"), extra, len(positions),
                         positions[-1] if positions else -1)

    def embed(self, processed: Processed) -> Prefill:
        """Run the vision tower and place the image features among the token embeddings."""
        import mlx.core as mx

        ids = mx.array(processed.ids)[None]
        features = self.model.get_input_embeddings(ids, processed.pixel_values, mask=processed.mask,
                                                   **processed.extra)
        computed = {k: v for k, v in features.to_dict().items() if k != "inputs_embeds" and v is not None}
        mx.eval(features.inputs_embeds)
        _evaluate(computed.values())
        return Prefill(processed.ids, features.inputs_embeds, {**processed.extra, **computed},
                       processed.image_tokens)

    def encode(self, prompt: str, images: Sequence[Any]) -> Prefill:
        return self.embed(self.process(prompt, images))


def vision_of(model: LoadedModel) -> VisionSupport | None:
    """A vision-language model's processor and image encoder; None for any other model."""
    return model.beside.get(VisionSupport)


def network(model: LoadedModel) -> Any:
    """The model to run one request on. A vision model's language model keeps positional state
    between calls, so every request gets its own view of it."""
    vision = vision_of(model)
    return vision.view() if vision is not None else model.model


def _image_token_id(model: Any, processor: Any) -> int | None:
    config = getattr(model, "config", None)
    for name in ("image_token_index", "image_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    value = getattr(processor, "image_token_id", None)
    return value if isinstance(value, int) else None


def load_vision_model(path: Path) -> tuple[Any, Any]:
    """The mlx-vlm model and processor of a local folder."""
    from mlx_vlm.utils import load

    return load(str(path))


def load_vision_language_model(model_id: str, path: Path) -> LoadedModel:
    """mlx-vlm's model and processor; the tokenizer is mlx-lm's wrapper over the same files, so
    text is encoded, rendered and detokenized exactly as for a language model."""
    from mlx_lm.utils import load_tokenizer

    model, processor = load_vision_model(path)
    cast_for_device(model)
    tokenizer = load_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    merged = {**text_config, **{k: v for k, v in config.items() if k != "text_config"}}
    loaded = LoadedModel(model_id, path, model, tokenizer, merged, eos_ids_of(path, tokenizer), kind=VISION)
    loaded.beside.set(VisionSupport, VisionSupport(model, processor))
    return loaded
