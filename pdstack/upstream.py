"""Import modules of the pinned SGLang (installed with --no-deps) without running `sglang/__init__.py`.

That file sets up SGLang's frontend language and patches transformers (`hf_transformers_patches.apply_all`, which
imports transformers' model code and torch._dynamo). pdstack needs only leaf modules: the server's argument parser
(controller/flags.py) and, in the sim TEST ENGINE, the tool-call detector and reasoning parser. With transformers
installed, that patching breaks any process that also loaded Ansible (torch._dynamo refuses Ansible's sys.intern
patch), so every pdstack import of SGLang goes through here: a bare `sglang` package object whose __path__ is the
installed one, so `sglang.srt...` resolves to SGLang's own files.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def sglang_module(name: str) -> types.ModuleType:
    """`importlib.import_module(name)` for a module under `sglang.`, skipping sglang/__init__.py."""
    if not name.startswith("sglang."):
        raise ValueError(f"{name!r} is not an sglang module")
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("sglang==0.5.23 is not installed: run ./dev.sh setup (it installs it with --no-deps)")
        pkg = types.ModuleType("sglang", "SGLang without its package __init__ (pdstack/upstream.py)")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__file__ = spec.origin
        pkg.__spec__ = spec
        sys.modules["sglang"] = pkg
    return importlib.import_module(name)
