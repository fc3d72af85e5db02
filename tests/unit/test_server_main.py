"""The server's main module: what vLLM's spawned engine core and worker import first (as ``__mp_main__``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_adapter.vllm_plugin.paths import SERVER_MODULE

HEAVY = ("vllm", "torch", "fastapi", "transformers")  # what vLLM's own main module would bring in


@pytest.mark.parametrize("module", HEAVY)
def test_importing_the_main_module_imports_nothing_heavy(module: str) -> None:
    code = f"import sys, importlib; importlib.import_module({SERVER_MODULE!r}); print({module!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_run_as_a_program_it_is_vllms_server() -> None:
    """``python -m SERVER_MODULE --help`` is vLLM's OpenAI server's command line."""
    out = subprocess.run(
        [sys.executable, "-m", SERVER_MODULE, "--help"], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--speculative-config" in out.stdout and "--max-num-batched-tokens" in out.stdout
