"""The main module vLLM's OpenAI server runs under: ``python -m engine_adapter.vllm_plugin.server_main ARGS``.

Contract: the same server, arguments and behaviour as ``python -m vllm.entrypoints.openai.api_server
ARGS`` (that module's ``__main__`` block calls the same ``main``), launched by ``engine.launcher.EngineProcess``
and ``scripts/vllm_start.py`` (``paths.SERVER_MODULE``). Importing this module does one thing besides:
``torch_extras.hide_mismatched_torch_extras()`` (standard library only, a few milliseconds), so that
torchvision, torchaudio or torchcodec builds that do not match the installed torch (PyPI's CUDA builds
beside torch ``+cpu``) are absent to vLLM and transformers in every process that imports it. Nothing else
is imported unless this module runs as the program.

Why: vLLM on CPU starts its engine core and the engine core its worker with multiprocessing's
``spawn``, and a spawned process first imports its parent's main module (as ``__mp_main__``).
Under vLLM's own module that is the whole HTTP server (FastAPI, the OpenAI protocol types, gRPC,
OpenTelemetry, every pooling endpoint) in the engine core and again in the worker, neither of
which serves HTTP. Under this module a spawned process imports only what its own work needs.
The hiding sits outside the ``__main__`` block for the same reason: the server, the engine core
and the worker each run it before anything of theirs imports transformers.
"""

from engine_adapter.torch_extras import hide_mismatched_torch_extras

hide_mismatched_torch_extras()

if __name__ == "__main__":
    from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

    require_tested_vllm()
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
