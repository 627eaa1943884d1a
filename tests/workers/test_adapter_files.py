"""A PEFT adapter a job names (issue 32, item 6): it is loaded on the base its config names, so
that base is checked as a model is (under the model roots), and its rank is bounded wherever
an adapter directory is loaded (a rank sizes the matrices the loader allocates)."""

import json
import shutil
from pathlib import Path

import pytest

from core_engine.engine import load_engine
from core_engine.lora_settings import MAX_RANK
from workers import api
from workers.specs import SpecError

EVALUATION = {"task": "always7", "num_prompts": 2}


def adapter(folder: Path, base: str | Path, rank: int = 4) -> str:
    """An adapter directory laid out as a LoRA job's version: the base's config.json beside
    the PEFT config."""
    folder.mkdir(parents=True)
    shutil.copy(Path(base) / "config.json", folder)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": rank,
        "lora_alpha": 8,
        "target_modules": ["q_proj"],
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return str(folder)


def test_an_adapters_base_outside_the_model_roots_or_a_huge_rank_is_refused(
    env, repo, tiny_model, tmp_path, monkeypatch
):
    roots = tmp_path / "models"
    inside = shutil.copytree(tiny_model, roots / "base")
    monkeypatch.setenv("RLWB_MODEL_ROOTS", str(roots))  # tiny_model itself is outside
    outside = adapter(roots / "outside", tiny_model)
    with pytest.raises(SpecError, match=r"the base of the adapter .*: .* not under a model root"):
        api.submit_job("evaluate", {**EVALUATION, "model": outside})
    chained = adapter(roots / "chained", adapter(roots / "adapter-base", inside))
    with pytest.raises(SpecError, match="is an adapter too"):
        api.submit_job("evaluate", {**EVALUATION, "model": chained})
    huge = adapter(roots / "huge", inside, rank=10**6)
    with pytest.raises(SpecError, match="a rank must be an integer from 1 to 1024, got 1000000"):
        api.submit_job("evaluate", {**EVALUATION, "model": huge})
    assert repo.list_jobs() == []

    api.submit_job("evaluate", {**EVALUATION, "model": adapter(roots / "fine", inside)})
    assert len(repo.list_jobs()) == 1


def test_loading_an_adapter_over_the_rank_bound_is_refused(tiny_model, tmp_path):
    """One over the bound (a huge one would allocate gigabytes where the bound is missing)."""
    over = adapter(tmp_path / "over", tiny_model, rank=MAX_RANK + 1)
    with pytest.raises(ValueError, match="a rank must be an integer from 1 to 1024, got 1025"):
        load_engine(over)
