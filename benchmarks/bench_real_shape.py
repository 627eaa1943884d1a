"""Two GRPO steps of a Qwen2.5-0.5B-shaped policy through the queue, on CPU, with its memory.

The checkpoint has Qwen2.5-0.5B's real configuration (151,936-token vocabulary, 24 layers,
hidden 896, GQA 14/2, tied embeddings; 494M parameters) with random weights, built locally. A
`rlwb worker` process (embedded broker, SQLite) runs a train job submitted through
`workers.api` exactly as the UI submits one; the worker's peak RSS (VmHWM) is read from /proc
when the job has finished. Target: within 8 GB (10^9 bytes). `--optimizer-state-dtype float32`
runs it with fp32 AdamW moments (16 bytes per parameter in all) instead of bfloat16 (12).

`--lora` trains a LoRA adapter instead (rank 16, alpha 32, all-linear; the LoRA default lr):
target within 3.0 GiB. `--compare` runs the full-weight job and the LoRA job alternately,
`--rounds` times each, one worker process per job, in one invocation (the machine's load is
printed with each job). Optimizer steps per minute: versions after the first divided by the
wall time between the first and the last version's records (rollout, train, weight sync,
checkpoint and the database write of every step; the model load and the first step are left
out). Held-out evaluation is off (`heldout_every = 0`): the job measures training.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_real_shape.py [--keep DIR]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_real_shape.py --compare --steps 4
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    vocab_size=151_936,
    initializer_range=0.02,
)
JOB = dict(
    task="addition",
    steps=2,
    batch_size=2,
    group_size=4,
    max_tokens=32,
    lr=1e-6,
    drop_zero_variance_groups=False,  # random weights: every group has reward 0
    logit_chunk_rows=64,
    max_tokens_per_micro_batch=512,
    gradient_checkpointing=True,  # activations of one layer at a time
    heldout_every=0,  # no held-out evaluation: the job measures training
)
LORA = {"rank": 16, "alpha": 32.0, "target_modules": "all-linear"}
TARGET_GB = 8.0
LORA_TARGET_GIB = 3.0


def build_checkpoint(path: Path) -> Path:
    from core_engine.toy import save_tiny_checkpoint

    if not (path / "config.json").is_file():
        save_tiny_checkpoint(path, arch="qwen2", alphabet="0123456789+=?", **QWEN25_05B)
    return path


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def run_job(root: Path, model: Path, job: dict) -> dict:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{root / 'rlwb.db'}",
        "RLWB_DATA_DIR": str(root / "data"),
        "RLWB_MODEL_ROOTS": str(model.parent),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("REDIS_URL", None)
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "RLWB_DATA_DIR", "RLWB_MODEL_ROOTS")})
    from db import Repository, upgrade
    from workers import api

    upgrade(env["DATABASE_URL"])
    repo = Repository.from_url(env["DATABASE_URL"])
    log = open(root / "worker.log", "w")  # noqa: SIM115  (closed below)
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers", "worker", "-n", "shape@%h"],
        env=env,
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        start = time.perf_counter()
        job = api.submit_job("train", {**job, "model": str(model)})
        while not repo.get_job(job.id).status.is_terminal:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited; see {root / 'worker.log'}")
            time.sleep(2)
        seconds = time.perf_counter() - start
        peak = peak_rss_bytes(worker.pid)
    finally:
        worker.terminate()
        worker.wait(60)
        log.close()
    final = repo.get_job(job.id)
    versions = repo.list_versions(job.id)
    return {
        "status": final.status.value,
        "error": final.error,
        "versions": [v.version for v in versions],
        "seconds": seconds,
        "peak_rss_bytes": peak,
        "steps_per_minute": steps_per_minute(versions),
        "load": load_average(),
    }


def steps_per_minute(versions: list) -> float | None:
    """Optimizer steps per minute between the first and the last trained version's records."""
    trained = [v for v in versions if v.version >= 1]
    if len(trained) < 2:
        return None
    seconds = (trained[-1].created_at - trained[0].created_at).total_seconds()
    return 60 * (len(trained) - 1) / seconds


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def job_config(lora: bool, optimizer_state_dtype: str, steps: int) -> dict:
    job = {**JOB, "steps": steps, "optimizer_state_dtype": optimizer_state_dtype}
    if lora:
        del job["lr"]  # the LoRA default (3e-3)
        job["lora"] = dict(LORA)
    return job


def report(name: str, result: dict) -> None:
    peak = result["peak_rss_bytes"]
    rate = result["steps_per_minute"]
    print(f"{name}: job {result['status']} {result['error'] or ''}".strip())
    print(
        f"  versions stored: {result['versions']}; {result['seconds']:.0f} s for the job;"
        f" load average after it: {result['load']}"
    )
    print(
        f"  worker peak RSS {peak / 2**30:.2f} GiB = {peak / 1e9:.2f} GB;"
        f" optimizer steps/min {'-' if rate is None else f'{rate:.2f}'}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument(
        "--optimizer-state-dtype",
        default="bfloat16",
        choices=["float32", "bfloat16"],
        help="AdamW's moments (fp32: 16 bytes per parameter in all, bf16: 12)",
    )
    parser.add_argument(
        "--lora", action="store_true", help="train a LoRA adapter (r=16, alpha=32, all-linear)"
    )
    parser.add_argument(
        "--compare", action="store_true", help="the full-weight and the LoRA job, alternately"
    )
    parser.add_argument("--rounds", type=int, default=1, help="jobs of each kind (--compare)")
    parser.add_argument("--steps", type=int, default=JOB["steps"], help="optimizer steps a job")
    args = parser.parse_args(argv)
    kinds = [False, True] * args.rounds if args.compare else [args.lora]
    results: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        model = build_checkpoint(root / "qwen2.5-0.5b-shape")
        for lora in kinds:
            name = "LoRA r=16" if lora else f"full, {args.optimizer_state_dtype} moments"
            print(f"{name}: starting (load average {load_average()})", flush=True)
            job = job_config(lora, args.optimizer_state_dtype, args.steps)
            results[lora].append(result := run_job(root, model, job))
            report(name, result)
    for lora, runs in results.items():
        if not runs:
            continue
        peak = max(r["peak_rss_bytes"] for r in runs)
        if lora:
            verdict = "met" if peak <= LORA_TARGET_GIB * 2**30 else "MISSED"
            target = f"target <= {LORA_TARGET_GIB} GiB: {verdict}"
            what = "LoRA r=16"
        else:
            verdict = "met" if peak <= TARGET_GB * 1e9 else "MISSED"
            target = f"target <= {TARGET_GB} GB: {verdict}"
            what = f"{args.optimizer_state_dtype} AdamW moments"
        rates = [r["steps_per_minute"] for r in runs if r["steps_per_minute"] is not None]
        rate = f"{sum(rates) / len(rates):.2f}" if rates else "-"
        print(
            f"worker peak RSS with {what}: {peak / 2**30:.2f} GiB = {peak / 1e9:.2f} GB"
            f" ({target}); optimizer steps/min (mean of {len(rates)}): {rate}"
        )


if __name__ == "__main__":
    main()
