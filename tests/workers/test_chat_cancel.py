"""A running Playground reply stops when the UI gives up on it (issue 24, item 1): the UI's
`workers.api.chat` revokes the task when its timeout passes, and the interactive worker (a
threads pool, which Celery cannot terminate) ends the generation at its next decode step, so
the next request is not held behind it. Judged by the revoked reply's own result (cut short,
cancelled), never by a clock (issue 32)."""

import re
from pathlib import Path

import pytest

from db import PolicyVersionRecord
from workers.chat import MAX_TOKENS_LIMIT

HELLO = [{"role": "user", "content": "hello"}]
EOS = 2  # the toy tokenizer's `</s>`, the checkpoint's only end-of-sequence id
# The timeout the long request is sent with: the worker must have started it by then (it is
# idle and warm: ~0.1 s here), and a full 1,024-token reply takes ~20 s here.
GIVE_UP_S = 3.0
RESULT_WAIT_S = 120  # a hang guard for the revoked task's result (it is there at once)


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


@pytest.mark.slow
@pytest.mark.parametrize("deployment", ["stack", "embedded_stack"])
def test_a_reply_the_ui_gave_up_on_stops_on_the_worker(request, deployment, slow_model):
    stack = request.getfixturevalue(deployment)
    job = _record_job(stack.repo, slow_model)
    short = f"api.chat({job}, 0, {HELLO!r}, 0.0, 4, 0)"
    long = f"api.chat({job}, 0, {HELLO!r}, 0.0, {MAX_TOKENS_LIMIT}, 0, timeout={GIVE_UP_S})"
    with stack.worker("chat0", "--interactive"):
        # warm the engine, give up on a 1024-token reply, then ask again at once
        warm, given_up, after = stack.api(f"[{short}, {long}, {short}]")
        _, revoked_id, _ = re.findall(r"workers\.chat\[([^]]+)\] received", stack.log("chat0"))
        revoked = stack.api(
            f"api.celery_app().AsyncResult({revoked_id!r}).get(timeout={RESULT_WAIT_S})"
        )
    assert len(warm["output_ids"]) == 4 and len(after["output_ids"]) == 4
    assert given_up == {"problem": f"stopped: the worker took longer than {GIVE_UP_S:g} s"}
    # the revoked reply stopped at a decode step after the revoke, far short of its 1,024
    # tokens (~100-150 here), so the next reply was not held behind the rest of it
    assert revoked["finish_reason"] == "abort" and revoked["error"]["code"] == "cancelled"
    assert 0 < len(revoked["output_ids"]) < MAX_TOKENS_LIMIT, len(revoked["output_ids"])


def test_a_request_no_worker_took_says_to_start_one(stack):
    reply = stack.api(f"api.chat(1, 0, {HELLO!r}, 0.0, 4, 0, timeout=1)")
    assert reply["problem"].startswith("no interactive worker answered within 1 s: start one")
