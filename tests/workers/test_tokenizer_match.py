"""Whether two checkpoints share a tokenizer (comparing versions of two jobs): the same files,
or the same vocabulary; refused with the reason otherwise."""

import json

from core_engine.toy import char_tokenizer
from workers.tokenizer_match import tokenizer_problem


def _checkpoint(path, alphabet="0123456789+=?"):
    char_tokenizer(alphabet).save_pretrained(path)
    return path


def test_the_same_tokenizer_files_are_shared(tmp_path):
    a, b = _checkpoint(tmp_path / "a"), _checkpoint(tmp_path / "b")
    assert tokenizer_problem(a, b) is None


def test_other_files_with_the_same_vocabulary_are_shared(tmp_path):
    a, b = _checkpoint(tmp_path / "a"), _checkpoint(tmp_path / "b")
    config = json.loads((b / "tokenizer_config.json").read_text())
    (b / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 7}))
    assert tokenizer_problem(a, b) is None


def test_another_vocabulary_is_refused_with_the_difference(tmp_path):
    a = _checkpoint(tmp_path / "a", "0123456789")
    reordered = _checkpoint(tmp_path / "b", "9876543210")
    problem = tokenizer_problem(a, reordered)
    assert problem.startswith("different tokenizers: 10 of ")
    assert "('0': 7 vs 16, '1': 8 vs 15, '2': 9 vs 14)" in problem  # the first ids that moved
    larger = _checkpoint(tmp_path / "c", "0123456789abc")
    assert "vocabularies of" in tokenizer_problem(a, larger)


def test_a_checkpoint_without_tokenizer_files_is_refused(tmp_path):
    a = _checkpoint(tmp_path / "a")
    (tmp_path / "bare").mkdir()
    assert "has no tokenizer files" in tokenizer_problem(a, tmp_path / "bare")


def test_an_adapter_is_read_through_its_base(tmp_path):
    base = _checkpoint(tmp_path / "base")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = {"base_model_name_or_path": str(base), "r": 4, "peft_type": "LORA"}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert tokenizer_problem(adapter, _checkpoint(tmp_path / "other")) is None
    wrong = _checkpoint(tmp_path / "wrong", "abc")
    assert "different tokenizers" in tokenizer_problem(adapter, wrong)
