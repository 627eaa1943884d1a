"""Token texts for the token view, from a checkpoint's ``tokenizer.json`` (no torch)."""

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from workers.api import MAX_TEXT_BYTES, UnsafeFileError, regular_file

CONTEXT = 6  # tokens decoded before each one, so multi-token characters and spaces come out right


@lru_cache(maxsize=8)
def _load(path: str, _mtime_ns: int) -> Tokenizer:
    return Tokenizer.from_file(path)


def _tokenizer_file(checkpoint: Path) -> tuple[str, int] | None:
    """(path, modification time) of the checkpoint's ``tokenizer.json`` when it is a regular
    file of at most `MAX_TEXT_BYTES` (checked without opening it), else None."""
    path = checkpoint / "tokenizer.json"
    try:
        return str(path), regular_file(path, MAX_TEXT_BYTES).st_mtime_ns
    except UnsafeFileError:
        return None


def token_texts(token_ids: list[int], checkpoints: Iterable[Path]) -> list[str] | None:
    """The text each token adds to the response (special tokens included), decoded by the
    first of ``checkpoints`` that has a usable ``tokenizer.json``; None when none has one."""
    found = next(filter(None, map(_tokenizer_file, checkpoints)), None)
    if found is None:
        return None
    tokenizer = _load(*found)
    texts = []
    for i, token_id in enumerate(token_ids):
        context = token_ids[max(0, i - CONTEXT) : i]
        before = tokenizer.decode(context, skip_special_tokens=False)
        after = tokenizer.decode([*context, token_id], skip_special_tokens=False)
        if after.startswith(before):
            texts.append(after[len(before) :])
        else:
            texts.append(tokenizer.id_to_token(token_id) or "")
    return texts
