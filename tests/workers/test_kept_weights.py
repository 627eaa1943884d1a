"""A version's weights are kept only while its checkpoint directory holds its weights file (full
weights or a LoRA adapter): a directory left without it (retention, a save that wrote only the
trainer state) is no version to audit, chat with or export."""

from datetime import UTC, datetime
from pathlib import Path

from db import PolicyMetrics, PolicyVersionInfo
from workers.kept_weights import weights_kept


def version(checkpoint: Path | None) -> PolicyVersionInfo:
    return PolicyVersionInfo(
        job_id=1,
        version=3,
        parent_version=2,
        checkpoint_path=None if checkpoint is None else str(checkpoint),
        weights_checksum=None,
        metrics=PolicyMetrics(),
        created_at=datetime.now(UTC),
    )


def test_weights_are_kept_only_where_the_weights_file_is(tmp_path):
    full, adapter = tmp_path / "version-00003", tmp_path / "adapter-00003"
    for directory in (full, adapter):
        directory.mkdir()
        (directory / "config.json").write_text("{}")
        (directory / "trainer_state.json").write_text('{"version": 3}')
    assert not weights_kept(version(full))  # the directory, its weights gone
    assert not weights_kept(version(adapter))
    (full / "model.safetensors").write_bytes(b"weights")
    (adapter / "adapter_model.safetensors").write_bytes(b"adapter")
    assert weights_kept(version(full))
    assert weights_kept(version(adapter))
    assert not weights_kept(version(tmp_path / "version-00009"))  # deleted whole
    assert not weights_kept(version(None))
