"""Tiny random-weight cross-encoders of the two real reranker architectures, written by transformers
itself (`BertForSequenceClassification`, `XLMRobertaForSequenceClassification`, one label, seeded) with a
donor's BERT tokenizer: no real cross-encoder weights ship offline, so these carry the plumbing, and
transformers' own forward is the reference their scores are checked against.

    python -m tools.testmodels.cross_encoder TOKENIZER_DIR DEST [--arch bert|xlm-roberta]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def build_cross_encoder(tokenizer_dir: Path, dest: Path, arch: str = "bert", seed: int = 0) -> Path:
    import torch
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    shape = dict(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, num_labels=1,
                 # weights 25x transformers' default spread: the [CLS] state then depends on the text, so
                 # the scores spread over (0, 1) instead of sitting at one value
                 initializer_range=0.5)
    torch.manual_seed(seed)
    if arch == "bert":
        model = BertForSequenceClassification(BertConfig(max_position_embeddings=512, **shape))
    elif arch == "xlm-roberta":
        config = XLMRobertaConfig(max_position_embeddings=514, type_vocab_size=1, pad_token_id=tokenizer.pad_token_id,
                                  **shape)
        model = XLMRobertaForSequenceClassification(config)
    else:
        raise ValueError(f"unknown cross-encoder architecture {arch!r}")
    model.eval()
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, dest / name)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tokenizer_dir", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--arch", default="bert", choices=("bert", "xlm-roberta"))
    args = parser.parse_args(argv)
    print(build_cross_encoder(args.tokenizer_dir, args.dest, args.arch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
