"""Models named by a Hugging Face Hub id (``model = "Qwen/Qwen2.5-0.5B-Instruct"``), as users
type them. A worker downloads one once into the Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``;
``HF_ENDPOINT`` and ``HF_TOKEN`` as ``huggingface_hub`` reads them), only the files a checkpoint
needs (`CHECKPOINT_FILES`: safetensors weights, JSON configs, the tokenizer; never pickles or
code), the download's progress shown as the job's phase; later jobs use the cached copy. Before
anything is fetched, the sizes the Hub lists for those files must add up to at most
``RLWB_MAX_DOWNLOAD_BYTES`` (`max_download_bytes`), else the job fails naming both. A
submission only checks that it can be had: on a machine told to stay offline
(``HF_HUB_OFFLINE=1``) one not in the cache is refused, saying so. ``huggingface_hub`` is
imported when a Hub id is used."""

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core_engine.user_files import GIB, size_text
from workers.specs import SpecError

# A repository id as the Hub spells it: namespace/name, letters, digits, "-", "_", ".".
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}", re.ASCII)
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*"]
DEFAULT_MAX_DOWNLOAD_BYTES = 64 * GIB  # a 7B checkpoint in fp32 is ~30 GiB


def max_download_bytes() -> int:
    """The most a model download may take: ``RLWB_MAX_DOWNLOAD_BYTES``, default
    `DEFAULT_MAX_DOWNLOAD_BYTES`."""
    return int(os.environ.get("RLWB_MAX_DOWNLOAD_BYTES") or DEFAULT_MAX_DOWNLOAD_BYTES)


class HubModelUnavailable(SpecError):
    """A Hub model this machine cannot have: offline and not cached, or the download failed."""


def is_hub_id(model: str) -> bool:
    """Whether ``model`` names a Hub repository: ``namespace/name`` and no local path."""
    return (
        HUB_ID.fullmatch(model) is not None
        and "--" not in model
        and ".." not in model
        and not Path(model).exists()
    )


def cached_snapshot(model: str) -> Path | None:
    """The model's complete snapshot in the Hugging Face cache, None when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(model, allow_patterns=CHECKPOINT_FILES, local_files_only=True)
    except LocalEntryNotFoundError:
        return None
    return Path(folder)


def check_hub_model(model: str) -> Path | None:
    """At submission: the cached snapshot, None when the worker is to download it, or
    `HubModelUnavailable` when this machine may not download it (``HF_HUB_OFFLINE``)."""
    from huggingface_hub.constants import HF_HUB_CACHE, is_offline_mode

    cached = cached_snapshot(model)
    if cached is None and is_offline_mode():
        raise HubModelUnavailable(
            f"model: {model} is a Hugging Face Hub id and is not in this machine's Hugging "
            f"Face cache ({HF_HUB_CACHE}), and HF_HUB_OFFLINE is set, so nothing is "
            f"downloaded: download it where there is a network (`hf download {model}`, into "
            "the same cache), or let the worker download it: start it with HF_HUB_OFFLINE=0 "
            "(`make up` sets HF_HUB_OFFLINE=1: `make up HF_HUB_OFFLINE=0`)"
        )
    return cached


def download(model: str, phase: Callable[[str], None]) -> Path:
    """The model's snapshot in the Hugging Face cache, downloaded first if it is not there
    (once: a cached one is used as it is), ``phase`` told how far the download is
    (`HubModelUnavailable` if it cannot be had, or holds no safetensors checkpoint)."""
    folder = check_hub_model(model) or _fetch(model, phase)
    if not any(folder.glob("*.safetensors")) or not (folder / "config.json").is_file():
        raise HubModelUnavailable(
            f"model: {model} has no Hugging Face checkpoint in safetensors (config.json and "
            "*.safetensors), the only weights the workbench loads"
        )
    return folder


def _fetch(model: str, phase: Callable[[str], None]) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError

    what = f"downloading {model} from the Hugging Face Hub"
    phase(what)
    try:
        _check_listed_size(model)
        progress = _progress(what, phase)
        return Path(snapshot_download(model, allow_patterns=CHECKPOINT_FILES, tqdm_class=progress))
    except HubModelUnavailable:
        raise
    except RepositoryNotFoundError:
        raise HubModelUnavailable(
            f"model: {model}: no such model on the Hugging Face Hub (or it is private or "
            "gated: set HF_TOKEN to a token that may read it)"
        ) from None
    except (OSError, ValueError) as exc:
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HubModelUnavailable(f"model: {model} could not be downloaded: {cause}") from None


def _check_listed_size(model: str) -> None:
    """`HubModelUnavailable` when the files a checkpoint needs take more than
    `max_download_bytes`, by the sizes the Hub lists for them."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    files = [f for f in HfApi().list_repo_tree(model, recursive=True) if isinstance(f, RepoFile)]
    needed = filter_repo_objects(
        files,
        allow_patterns=CHECKPOINT_FILES,
        key=lambda f: f.path,
    )
    listed, limit = sum(f.size for f in needed), max_download_bytes()
    if listed > limit:
        raise HubModelUnavailable(
            f"model: {model}: its checkpoint files on the Hugging Face Hub take "
            f"{size_text(listed)}, over the {size_text(limit)} a download may take "
            "(RLWB_MAX_DOWNLOAD_BYTES)"
        )


class _Nowhere:
    """A stream for progress bars nobody sees."""

    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def _progress(what: str, phase: Callable[[str], None]) -> type:
    """A tqdm class whose byte counts go to ``phase`` as ``<what>: 12.3 MiB of 942.3 MiB``:
    `snapshot_download` counts the bytes of all files on two bars (received, written), from
    a thread per file, so the larger count and total so far, each new figure once, in order."""
    from tqdm import tqdm

    seen = {"done": 0, "total": 0, "text": ""}
    lock = threading.Lock()

    class Progress(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "file": _Nowhere(), "disable": False})

        def update(self, n: float | None = 1) -> bool | None:
            with lock:  # a bar's count too: threads share the two bars
                displayed = super().update(n)
                if self.unit == "B":
                    seen["done"] = max(seen["done"], int(self.n))
                    seen["total"] = max(seen["total"], int(self.total or 0))
                    text = f"{what}: {size_text(seen['done'])} of {size_text(seen['total'])}"
                    if seen["total"] and text != seen["text"]:
                        seen["text"] = text
                        phase(text)
            return displayed

    return Progress
