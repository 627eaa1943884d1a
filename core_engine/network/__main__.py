"""Serve a local checkpoint over the OpenAI API.

python -m core_engine.network --model PATH|demo|calculator-demo|r1-demo
    [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--allow-unauthenticated-public]
    [--kv-strategy paged|contiguous] [--max-batch-size N] [--max-seq-len N]
    [--kv-cache-bytes N] [--gpu-memory-utilization F]
    [--served-model-name NAME] [--device cpu|cuda] [--dtype float32|bfloat16|float16]
    [--stream-write-timeout SECONDS]

A non-loopback `--host` needs `--api-key` (or the explicit `--allow-unauthenticated-public`).
The API key may also come from the `RLWB_API_KEY` environment variable. Without a key, a
loopback server answers only requests whose Host header names loopback (DNS rebinding).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Sequence

from core_engine.assets import SHIPPED_POLICIES
from core_engine.network.limits import ServerLimits
from core_engine.task import DTYPE_NAMES, KV_STRATEGIES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m core_engine.network", description=__doc__.partition("\n")[0]
    )
    parser.add_argument(
        "--model",
        required=True,
        help="local Hugging Face checkpoint directory, or a shipped policy: "
        + ", ".join(SHIPPED_POLICIES),
    )
    parser.add_argument("--served-model-name", help="the API's model id (default: --model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--kv-strategy", choices=KV_STRATEGIES, default="paged")
    parser.add_argument("--max-batch-size", type=int, help="request slots (default: the engine's)")
    parser.add_argument("--max-seq-len", type=int, help="default: the model's context")
    parser.add_argument("--kv-cache-bytes", type=int, help="KV budget (docs/engine.md)")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="CUDA: fraction of the free memory after the weights given to the KV pool "
        "(default: the engine's)",
    )
    parser.add_argument("--api-key", default=os.environ.get("RLWB_API_KEY"))
    parser.add_argument(
        "--allow-unauthenticated-public",
        action="store_true",
        help="serve a non-loopback host without an API key",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype",
        choices=[*sorted(DTYPE_NAMES), "auto"],
        default="auto",
        help="engine dtype (auto: bfloat16 on CUDA, float32 on CPU)",
    )
    parser.add_argument(
        "--stream-write-timeout",
        type=float,
        default=ServerLimits.stream_write_timeout_s,
        help="seconds a streaming client may take no data before its request is cancelled",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    if not (args.api_key or args.allow_unauthenticated_public or is_loopback(args.host)):
        parser.error(
            f"--host {args.host} is reachable from other machines: give --api-key, or "
            "--allow-unauthenticated-public to serve it without one"
        )
    return args


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        return False


def main(argv: Sequence[str] | None = None) -> None:
    """Load the checkpoint and serve it until interrupted. The engine, the app and torch are
    imported once the arguments are parsed: `--help` and a wrong argument answer at once."""
    args = parse_args(argv)
    import uvicorn

    from core_engine.assets import shipped_checkpoint
    from core_engine.engine import load_engine
    from core_engine.network.app import create_app
    from core_engine.scheduler import EngineConfig

    given = {
        "max_batch_size": args.max_batch_size,
        "max_seq_len": args.max_seq_len,
        "kv_cache_bytes": args.kv_cache_bytes,
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    config = EngineConfig(
        kv_strategy=args.kv_strategy, **{k: v for k, v in given.items() if v is not None}
    )
    model = shipped_checkpoint(args.model)
    engine = load_engine(model, config, device=args.device, dtype=args.dtype)
    app = create_app(
        engine,
        args.served_model_name or args.model,
        limits=ServerLimits(stream_write_timeout_s=args.stream_write_timeout),
        api_key=args.api_key,
        loopback=is_loopback(args.host),
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
