"""Trainer exactness: resumes that continue bit for bit, no non-finite step ever published,
gradients equal to Hugging Face's (the padding row included)."""

import pytest
import torch

from core_engine.rl.objective import update as update_module
from core_engine.rl.objective.logprobs import packed_response_logprobs
from core_engine.rl.objective.loss import policy_loss
from core_engine.rl.trainer.checkpoint import latest_checkpoint, read_trainer_state
from core_engine.rl.trainer.grpo import TrainingError
from core_engine.rl.trainer.records import StopReason, TrainerHooks
from core_engine.weights import canonical_weights, weights_checksum

from .reference import assert_gradients_equal, make_pair
from .test_rl_trainer import make_trainer


def run(checkpoint, root, steps, stop_at=None, **overrides):
    """Train to `steps` (stopping warm at version `stop_at`); returns (trainer, prompts per
    accepted step, stop reason)."""
    trained = []
    holder = {}

    def on_step(record):
        if record.version is not None:
            trained.append(tuple(record.rollout.prompts))

    def should_stop():
        # asked while the trainer loads too (the prompts' render): not to stop there
        return stop_at is not None and "t" in holder and holder["t"].version >= stop_at

    hooks = TrainerHooks(on_step=on_step, should_stop=should_stop)
    trainer = holder["t"] = make_trainer(checkpoint, root, hooks, steps=steps, **overrides)
    return trainer, trained, trainer.train()


def weights_of(trainer):
    return weights_checksum(canonical_weights(trainer.model))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"updates_per_batch": 2, "max_policy_lag": 1},  # the 2nd update reuses the rollout
        {"updates_per_batch": 2},  # lag 0: the 2nd update regenerates on-policy
    ],
    ids=["one-update", "reuse", "regenerate"],
)
def test_a_warm_stop_and_resume_equals_an_uninterrupted_run(checkpoint, tmp_path, overrides):
    straight, straight_prompts, reason = run(checkpoint, tmp_path / "a", 6, **overrides)
    assert reason is StopReason.DONE and straight.version == 6
    # Version 3 is reached between the two updates of the second batch when updates_per_batch=2.
    first, first_prompts, reason = run(checkpoint, tmp_path / "b", 6, stop_at=3, **overrides)
    assert reason is StopReason.STOPPED and first.version == 3
    state = read_trainer_state(latest_checkpoint(tmp_path / "b" / "run"))
    assert state["batches_drawn"] == (3 if not overrides else 2)
    resumed, resumed_prompts, reason = run(checkpoint, tmp_path / "b", 6, **overrides)
    assert reason is StopReason.DONE and resumed.version == 6
    assert first_prompts + resumed_prompts == straight_prompts
    assert weights_of(resumed) == weights_of(straight)


def test_the_steps_limit_inside_a_batch_resumes_inside_it(checkpoint, tmp_path):
    overrides = {"updates_per_batch": 2, "max_policy_lag": 1}
    straight, straight_prompts, _ = run(checkpoint, tmp_path / "a", 4, **overrides)
    _, first_prompts, _ = run(checkpoint, tmp_path / "b", 3, **overrides)
    resumed, resumed_prompts, _ = run(checkpoint, tmp_path / "b", 4, **overrides)
    order = first_prompts + resumed_prompts
    assert order == straight_prompts
    assert order[0] == order[1] and order[2] == order[3] and order[1] != order[2]
    assert weights_of(resumed) == weights_of(straight)


def test_a_non_finite_step_is_rejected_and_nothing_advances(checkpoint, tmp_path, monkeypatch):
    records = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        TrainerHooks(on_step=records.append),
        max_consecutive_rejections=1,
        drop_zero_variance_groups=False,  # every batch reaches the loss
    )
    before = weights_of(trainer)
    real = update_module.packed_response_scores

    def poisoned(*args, **kwargs):
        rows, entropies = real(*args, **kwargs)
        return [rows[0] * float("nan"), *rows[1:]], entropies

    monkeypatch.setattr(update_module, "packed_response_scores", poisoned)
    record = trainer.step()
    assert record.status == "rejected" and "non_finite" in record.reasons[-1]
    assert trainer.version == trainer.engine.version == 0 and trainer.step_index == 0
    assert weights_of(trainer) == before and not trainer.optimizer.state
    assert all(p.grad is None for p in trainer.model.parameters())
    assert latest_checkpoint(trainer.output_dir) is None  # nothing was saved
    with pytest.raises(TrainingError, match="2 consecutive rejected batches"):
        trainer.step()
    assert latest_checkpoint(trainer.output_dir) is None and trainer.version == 0


def test_masked_positions_cannot_make_the_loss_nan():
    logp = torch.tensor([[-0.5, 1e4]], requires_grad=True)
    behaviour = torch.tensor([[-0.7, -1e4]])
    mask = torch.tensor([[True, False]])
    out = policy_loss(
        logp, behaviour, behaviour, torch.tensor([1.0]), mask, kl_coef=0.1, ref_logp=-logp
    )
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1] == 0


def test_clip_fraction_counts_active_clips_and_the_other_statistic_is_named_apart():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    behaviour = torch.log(torch.tensor([[0.25, 1.0, 0.5]]))  # ratios 2, 0.5, 1
    mask = torch.ones(1, 3, dtype=torch.bool)
    positive = policy_loss(logp, behaviour, behaviour, torch.tensor([1.0]), mask)
    # A > 0: only the high ratio is clipped; the low one is outside the range, not clipped.
    assert positive.clip_fraction == pytest.approx(1 / 3)
    assert positive.ratio_outside_fraction == pytest.approx(2 / 3)
    negative = policy_loss(logp, behaviour, behaviour, torch.tensor([-1.0]), mask)
    assert negative.clip_fraction == pytest.approx(1 / 3)


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen2", True)])
def test_gradients_equal_hugging_face_with_pad_inside_the_response(arch, tied):
    ours, hf = make_pair(arch, seed=3, pad_token_id=0, tie_word_embeddings=tied)
    ours.train()
    prompt, response = [4, 13, 17], [0, 0, 9]
    packed_response_logprobs(ours, [prompt], [response], 1.0)[0].sum().backward()
    logits = hf(torch.tensor([prompt + response])).logits[0].float()
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    logp.gather(-1, torch.tensor(response)[:, None]).sum().backward()
    assert_gradients_equal({n: p.grad for n, p in ours.named_parameters()}, hf)
    if not tied:  # the padding row is never trained through the embedding
        assert ours.model.embed_tokens.weight.grad[0].abs().max() == 0
    assert hf.model.embed_tokens.padding_idx == ours.model.embed_tokens.padding_idx == 0
