"""`python -m core_engine.rl train CONFIG`: run a GRPO job without the UI.

A job with `devices = N` runs as N ranks: started here on one machine (this process is rank
0), or, across machines, by ``torchrun`` (one process per device on each node, e.g.
``torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500
-m core_engine.rl train job.toml`` with `devices = 16`): the ranks then join the group its
environment variables describe. Rank 0 prints and writes the checkpoints.

``model`` may name a shipped policy (``"demo"``, ``"calculator-demo"``, ``"r1-demo"``);
``output_dir`` is optional: by default the folder ``<job file name>-checkpoints`` beside the
job file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from core_engine.assets import shipped_checkpoint

if TYPE_CHECKING:  # the trainer's modules load torch: imported once the arguments are parsed
    from core_engine.rl.config import GRPOConfig
    from core_engine.rl.ranks import RankInfo
    from core_engine.rl.trainer.records import StepRecord


WORKER_KEYS_HINT = (
    "\nThe trainer alone reads GRPOConfig fields only: a data file's columns, system_prompt, "
    "the held-out and tracker keys belong to jobs the workers run (`rlwb train JOB_FILE`)."
)


def _line(record: StepRecord, version: int) -> str:
    m = record.metrics
    if record.status == "rejected":
        return f"step {record.step:4d} REJECTED: {'; '.join(record.reasons[:2])}"
    return (
        f"step {record.step:4d} -> v{version:<4d} "
        f"reward {m['reward_mean']:.3f}±{m['reward_std']:.3f} "
        f"loss {m['loss']:+.4f} kl {m['kl']:.4f} mismatch {m.get('mismatch_max', 0):.1e} "
        f"len {m['response_length']:.1f} gen {m['generate_s']:.2f}s train {m['train_s']:.2f}s "
        f"sync {m['sync_s'] * 1e3:.1f}ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core_engine.rl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run a GRPO training job from a JSON/TOML config")
    train.add_argument("config", help="path to a .json or .toml GRPOConfig file")
    args = parser.parse_args(argv)
    from tqdm import tqdm

    from core_engine.rl.config import GRPOConfig
    from core_engine.rl.data.tasks import prompt_records
    from core_engine.rl.ranks import RankSetupError
    from core_engine.rl.ranks.launch import RankFailedError
    from core_engine.rl.trainer.grpo import GRPOTrainer, TrainingError
    from core_engine.rl.trainer.records import TrainerHooks

    job_file = Path(args.config)
    default_output = job_file.with_name(f"{job_file.stem}-checkpoints")
    try:
        config = GRPOConfig.from_file(job_file, defaults={"output_dir": str(default_output)})
        config = replace(config, model=shipped_checkpoint(config.model))
        records = prompt_records(config.task, config.data, seed=config.seed)
    except (OSError, ValueError) as exc:  # the file, its fields, its prompts: said, not raised
        unknown = str(exc).startswith("unknown config keys")
        print(f"{job_file}: {exc}{WORKER_KEYS_HINT if unknown else ''}", file=sys.stderr)
        return 2
    bar = tqdm(total=config.steps, desc="GRPO", unit="step")
    trainer: GRPOTrainer | None = None

    def on_step(record: StepRecord) -> None:
        bar.write(_line(record, trainer.version))
        if record.status == "accepted":
            bar.update(1)

    try:
        with job_ranks_of(config, records) as ranks:
            hooks = TrainerHooks(on_step=on_step) if ranks is None or ranks.rank == 0 else None
            trainer = GRPOTrainer(config, records, hooks, ranks)
            bar.update(trainer.step_index)
            reason = trainer.train()
    except (TrainingError, RankFailedError, RankSetupError) as exc:
        print(f"training stopped: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    if trainer.writes_files:
        print(f"{reason.value}: version {trainer.version}, checkpoints in {config.output_dir}")
    return 0


@contextlib.contextmanager
def job_ranks_of(config: GRPOConfig, records: list[dict[str, str]]) -> Iterator[RankInfo | None]:
    """This process's rank: None for one device; under torchrun (``WORLD_SIZE`` set) the rank
    its environment names; else rank 0, the others started here (`ranks.launch.job_ranks`)."""
    from core_engine.rl.config import torch_device_type
    from core_engine.rl.ranks import RankSetupError, rank_group
    from core_engine.rl.ranks.group import collective_timeout
    from core_engine.rl.ranks.launch import job_ranks

    if "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if world != config.devices:
            raise RankSetupError(f"torchrun started {world} ranks for devices = {config.devices}")
        with rank_group(torch_device_type(config.device), collective_timeout(config)) as info:
            yield info
    elif config.devices == 1:
        yield None
    else:
        with job_ranks(config, records) as info:
            yield info
