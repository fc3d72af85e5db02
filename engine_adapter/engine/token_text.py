"""Token ids -> display text, one piece per token, faithful to the full text.

Contract: ``TokenTexts(tokenizer)`` gives ``piece(ids, i)``-style incremental
decoding: the text a token adds to the completion (so the pieces concatenate
to the decoded completion), with UTF-8 sequences split across byte-level
tokens carried to the token that completes them (the earlier ones get "").
``draft_text(id)`` decodes a lone (rejected) draft token for display.
The tokenizer is any Hugging Face tokenizer loaded from the model directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine_adapter.torch_extras import hide_mismatched_torch_extras

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"


def tokenizer_class() -> type:
    """transformers' ``AutoTokenizer``, imported on first call: seconds, so the app spawns the engine
    before anything needs a tokenizer and the two overlap (docs/benchmarks.md, cold start). Two
    threads' first imports at once fail (transformers' lazy module): import it once before
    tokenizers load side by side."""
    hide_mismatched_torch_extras()  # before transformers is imported: a torchvision unfit for this torch breaks it
    from transformers import AutoTokenizer

    return AutoTokenizer


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    return tokenizer_class().from_pretrained(str(model_dir))


@dataclass
class IncrementalText:
    """Decodes one request's completion token by token (like vLLM's detokenizer)."""

    tokenizer: PreTrainedTokenizerBase
    ids: list[int] = field(default_factory=list)
    _prefix: int = 0  # start of the window re-decoded for context
    _read: int = 0  # tokens whose text has been handed out

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prev = self.tokenizer.decode(self.ids[self._prefix : self._read])
        new = self.tokenizer.decode(self.ids[self._prefix :])
        if new.endswith(_REPLACEMENT) and len(self.ids) - self._read < 4:
            return ""  # an incomplete UTF-8 sequence: wait for its next byte
        piece = new[len(prev) :] if new.startswith(prev) else new
        self._prefix = max(self._read - 4, 0)
        self._read = len(self.ids)
        return piece


def draft_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    return tokenizer.decode([token_id])
