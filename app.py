"""Speculative decoding explorer: wires the engine service to the UI and launches.

python app.py [--port 7860] [--host 127.0.0.1] [--method draft] [--k 3] [--k-table JSON]
              [--target SPEC] [--draft SPEC] [--variant full|int8-target|int8-pair|int4-target|int4-pair]
              [--attach URL] [--record FILE]
python app.py --replay TRACE.jsonl [--replay-speed X]      # a recorded session, no engine

Listening on anything but loopback (``--host 0.0.0.0``, a Space) with no presenter key, the app
makes a key itself and prints it once in its own log: engine-wide settings are then locked for
visitors out of the box (``presenter_key``).
"""

from __future__ import annotations

import argparse
import gc
import os
import secrets
import signal
import sys

from engine_adapter.engine_config import (
    FULL_VARIANT,
    METHODS,
    MODEL_VARIANTS,
    EngineConfig,
    add_model_arguments,
    validate_k_table,
)
from engine_adapter.prompts import load_presets
from engine_adapter.service.engine_service import EngineService


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Speculative decoding explorer on a live vLLM engine")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--method", choices=METHODS, default="draft")
    p.add_argument("--k", type=int, default=3)
    p.add_argument(
        "--k-table",
        default=None,
        help="vLLM's num_speculative_tokens_per_batch_size as JSON, e.g. '[[1,2,3],[3,8,1],[9,64,0]]'",
    )
    p.add_argument(
        "--k-max",
        type=int,
        default=5,
        help="live K policies (fixed K, table, auto, auction switch without a restart): vLLM runs with "
        "num_speculative_tokens = K-MAX and a K table; 0 = a plain fixed-K engine",
    )
    p.add_argument(
        "--policy",
        choices=("auto", "auction", "fixed"),
        default=None,
        help="the K policy in force at start (default: auto, or the --k-table if one is given); "
        "'fixed' = K=--k for every batch size. Switchable live in the 'K under load' panel",
    )
    p.add_argument(
        "--reserved-cpus",
        type=int,
        default=1,
        help="on a CPU, cores vLLM keeps free of its worker (VLLM_CPU_NUM_OF_RESERVED_CPU; default 1, vLLM's own: "
        "with a page open on 2 CPU cores the worker on one core decoded faster than on both, whose two compute threads "
        "wait on each other whenever the page takes a core; 0 is faster with no page open; docs/benchmarks.md)",
    )
    p.add_argument(
        "--engine-nice",
        type=int,
        default=10,
        help="run vLLM's engine core and worker at this lower CPU priority once they serve (`nice`, 0..19; default "
        "10; 0 = the app's; its API server keeps the app's): on a machine the page shares with the engine, the page's "
        "work comes first (measured: lower step-to-screen latency and more tokens/s with a page open, "
        "docs/benchmarks.md)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--compile",
        dest="eager",
        action="store_false",
        default=None,
        help="let vLLM compile the model (torch.compile, and CUDA graphs on a GPU; slower start) even on a CPU, "
        "where eager mode is the default",
    )
    mode.add_argument(
        "--eager",
        dest="eager",
        action="store_true",
        default=None,
        help="run the model eagerly even on a GPU, where compiling with CUDA graphs is the default "
        "(neither flag: eager on a CPU, CUDA graphs on a GPU)",
    )
    p.add_argument(
        "--standing-drafter",
        action="store_true",
        help="vLLM's own behaviour: the draft model runs its pass even at K=0 (default: it idles "
        "at K=0 and the requests it skipped get no more drafts; docs/k-policies.md, 'Idle drafter')",
    )
    add_model_arguments(p)
    p.add_argument(
        "--variant",
        choices=list(MODEL_VARIANTS),
        default=FULL_VARIANT,
        help="the pair as it is, or int8 W8A8 (or int4 W4A16, AVX-512 only) copies of the target (and draft), "
        "made once in the model cache",
    )
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests the engine runs at once, at most (64)")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="tokens one engine step schedules, at most, prefill chunks included (default: 2048 on a CPU, "
        "vLLM's own there; 8192 on a GPU)",
    )
    p.add_argument("--attach", default=None, help="use a running vLLM server at this URL")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory for --attach")
    p.add_argument(
        "--presenter-key",
        default=os.environ.get("SPEC_EXPLORER_PRESENTER_KEY"),
        help="lock engine-wide settings (method, K, K policy) behind this key, for a classroom "
        "(or set SPEC_EXPLORER_PRESENTER_KEY, e.g. as a Space secret)",
    )
    p.add_argument(
        "--record",
        default=None,
        metavar="FILE",
        help="record the session (engine steps, foreground requests, load, policy changes) to FILE; every page "
        "says so while it records",
    )
    p.add_argument(
        "--record-max-mb",
        type=float,
        default=200.0,
        help="stop recording when the file reaches this size (MiB; default 200); the presenter's page says so",
    )
    p.add_argument(
        "--replay",
        default=None,
        metavar="TRACE",
        help="replay a recorded session trace in the same UI, with no engine at all",
    )
    p.add_argument("--replay-speed", type=float, default=1.0, help="replay this many times faster (default 1)")
    return p.parse_args(argv)


def start_policy(args: argparse.Namespace) -> str:
    """LivePolicy's default_policy: "auto" unless a fixed K or a K table was asked for ("configured":
    the config's K or table, which ``--policy fixed`` names)."""
    if args.policy == "fixed" or (args.policy is None and args.k_table):
        return "configured"
    return args.policy or "auto"


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine config the command line asks for; ValueError where it is invalid."""
    k_table = validate_k_table(args.k_table) if args.k_table else None
    live = args.k_max > 0 and args.method != "off"  # room for live K policies
    return EngineConfig(
        method=args.method,
        k=args.k,
        k_table=k_table,
        target=args.target,
        draft=args.draft,
        variant=args.variant,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_gib=args.kv_cache_gib,
        idle_drafter=not args.standing_drafter,
        reserved_cpus=args.reserved_cpus,
        nice=args.engine_nice,
        enforce_eager=args.eager,  # None: the platform's default (eager on a CPU, CUDA graphs on a GPU)
        k_max=max(args.k_max, args.k, *(k for _, _, k in k_table or [])) if live else None,
    ).checked()


def presenter_key(args: argparse.Namespace, public: bool) -> str | None:
    """The key engine-wide settings are locked behind: the one given; else, on a public bind, one made
    now and printed once to the app's own log (a Space shows its log to its owner only); else None."""
    if args.presenter_key:
        return args.presenter_key
    if not public:
        return None
    key = secrets.token_urlsafe(12)
    print(
        "This explorer listens publicly and no presenter key was given: engine-wide settings (method, K, K "
        f"policy, acceptance rule, re-measuring, the speculation-off engine) are locked behind the key {key} "
        "(enter it on the page to unlock them; set --presenter-key or SPEC_EXPLORER_PRESENTER_KEY to choose one).",
        flush=True,
    )
    return key


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        config = engine_config(args)
    except ValueError as e:
        sys.exit(f"error: {e}")
    presets = load_presets()
    if args.replay and args.record:
        sys.exit("error: --record and --replay do not go together")
    if args.replay:  # a recorded session plays in place of the engine (engine_adapter/service/replay_service.py)
        from engine_adapter.service.replay_service import ReplayService

        try:
            service = ReplayService(args.replay, speed=args.replay_speed)
        except OSError as e:
            sys.exit(f"error: cannot replay {args.replay}: {e.strerror or e}")
        except ValueError as e:  # names the file and the line
            sys.exit(f"error: cannot replay: {e}")
        config = service.status().config or config
    else:
        service = EngineService(background_prompts=presets, policy_options={"default_policy": start_policy(args)})
        if args.attach:
            service.attach(args.attach, args.tokenizer, args.k)
        else:
            service.start(config)
    recorder = None
    if args.record:  # follows the service; written on exit too (engine_adapter/trace/session_recorder.py)
        from engine_adapter.trace.session_recorder import SessionRecorder

        recorder = SessionRecorder(service, args.record, max_bytes=int(args.record_max_mb * 2**20)).start()
    # SIGTERM (a Space stopping, `kill`) exits through the same clean-up as Ctrl-C;
    # SIGINT is re-armed because a shell starts background jobs with it ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # The UI's imports (Gradio, plotly, pandas: seconds on 2 CPU cores) come after the engine's spawn,
        # so that they overlap its start instead of delaying it (docs/benchmarks.md, cold start).
        # Gradio recomputes a pandas summary of its last 10,000 events after every event, for a monitoring
        # page this app does not use: 15 ms a time once an open page's timers have sent 10,000 events
        os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "1000")
        from explorer.page import PageDefaults, build_page, launch_page
        from explorer.panels.presenter import Presenter
        from explorer.panels.visitors import exposure_for

        exposure = exposure_for(args.host)
        defaults = PageDefaults(
            config=config,
            presenter=Presenter(presenter_key(args, exposure.public)),
            exposure=exposure,
            recording=recorder.status if recorder is not None else None,
        )
        demo = build_page(service, presets, defaults)
        # the libraries and the page are there for good: out of the garbage collector's full collections,
        # which otherwise walk them all (about 0.1 s idle, 0.5-0.9 s beside the engine on 2 cores) and
        # stall the page's event loop (the service freezes again once the engine is ready)
        gc.freeze()
        launch_page(demo, args.host, args.port, exposure)
    finally:
        if recorder is not None:
            recorder.close()
        service.close()


if __name__ == "__main__":
    main()
