"""Whether two checkpoints share a tokenizer: the same tokenizer files byte for byte, else the
same vocabulary (every token with the same id, added tokens included). Versions of two jobs
are compared only then: their token ids, side-by-side answers and token diff mean the same
thing on both sides. No torch: the UI asks this too."""

import hashlib
from pathlib import Path

from core_engine.lora_settings import ADAPTER_CONFIG, read_adapter_config
from core_engine.user_files import MAX_TEXT_BYTES, UnsafeFileError, open_regular

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
EXAMPLES = 3  # tokens named in a refusal


def tokenizer_folder(checkpoint: str | Path) -> Path:
    """Where a checkpoint's tokenizer is: the checkpoint, or an adapter's base."""
    folder = Path(checkpoint)
    if (folder / ADAPTER_CONFIG).is_file():
        return Path(read_adapter_config(folder)["base_model_name_or_path"])
    return folder


def _read(path: Path) -> bytes | None:
    """A tokenizer file's bytes (bounded, regular files only); None when it is absent."""
    if not path.exists():
        return None
    with open_regular(path, MAX_TEXT_BYTES) as file:
        return file.read()


def tokenizer_checksum(folder: Path) -> str | None:
    """SHA-256 over the names and bytes of the tokenizer files present; None if none is."""
    digest, found = hashlib.sha256(), False
    for name in TOKENIZER_FILES:
        data = _read(folder / name)
        if data is not None:
            found = True
            digest.update(f"{name}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest() if found else None


def vocabulary(folder: Path) -> dict[str, int] | None:
    """token -> id of ``tokenizer.json`` (added tokens included); None without one."""
    from tokenizers import Tokenizer

    data = _read(folder / "tokenizer.json")
    if data is None:
        return None
    return Tokenizer.from_str(data.decode()).get_vocab(with_added_tokens=True)


def tokenizer_problem(checkpoint_a: str | Path, checkpoint_b: str | Path) -> str | None:
    """Why the two checkpoints do not share a tokenizer, in words (None: they do)."""
    try:
        folders = [tokenizer_folder(checkpoint_a), tokenizer_folder(checkpoint_b)]
        checksums = [tokenizer_checksum(folder) for folder in folders]
        for folder, checksum in zip(folders, checksums, strict=True):
            if checksum is None:
                return f"{folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)})"
        if checksums[0] == checksums[1]:
            return None
        vocabularies = [vocabulary(folder) for folder in folders]
    except (UnsafeFileError, ValueError, OSError) as exc:
        return f"the tokenizers cannot be read: {exc}"
    if None in vocabularies:
        return "their tokenizer files differ and one has no tokenizer.json to compare vocabularies"
    a, b = vocabularies
    if a == b:
        return None
    if len(a) != len(b):
        return f"different tokenizers: vocabularies of {len(a)} and {len(b)} tokens"
    moved = sorted((token for token, index in a.items() if b.get(token) != index), key=a.get)
    shown = ", ".join(f"{token!r}: {a[token]} vs {b.get(token)}" for token in moved[:EXAMPLES])
    return f"different tokenizers: {len(moved)} of {len(a)} tokens differ ({shown})"
