"""Real-size rules of the trainer: micro-batches that change nothing but memory, a vocabulary
row cap in the forward and the backward, retention, dtypes, one engine factory."""

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core_engine.cache.sizing import EngineSizingError
from core_engine.engine import DeviceError, load_engine, resolve_device
from core_engine.rl.config import GRPOConfig
from core_engine.rl.objective.logprobs import packed_response_logprobs
from core_engine.rl.objective.update import (
    TrainSample,
    UpdateSettings,
    accumulate_gradients,
    pack_micro_batches,
)
from core_engine.rl.trainer.checkpoint import OPTIMIZER_FILE
from core_engine.task import SamplingParams
from core_engine.toy import save_tiny_checkpoint

from .reference import assert_gradients_equal, hf_logprobs, make_pair
from .test_rl_trainer import make_trainer

VOCAB = 4096


@pytest.fixture(scope="module")
def pair():
    return make_pair("qwen2", seed=5, vocab_size=VOCAB, tie_word_embeddings=False)


def samples(count=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        prompt = torch.randint(3, VOCAB, (3 + i % 4,), generator=gen).tolist()
        response = torch.randint(0, VOCAB, (2 + (i * 5) % 7,), generator=gen).tolist()
        behaviour = (-torch.rand(len(response), generator=gen) * 9).tolist()
        out.append(TrainSample(prompt, response, behaviour, float(i % 3 - 1) + 0.25 * i))
    return out


def settings(**overrides):
    values = dict(temperature=0.8, clip_eps=0.2, kl_coef=0.05, max_tokens=4096, chunk_rows=4096)
    return UpdateSettings(**{**values, **overrides})


def gradients(model, batch, reference=None, **overrides):
    model.zero_grad(set_to_none=True)
    result = accumulate_gradients(model, batch, settings(**overrides), reference)
    return result, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_packed_logprobs_equal_hugging_face_teacher_forcing(pair):
    ours, hf = pair
    batch = samples()
    with torch.no_grad():
        rows = packed_response_logprobs(
            ours, [s.prompt for s in batch], [s.response for s in batch], 0.7, chunk_rows=5
        )
    for sample, row in zip(batch, rows, strict=True):
        expected = hf_logprobs(hf, sample.prompt, sample.response, 0.7)
        assert torch.allclose(row, expected, atol=1e-5)


@pytest.mark.parametrize(
    "split", [{"max_tokens": 20}, {"chunk_rows": 3}, {"max_tokens": 13, "chunk_rows": 1}]
)
def test_micro_batches_and_chunks_give_the_same_loss_and_gradients(pair, split):
    ours, _ = pair
    reference = make_pair("qwen2", seed=6, vocab_size=VOCAB, tie_word_embeddings=False)[0]
    batch = samples()
    whole, whole_grads = gradients(ours, batch, reference)
    parts, part_grads = gradients(ours, batch, reference, **split)
    assert whole.micro_batches == 1
    if "max_tokens" in split:
        assert parts.micro_batches > 2
    assert parts.loss == pytest.approx(whole.loss, rel=1e-6, abs=1e-6)
    assert parts.kl == pytest.approx(whole.kl, rel=1e-5)  # a sum of ~76 in another fp32 order
    assert parts.clip_fraction == pytest.approx(whole.clip_fraction)
    for name, grad in whole_grads.items():
        # fp32 summation order differs: equal to 1e-5 of the tensor's largest entry.
        assert (part_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max() + 1e-7, name


class LargestVocabTensor(TorchDispatchMode):
    """Rows of the largest tensor computed with the vocabulary as its last dimension (views
    and the LM head's own [vocab, hidden] weight and gradient aside)."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel() // self.vocab)
        return out


def test_no_more_than_chunk_rows_of_the_vocabulary_exist_in_forward_or_backward(pair):
    ours, _ = pair
    batch = samples(12)
    tokens = sum(len(s.response) for s in batch)
    with LargestVocabTensor(VOCAB) as probe:
        gradients(ours, batch, chunk_rows=4)
    assert tokens > 40 and probe.largest == 4


def test_a_sample_over_the_token_budget_is_refused_with_numbers():
    assert pack_micro_batches([3, 4, 5, 2], 7) == [[0, 1], [2, 3]]
    with pytest.raises(
        ValueError, match="sample 1 has 9 tokens, over max_tokens_per_micro_batch=8"
    ):
        pack_micro_batches([3, 9], 8)
    with pytest.raises(ValueError, match="cannot hold one sample"):
        GRPOConfig(
            model="m", output_dir="o", task="addition", max_tokens=64, max_tokens_per_micro_batch=64
        )


def test_the_job_start_refuses_a_budget_below_the_longest_sample(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="cannot hold the longest sample"):
        make_trainer(checkpoint, tmp_path, max_tokens=3, max_tokens_per_micro_batch=8)


def test_unknown_dtype_and_device_are_refused_before_running(tmp_path):
    with pytest.raises(ValueError, match="engine_dtype must be one of"):
        GRPOConfig(model="m", output_dir="o", task="addition", engine_dtype="int8")
    with pytest.raises(ValueError, match="device must be"):
        GRPOConfig(model="m", output_dir="o", task="addition", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="does not exist here"):
            resolve_device("cuda:0")


def test_retention_keeps_the_last_and_every_nth_and_optimizer_state_only_for_the_newest(
    checkpoint, tmp_path
):
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        steps=7,
        checkpoint_every=1,
        keep_last=2,
        keep_every=3,
        drop_zero_variance_groups=False,
    )
    trainer.train()
    root = tmp_path / "run"
    kept = sorted(int(p.name.split("-")[1]) for p in root.glob("version-*"))
    assert kept == [3, 6, 7]
    assert [v for v in kept if (root / f"version-{v:05d}" / OPTIMIZER_FILE).exists()] == [7]
    resumed = make_trainer(checkpoint, tmp_path, steps=8, drop_zero_variance_groups=False)
    assert resumed.version == 7 and resumed.optimizer.state


def test_an_in_flight_run_keeps_the_versions_its_kept_samples_span(checkpoint, tmp_path):
    """A sample stamped with a kept version may hold tokens of the next `max_policy_lag`
    versions (an update landed mid-sample): with full weights its audit said "weights not
    kept" unless those were kept too (issue 32)."""
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        steps=7,
        checkpoint_every=1,
        pipeline="in_flight",
        max_policy_lag=1,
        keep_last=1,
        keep_every=3,
        drop_zero_variance_groups=False,
    )
    trainer.train()
    kept = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "run").glob("version-*"))
    assert kept == [1, 3, 4, 6, 7]  # version 0, the model itself, is kept: so is 1


def test_engine_shares_the_trainers_weights_when_the_dtypes_match(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path)
    assert trainer.engine.model is trainer.model
    assert not trainer.update_settings.importance.correct_on_policy


def test_bf16_engine_with_fp32_trainer_records_mismatch_and_truncated_is(checkpoint, tmp_path):
    records = []
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        engine_dtype="bfloat16",
        drop_zero_variance_groups=False,
        steps=2,
    )
    trainer.hooks.on_step = records.append
    trainer.train()
    assert trainer.engine.model.lm_head.weight.dtype == torch.bfloat16
    assert trainer.model.lm_head.weight.dtype == torch.float32
    assert trainer.update_settings.importance.correct_on_policy
    assert trainer.update_settings.importance.cap == 2.0
    accepted = [r for r in records if r.version is not None]
    assert trainer.version == 2 and accepted
    for record in accepted:
        m = record.metrics
        assert 0 < m["mismatch_max"] < 0.5  # bf16 rounding, not a different policy
        assert 0.5 < m["tis_weight_mean"] < 1.5 and 0 <= m["tis_truncated_fraction"] <= 1
    # The engine serves the bf16 image of the trainer's fp32 weights.
    for name, served in trainer.engine.model.state_dict().items():
        assert torch.equal(served, trainer.model.state_dict()[name].to(served.dtype)), name
    off = make_trainer(
        checkpoint, tmp_path / "off", engine_dtype="bfloat16", correct_on_policy=False
    )
    assert not off.update_settings.importance.correct_on_policy


def test_one_end_of_sequence_rule_with_two_eos_ids(tmp_path):
    path = save_tiny_checkpoint(tmp_path / "m", alphabet="abc")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    engine = load_engine(path)
    assert set(engine.eos_token_ids) == {2, 7}
    config = GRPOConfig(model=str(path), output_dir=str(tmp_path / "o"), task="always7")
    from core_engine.rl.data.tasks import prompt_records
    from core_engine.rl.trainer.grpo import GRPOTrainer

    trainer = GRPOTrainer(config, prompt_records("always7", None, count=8))
    assert trainer.engine.eos_token_ids == engine.eos_token_ids


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_training_on_cuda_with_a_bf16_engine(checkpoint, tmp_path):
    """The GPU path end to end: trainer (fp32 master weights, bf16 autocast) and a bf16 engine
    on the device, truncated IS on, versions acknowledged."""
    records = []
    trainer = make_trainer(
        checkpoint, tmp_path, device="cuda", steps=3, drop_zero_variance_groups=False
    )
    trainer.hooks.on_step = records.append
    trainer.train()
    assert trainer.model.lm_head.weight.device.type == "cuda"
    assert trainer.engine.model.lm_head.weight.dtype == torch.bfloat16
    assert trainer.update_settings.autocast == torch.bfloat16
    assert trainer.version == trainer.engine.version == 3
    for record in (r for r in records if r.version is not None):
        assert record.metrics["mismatch_max"] < 0.5 and "tis_weight_mean" in record.metrics


def test_the_kv_pool_sleeps_while_the_trainer_computes(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, drop_zero_variance_groups=False)
    engine, seen = trainer.engine, []
    real = trainer._backward

    def spying(samples):
        seen.append(engine.pool.buffer.released)
        return real(samples)

    trainer._backward = spying
    prompts = [[3, 4, 5, 6]]
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    trainer.step()
    before = engine.run_batch(prompts, greedy)[0].output_ids
    with engine.kv_released():
        assert engine.pool.buffer.k.untyped_storage().nbytes() == 0
    assert seen == [True] and not engine.pool.buffer.released
    assert engine.run_batch(prompts, greedy)[0].output_ids == before  # serves as before


def test_a_kv_budget_that_cannot_hold_one_request_fails_at_job_start(checkpoint, tmp_path):
    with pytest.raises(EngineSizingError, match="bytes"):
        make_trainer(checkpoint, tmp_path, kv_cache_bytes=1024)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        GRPOConfig(model="m", output_dir="o", task="addition", gpu_memory_utilization=1.5)


def test_packed_gradients_equal_hugging_face_per_sequence_sums():
    """Sequences of equal and of different lengths, interleaved, packed into one forward:
    attention is batched by length, so grouping and restoring the order must be exact."""
    ours, hf = make_pair("llama", seed=8, vocab_size=VOCAB)
    ours.train()
    gen = torch.Generator().manual_seed(8)
    shapes = [(3, 4), (5, 2), (3, 4), (2, 1), (5, 2), (4, 6), (3, 4)]
    prompts = [torch.randint(1, VOCAB, (p,), generator=gen).tolist() for p, _ in shapes]
    responses = [torch.randint(1, VOCAB, (r,), generator=gen).tolist() for _, r in shapes]
    weights = torch.randn(sum(r for _, r in shapes), generator=gen)
    rows = packed_response_logprobs(ours, prompts, responses, 0.9, chunk_rows=3)
    assert_equal_to_hf_per_sequence(ours, hf, prompts, responses, rows, weights, 0.9)


def assert_equal_to_hf_per_sequence(ours, hf, prompts, responses, rows, weights, temperature):
    """`rows` (our packed log-probs) and the gradients of their `weights`-weighted sum equal
    HF's, one plain forward per sequence."""
    (torch.cat(rows) * weights).sum().backward()
    expected = []
    for prompt, response in zip(prompts, responses, strict=True):
        logits = hf(torch.tensor([prompt + response])).logits[0].float() / temperature
        logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
        expected.append(logp.gather(-1, torch.tensor(response, dtype=torch.long)[:, None])[:, 0])
    expected = torch.cat(expected)
    (expected * weights).sum().backward()
    assert torch.allclose(torch.cat(rows), expected.detach(), atol=1e-5)
    assert_gradients_equal({n: p.grad for n, p in ours.named_parameters()}, hf)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_shared_prompt_enters_the_forward_once_and_scores_as_hugging_face(checkpointing):
    """GRPO groups: several responses to one prompt, interleaved with other groups and a
    prompt of its own. The prompt enters the forward once (every response reads its keys);
    response lengths 0 and 1 have no tokens of their own. Log-probs and gradients equal HF's
    per-sequence forwards (GQA: 4 query heads over 2 key heads)."""
    ours, hf = make_pair("qwen2", seed=9, vocab_size=VOCAB)
    ours.train()
    gen = torch.Generator().manual_seed(9)
    a, b, c = (torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 3, 4))
    shapes = [(a, 4), (b, 3), (a, 1), (a, 6), (c, 2), (b, 3), (a, 4), (a, 0)]
    prompts = [p for p, _ in shapes]
    responses = [torch.randint(0, VOCAB, (r,), generator=gen).tolist() for _, r in shapes]
    fed = []
    forward = ours.hidden_states_packed

    def spy(ids, *args):
        fed.append(ids.numel())
        return forward(ids, *args)

    ours.hidden_states_packed = spy
    rows = packed_response_logprobs(ours, prompts, responses, 0.9, 3, checkpointing)
    assert fed == [len(a) + len(b) + len(c) + sum(max(r - 1, 0) for _, r in shapes)]
    assert [len(row) for row in rows] == [r for _, r in shapes]
    weights = torch.randn(sum(r for _, r in shapes), generator=gen)
    assert_equal_to_hf_per_sequence(ours, hf, prompts, responses, rows, weights, 0.9)
