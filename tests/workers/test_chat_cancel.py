"""A running Playground reply stops when the UI gives up on it (issue 24, item 1): the UI's
`workers.api.chat` revokes the task when its timeout passes, and the interactive worker (a
threads pool, which Celery cannot terminate) ends the generation at its next decode step, so
the next request is not held behind it."""

import re
from pathlib import Path

import pytest

from db import PolicyVersionRecord
from workers.chat import MAX_TOKENS_LIMIT

HELLO = [{"role": "user", "content": "hello"}]
EOS = 2  # the toy tokenizer's `</s>`, the checkpoint's only end-of-sequence id
GIVE_UP_S = 1.5  # the timeout the long request is sent with


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama of tens of ms per decode step here whose greedy reply never ends by itself: its
    end-of-sequence logit is 0, below the largest of the others (a full reply: 1024 steps)."""
    from safetensors.torch import load_file, save_file

    from core_engine.toy import save_tiny_checkpoint

    path = save_tiny_checkpoint(
        tmp_path_factory.mktemp("slow") / "ckpt",
        arch="llama",
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=6,
        max_position_embeddings=2 * MAX_TOKENS_LIMIT,
    )
    weights = path / "model.safetensors"
    state = load_file(weights)
    state["lm_head.weight"][EOS] = 0
    save_file(state, weights, metadata={"format": "pt"})
    return path


def _record_job(repo, path: Path) -> int:
    """A finished job whose version 0 is the checkpoint at ``path``, with its checksum."""
    import torch

    from core_engine.model import load_model
    from core_engine.weights import canonical_weights, weights_checksum

    checksum = weights_checksum(canonical_weights(load_model(path, torch.float32, "cpu")))
    job = repo.create_job("train", {"model": str(path), "task": "addition", "steps": 1})
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0, None, str(path), checksum))
    repo.mark_succeeded(job.id)
    return job.id


@pytest.mark.parametrize("deployment", ["stack", "embedded_stack"])
def test_a_reply_the_ui_gave_up_on_stops_on_the_worker(request, deployment, slow_model):
    stack = request.getfixturevalue(deployment)
    job = _record_job(stack.repo, slow_model)
    short = f"api.chat({job}, 0, {HELLO!r}, 0.0, 4, 0)"
    long = f"api.chat({job}, 0, {HELLO!r}, 0.0, {MAX_TOKENS_LIMIT}, 0, timeout={GIVE_UP_S})"
    with stack.worker("chat0", "--interactive"):
        # warm the engine, give up on a 1024-token reply, then ask again at once
        warm, _, given_up, asked, after, answered = stack.api(
            f"(lambda now: [{short}, now(), {long}, now(), {short}, now()])"
            "(__import__('time').perf_counter)"
        )
    assert len(warm["output_ids"]) == 4 and len(after["output_ids"]) == 4
    assert given_up == {"problem": f"stopped: the worker took longer than {GIVE_UP_S:g} s"}
    # the next reply waited for one decode step of the revoked one, not for its 1024
    assert answered - asked < 6, answered - asked
    runtimes = [
        float(s)
        for s in re.findall(r"workers\.chat\[[^]]+\] succeeded in ([\d.]+)s", stack.log("chat0"))
    ]
    # in the order they ended: the warm-up, the revoked one (1,024 steps: ~15-30 s), the next
    assert len(runtimes) == 3 and runtimes[1] < GIVE_UP_S + 6, runtimes


def test_a_request_no_worker_took_says_to_start_one(stack):
    reply = stack.api(f"api.chat(1, 0, {HELLO!r}, 0.0, 4, 0, timeout=1)")
    assert reply["problem"].startswith("no interactive worker answered within 1 s: start one")
