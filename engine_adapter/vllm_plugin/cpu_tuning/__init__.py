"""What a CPU engine needs to start and serve quickly; nothing here is about speculation.

- ``lazy_kv_cache``: the KV cache mapped instead of written (a launch does not write gigabytes of zeros);
- ``loading_cores``: the worker loads its models on every core, then serves on its own;
- ``quiet_executor``: the engine core polls its worker instead of spinning through every step;
- ``isa_limit``: an AVX-512 CPU run as the AVX2 kind (``SPEC_EXPLORER_CPU_AS=AVX2``), for measuring.

``workers_cpu`` composes the first two into the CPU worker; ``paths.QUIET_EXECUTOR`` names the third.
"""
