"""The footprint rule over N devices: FSDP2 divides the full-weight trainer state by N and
gathers one decoder layer at a time; LoRA replicates its base; docs/sizing.md shows the table."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.footprint.estimate import (
    InsufficientMemoryError,
    check_footprint,
    meta_model,
    shard_parameters,
    training_footprint,
)
from core_engine.rl.footprint.table import (
    DEVICE_COUNTS,
    devices_rows,
    devices_table,
    markdown_table,
    shape_config,
    table_rows,
)
from core_engine.rl.ranks import RankInfo
from core_engine.rl.trainer import grpo, parts
from core_engine.toy import save_tiny_checkpoint, tiny_config

CUDA = torch.device("cuda")
JOB = dict(model="m", output_dir="o", task="addition", device="cuda")
SIZING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "sizing.md"
SEVEN_B = 7_615_616_512  # Qwen2.5-7B's published count
EIGHT_B = 8_030_261_248  # Llama-3.1-8B's published count


def layer_parameters_from_shape(name: str, biases: bool) -> int:
    """One decoder layer: attention (q, k, v with biases in Qwen2, o), gated MLP, two norms."""
    config = shape_config(name)
    hidden, inter = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    attention = 2 * hidden * hidden + 2 * hidden * kv + (hidden + 2 * kv if biases else 0)
    return attention + 3 * hidden * inter + 2 * hidden


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_fsdp2_divides_weights_gradients_moments_and_reference_by_n(devices):
    """Each rank loads its shard of the KL reference as of the policy (`ranks.state`)."""
    config = shape_config("Qwen2.5-7B")
    job = GRPOConfig(**JOB, kl_coef=0.1)
    one = training_footprint(job, config, CUDA)
    many = training_footprint(job, config, CUDA, devices)
    assert one.trainer_bytes == 16 * SEVEN_B and one.reference_bytes == 4 * SEVEN_B
    assert many.trainer_bytes * devices == one.trainer_bytes  # to the byte
    assert many.reference_bytes * devices == one.reference_bytes
    assert many.engine_copy_bytes == one.engine_copy_bytes == 2 * SEVEN_B  # each rank's engine
    assert many.parameters == SEVEN_B and many.devices == devices
    assert many.total_bytes == (16 + 4) * SEVEN_B // devices + 2 * SEVEN_B + many.gathered_bytes
    assert f"(1/{devices} shard)" in many.describe()
    assert f"per device over {devices}" in many.describe()


@pytest.mark.parametrize(("name", "biases"), [("Qwen2.5-7B", True), ("Llama-3.1-8B", False)])
def test_gathered_are_one_decoder_layer_and_the_roots_in_the_compute_dtype(name, biases):
    """FSDP2 gathers one decoder layer at a time, and keeps the root (embedding, final norm,
    untied LM head) gathered through the step: the policy's, and the KL reference's."""
    config, job = shape_config(name), GRPOConfig(**JOB)
    layer = layer_parameters_from_shape(name, biases)
    assert layer == (233_057_792 if biases else 218_112_000)
    root = 2 * config.vocab_size * config.hidden_size + config.hidden_size
    assert training_footprint(job, config, CUDA).gathered_bytes == 0  # one process: no FSDP2
    for devices in (2, 8):
        assert training_footprint(job, config, CUDA, devices).gathered_bytes == 2 * (layer + root)
    with_kl = GRPOConfig(**JOB, kl_coef=0.1)
    assert training_footprint(with_kl, config, CUDA, 2).gathered_bytes == 2 * (layer + 2 * root)
    cpu_job = GRPOConfig(**{**JOB, "device": "cpu"})
    cpu = training_footprint(cpu_job, config, torch.device("cpu"), 2)
    assert cpu.gathered_bytes == 4 * (layer + root)  # fp32 without mixed precision


def test_lora_replicates_its_base_and_adapter_on_every_device():
    config = shape_config("Llama-3.1-8B")
    job = GRPOConfig(**JOB, lora={"rank": 16})
    one = training_footprint(job, config, CUDA)
    assert one.base_bytes == 2 * EIGHT_B and one.adapter_parameters == 41_943_040
    for devices in (2, 4, 8):
        many = training_footprint(job, config, CUDA, devices)
        assert many.base_bytes == 2 * EIGHT_B  # not divided by N
        assert many.trainer_bytes == 16 * 41_943_040 and many.gathered_bytes == 0
        assert many.total_bytes == one.total_bytes


def test_replicated_full_weights_hold_the_whole_state_on_every_device():
    config = shape_config("Qwen2.5-7B")
    job = GRPOConfig(**JOB, kl_coef=0.1, sharding="replicate")
    one = training_footprint(job, config, CUDA)
    for devices in (2, 8):
        many = training_footprint(job, config, CUDA, devices)
        assert many.trainer_bytes == one.trainer_bytes == 16 * SEVEN_B  # not divided by N
        assert many.reference_bytes == 4 * SEVEN_B and many.gathered_bytes == 0
        assert many.total_bytes == one.total_bytes and "shard" not in many.describe()


def test_the_trainer_checks_the_room_each_of_its_ranks_needs(monkeypatch, tmp_path):
    """A sharded job on 8 devices is sized as its per-device share, not as one device's whole
    state (which would refuse every job FSDP2 exists for)."""
    checkpoint = str(save_tiny_checkpoint(tmp_path / "m", arch="llama"))
    checked: list[int] = []

    def refuse(config, device, devices=1):
        checked.append(devices)
        raise InsufficientMemoryError("stop here")

    monkeypatch.setattr(parts, "check_room_for", refuse)
    job = GRPOConfig(model=checkpoint, output_dir=str(tmp_path / "o"), task="always7", devices=8)
    info = RankInfo(rank=0, world_size=8, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(InsufficientMemoryError, match="stop here"):
        grpo.GRPOTrainer(job, prompt_records(job.task, None, seed=0), ranks=info)
    assert checked == [8]


def test_shards_match_fsdp2_on_a_fake_group_padding_included():
    """`fully_shard` per layer then the root, as the trainer shards; rank 0 holds the
    largest (padded) shard: 1001 vocabulary rows over 4 ranks are 251 rows each."""
    config = tiny_config("qwen2", vocab_size=1001)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        model = meta_model(config)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        local = sum(p.to_local().numel() for p in model.parameters())
    finally:
        dist.destroy_process_group()
    assert local == shard_parameters(meta_model(config), 4)
    assert model.model.embed_tokens.weight.to_local().shape[0] == 251


def test_a_job_refused_on_one_device_fits_on_eight():
    config, job = shape_config("Qwen2.5-7B"), GRPOConfig(**JOB)
    card = 80 * 2**30
    with pytest.raises(InsufficientMemoryError, match="GiB fp32 weights"):
        check_footprint(training_footprint(job, config, CUDA), card, CUDA)
    check_footprint(training_footprint(job, config, CUDA, 8), card, CUDA)
    with pytest.raises(ValueError, match="devices must be at least 1"):
        training_footprint(job, config, CUDA, 0)


def test_the_sizing_page_shows_both_tables_as_the_module_prints_them():
    rows = devices_rows()
    assert [row.devices for row in rows] == list(DEVICE_COUNTS) == [1, 2, 4, 8]
    table = devices_table(rows)
    assert table.count("\n") == 1 + len(DEVICE_COUNTS)
    assert "| 1 | 127.7 GiB (113.5 + 14.2 + 0.00) | 14.8 GiB |" in table
    page = SIZING_PAGE.read_text()
    assert markdown_table(table_rows()) in page
    assert table in page
