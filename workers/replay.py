"""An independent replay of a response whose tokens several policy versions sampled (a weight
update landed between two decode steps, in flight): Hugging Face `transformers` models of each
version's kept checkpoint, one `DynamicCache` carried from one version's forward to the next.

The engine predicts response token j from a forward that feeds the whole prompt (j = 0) or
position P + j - 1 (the previous token), with the weights of the version that sampled token j,
writing the K/V of what it feeds and reusing the cached K/V of every earlier position as it
was computed. So a run of version u over tokens a..b-1 feeds positions P + a - 1 .. P + b - 2
(0 .. P + b - 2 when a = 0) under u, and the replay does exactly that, run after run. A
request preempted and resumed at response token r had the K/V of every earlier position
recomputed then, by the version that samples token r: the replay starts a fresh cache there and
feeds positions 0 .. P + r - 1 under that version (`Segment.recomputed`).
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Segment:
    """Response tokens ``first`` .. ``last`` (inclusive), sampled by ``version``; with
    ``recomputed``, the request resumed at ``first`` after a preemption."""

    version: int
    first: int
    last: int
    recomputed: bool = False


def segments(runs: Sequence[Sequence[int]], resumed_at: Sequence[int] = ()) -> list[Segment]:
    """``[[version, count], ...]`` -> the segments they cover, in order, also split where the
    request resumed after a preemption (``resumed_at``)."""
    found, first = [], 0
    for version, count in runs:
        bounds = [first, *(r for r in resumed_at if first < r < first + count), first + count]
        for start, stop in pairwise(bounds):
            found.append(Segment(version, start, stop - 1, start in resumed_at))
        first += count
    return found


def load_reference(checkpoint: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The `transformers` model of a kept checkpoint: a full one, or a PEFT adapter directory
    (`core_engine.rl.trainer.checkpoint`) on its base, its LoRA layers injected as the
    engine's are."""
    from transformers import AutoModelForCausalLM

    from core_engine.adapters import adapter_base, add_saved_adapter, is_adapter_dir, read_adapter

    adapter = is_adapter_dir(checkpoint)
    source = adapter_base(checkpoint) if adapter else checkpoint
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True)
    if adapter:
        add_saved_adapter(model, checkpoint)
        read_adapter(model, checkpoint)
    return model.to(device).eval()


def tokenizer_of(checkpoint: str) -> Any:
    """The tokenizer a checkpoint is served with (an adapter's: its base's)."""
    from transformers import AutoTokenizer

    from core_engine.adapters import adapter_base, is_adapter_dir

    source = adapter_base(checkpoint) if is_adapter_dir(checkpoint) else checkpoint
    return AutoTokenizer.from_pretrained(source, local_files_only=True)


def replay_logprobs(
    prompt: Sequence[int],
    response: Sequence[int],
    parts: Sequence[Segment],
    model_of: Callable[[int], nn.Module],
    temperature: float,
) -> Iterator[list[float]]:
    """Each segment's log-softmax(logits / T) of its tokens, in order, under
    ``model_of(segment.version)`` with the K/V schedule of the module docstring. An exception
    of ``model_of`` ends the replay: no later segment can be scored without that K/V."""
    from transformers import DynamicCache

    cache = DynamicCache()
    sequence = [*prompt, *response]
    for part in parts:
        model = model_of(part.version)
        device = next(model.parameters()).device
        if part.recomputed:  # every earlier position's K/V recomputed by this version
            cache = DynamicCache()
        start = 0 if part.first == 0 or part.recomputed else len(prompt) + part.first - 1
        stop = len(prompt) + part.last  # exclusive: the last fed position predicts ``last``
        fed = torch.tensor([sequence[start:stop]], device=device)
        positions = torch.arange(start, stop, device=device)[None]
        with torch.no_grad():
            logits = model(
                input_ids=fed, position_ids=positions, past_key_values=cache, use_cache=True
            ).logits[0, -(part.last - part.first + 1) :]
        targets = torch.tensor(response[part.first : part.last + 1], device=device)
        picked = (logits.float() / temperature).log_softmax(-1).gather(1, targets[:, None])
        yield [float(v) for v in picked.squeeze(1).cpu()]
