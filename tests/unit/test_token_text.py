"""IncrementalText: per-token pieces that concatenate to the decoded text."""

from __future__ import annotations

import pytest

from engine_adapter.engine.token_text import IncrementalText, draft_text, load_tokenizer
from tests.support.tiny_models import train_tokenizer


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    train_tokenizer(out)  # only the tokenizer: no model weights needed here
    return load_tokenizer(out)  # loaded from disk, as the client does


TEXTS = [
    pytest.param("The quick brown fox jumps over the lazy dog.", id="ascii"),
    pytest.param("x . y , z ? don't  stop !", id="ascii-punctuation-spaces"),
    pytest.param("def add(a, b):\n    return a + b\n\n\tif x:\n\t\tpass\n", id="code-newlines-indent"),
    pytest.param("  leading and trailing  \n", id="edge-whitespace"),
    pytest.param("ok 😀🎉 done 👨‍👩‍👧 family", id="emoji-zwj"),
    pytest.param("中文字符测试，日本語のテキスト", id="cjk"),
    pytest.param("café naïve Ångström résumé", id="accented"),
    pytest.param("e\u0301 combining", id="combining-mark"),
    pytest.param("a\x00b\x1b[31mred\x1b[0m\x7f\r\n\x0c", id="control-chars"),
    pytest.param("mixed: π≈3.14 → ✓ 😀 中 é\n", id="mixed"),
]


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    inc = IncrementalText(tokenizer)
    pieces = [inc.push(i) for i in ids]
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert "\ufffd" not in "".join(pieces)
    assert inc.ids == ids


@pytest.mark.parametrize(
    "char",
    [pytest.param("é", id="2-byte"), pytest.param("中", id="3-byte"), pytest.param("😀", id="4-byte")],
)
def test_split_utf8_waits_for_completion(tokenizer, char):
    ids = tokenizer.encode(char)
    assert len(ids) == len(char.encode()), "the tiny BPE spells non-ASCII as byte tokens"
    inc = IncrementalText(tokenizer)
    assert inc.push(tokenizer.encode("a")[0]) == "a"
    for i in ids[:-1]:
        assert inc.push(i) == ""  # not valid UTF-8 on its own yet
        assert "\ufffd" in draft_text(tokenizer, i)  # a lone byte shows as a replacement
    assert inc.push(ids[-1]) == char
    assert inc.push(tokenizer.encode("b")[0]) == "b"
