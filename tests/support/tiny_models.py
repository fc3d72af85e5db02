"""Tiny random-init model families for fast tests on a real vLLM engine.

Contract: ``build_tiny_family(root)`` writes four model directories that vLLM
loads from disk (config.json + safetensors + a locally trained byte-level BPE
tokenizer) and returns their paths:

- ``target``:    Qwen2 architecture, hidden 256, 2 layers, seeded random init.
- ``same``:      a byte-identical copy of the target (every draft is accepted).
- ``random``:    an independent random init (almost no draft is accepted).
- ``perturbed``: the target plus Gaussian noise (some drafts are accepted).
- ``close``: the target plus a little noise (about 0.93 of greedy drafts accepted, not all: enough
  that drafting pays at one request where a draft pass costs about a target step).

Everything is built here, in seconds, with no network: the tokenizer is
trained on a small built-in corpus, so nothing is downloaded from a hub.
Weights are float32 so greedy decoding is stable under the different batch
shapes of speculative verification.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

VOCAB_SIZE = 512

# Enough varied text for a byte-level BPE of VOCAB_SIZE merges.
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small draft model propose tokens.",
    "The target model verifies the draft tokens in one forward pass.",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "Once upon a time there was a little robot who loved to count stars.",
    "What is 12 times 7? The answer is 84.",
    "Translate to French: the cat sits on the mat. Le chat est assis sur le tapis.",
    "import numpy as np\nx = np.zeros((3, 4))\n",
] * 20


@dataclass(frozen=True)
class TinyFamily:
    target: Path
    same: Path
    random: Path
    perturbed: Path
    close: Path


def train_tokenizer(out_dir: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 2,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.save_pretrained(out_dir)
    return fast


def _config(tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 64: a size vLLM's CPU attention supports
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # A wide init makes logits peaked, so greedy argmax has no near-ties.
        initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )


def _save(model: Qwen2ForCausalLM, tok_dir: Path, out: Path) -> Path:
    model.save_pretrained(out, safe_serialization=True)
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)
    # The generation config must not carry sampling defaults into vLLM.
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": model.config.eos_token_id}))
    return out


def build_tiny_family(root: Path, noise: float = 0.05, close_noise: float = 0.004) -> TinyFamily:
    """Write the five tiny models under ``root`` (idempotent) and return them."""
    root = Path(root)
    done = root / "COMPLETE"
    paths = TinyFamily(
        target=root / "target",
        same=root / "same",
        random=root / "random",
        perturbed=root / "perturbed",
        close=root / "close",
    )
    if done.exists():
        return paths
    root.mkdir(parents=True, exist_ok=True)
    tok_dir = root / "tokenizer"
    tokenizer = train_tokenizer(tok_dir)
    config = _config(tokenizer)

    torch.manual_seed(0)
    target = Qwen2ForCausalLM(config).float().eval()
    _save(target, tok_dir, paths.target)
    _save(target, tok_dir, paths.same)

    torch.manual_seed(1)
    _save(Qwen2ForCausalLM(config).float().eval(), tok_dir, paths.random)

    for out, scale, seed in ((paths.perturbed, noise, 2), (paths.close, close_noise, 3)):
        draft = copy.deepcopy(target)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in draft.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * scale)
        _save(draft, tok_dir, out)
    done.write_text("ok")
    return paths


if __name__ == "__main__":
    import sys

    print(build_tiny_family(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny")))
