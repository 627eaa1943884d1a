"""`python -m core_engine.rl train CONFIG`: run a GRPO job without the UI."""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.trainer.grpo import GRPOTrainer, TrainingError
from core_engine.rl.trainer.records import StepRecord, TrainerHooks


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
    config = GRPOConfig.from_file(args.config)
    records = prompt_records(config.task, config.data, seed=config.seed)
    bar = tqdm(total=config.steps, desc="GRPO", unit="step")
    trainer: GRPOTrainer | None = None

    def on_step(record: StepRecord) -> None:
        bar.write(_line(record, trainer.version))
        if record.status == "accepted":
            bar.update(1)

    trainer = GRPOTrainer(config, records, TrainerHooks(on_step=on_step))
    bar.update(trainer.step_index)
    try:
        reason = trainer.train()
    except TrainingError as exc:
        print(f"training stopped: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    print(f"{reason.value}: version {trainer.version}, checkpoints in {config.output_dir}")
    return 0
