"""Multi-turn episodes against independent truth: the canonical history is the sampled tokens
and the chat template's own tokens between turns (never a re-rendered conversation); every
assistant token's log-prob equals a Hugging Face teacher-forced replay of the stored history
under its version; a version change between turns recomputes the prefix (no stale hit) while
the same version reuses it; the loss over an episode gives its observation tokens no gradient
(Hugging Face autograd with the mask)."""

from dataclasses import dataclass, field

import pytest
import torch
import transformers

from core_engine.engine import load_engine
from core_engine.prompts import encode_prompt, render_prompt
from core_engine.rl.episodes.runner import EpisodeGenerator, EpisodeLimits
from core_engine.rl.objective.update import TrainSample, UpdateSettings, accumulate_gradients
from core_engine.rl.ranks.group import RankInfo
from core_engine.rl.ranks.rollouts import seeded_share
from core_engine.scheduler import EngineConfig
from core_engine.task import SamplingParams, expand_runs
from core_engine.toy import save_tiny_checkpoint
from core_engine.weights import canonical_weights
from workers.replay import replay_logprobs, segments

from .episode_fakes import Reply
from .reference import assert_gradients_equal
from .test_policy_versions import perturbed

TOLERANCE = 1e-4


@dataclass
class CountingEnvironment:
    """Each episode says "again" until its third turn, then is done with reward = its id's
    parity; `on_step` runs before each batch of steps (a weight update between turns)."""

    tools: list = field(default_factory=list)
    turns: dict = field(default_factory=dict)
    on_step: object = None

    def reset(self, ids, tasks):
        for i in ids:
            self.turns[i] = 0
        return [Reply([{"role": "user", "content": t["input"]}]) for t in tasks]

    def step(self, ids, turns):
        if self.on_step:
            self.on_step()
        replies = []
        for i in ids:
            self.turns[i] += 1
            done = self.turns[i] >= 3
            replies.append(Reply([{"role": "user", "content": "again"}], float(i % 2), done))
        return replies

    def close(self, ids=None):
        pass


@pytest.fixture
def policy(tmp_path):
    path = save_tiny_checkpoint(tmp_path / "policy", seed=4)
    engine = load_engine(path, EngineConfig(max_seq_len=256, kv_strategy="paged", page_size=4))
    return path, engine


def run_episodes(engine, env, in_flight=False, group=2, max_tokens=6):
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    generator = EpisodeGenerator(
        engine, params, group, engine.tokenizer, env, EpisodeLimits(4, 200), in_flight
    )
    return generator.generate({"instruction": ["", ""], "input": ["2+3=?", "7*1=?"]}, seed=5)


def hf_model(path, weights=None):
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    if weights is not None:
        hf.load_state_dict(weights, strict=False)
    return hf


def test_the_history_is_the_sampled_tokens_and_the_templates_between_turns(policy):
    _, engine = policy
    rollout = run_episodes(engine, CountingEnvironment())
    tokenizer = engine.tokenizer
    assert rollout.episode_finishes == ["done"] * 4
    for reward, parts in zip(rollout.episode_rewards, rollout.segments, strict=True):
        assert reward == sum(p.get("reward") or 0.0 for p in parts)  # the turns' rewards
    for i in range(rollout.num_samples):
        parts, tokens, mask = rollout.segments[i], rollout.response_ids[i], rollout.loss_masks[i]
        roles = [p["role"] for p in parts]
        assert roles == ["assistant", "user", "assistant", "user", "assistant"]
        assert [p["start"] for p in parts[1:]] == [p["end"] for p in parts[:-1]]
        assert parts[-1]["end"] == len(tokens) == len(mask)
        for part in parts:
            span = tokens[part["start"] : part["end"]]
            assert set(mask[part["start"] : part["end"]]) == {part["role"] == "assistant"}
            if part["role"] == "user":  # the template's own tokens: turn end + observation
                expected = "<|end|>" + render_prompt(
                    tokenizer, [{"role": "user", "content": "again"}]
                )
                assert span == encode_prompt(tokenizer, expected)
        # the prompt is rendered once; the whole history never again
        opening = rollout.messages[rollout.group_of(i)]
        assert rollout.prompt_ids[rollout.group_of(i)] == encode_prompt(
            tokenizer, render_prompt(tokenizer, opening)
        )


def test_assistant_logprobs_equal_a_teacher_forced_replay_of_the_history(policy):
    path, engine = policy
    rollout = run_episodes(engine, CountingEnvironment())
    hf = hf_model(path)
    for i in range(rollout.num_samples):
        prompt = rollout.prompt_ids[rollout.group_of(i)]
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + rollout.response_ids[i]])).logits[0]
        logp = logits.float().log_softmax(-1)[len(prompt) - 1 : -1]
        replay = logp.gather(1, torch.tensor(rollout.response_ids[i])[:, None])[:, 0]
        sampled = torch.tensor(rollout.loss_masks[i], dtype=torch.bool)
        stored = torch.tensor(rollout.temp_logprobs[i])
        assert sampled.sum() > 0 and (~sampled).sum() > 0
        assert torch.allclose(stored[sampled], replay[sampled], atol=TOLERANCE)


def test_a_version_change_between_turns_recomputes_the_prefix(policy):
    """Turn 2 of an episode reuses turn 1's K/V under the same version (a prefix hit); after
    an update between the turns nothing stale is hit, every token is stamped with its version,
    and the replay that starts each turn from the new version's K/V (`resumed_at`)
    reproduces the stored log-probs."""
    path, engine = policy
    same = run_episodes(engine, CountingEnvironment(), group=1)
    for parts in same.segments:  # turns 2 and 3 hit the pages of the turns before
        assert all(p["cached"] > 0 for p in parts if p["role"] == "assistant" and p["start"])
    w0 = {k: v.detach().clone() for k, v in canonical_weights(engine.model).items()}
    weights = {0: w0, 1: perturbed(w0, 1, scale=0.3), 2: perturbed(w0, 2, scale=0.3)}

    def update():  # after turns 1 and 2 (the update after turn 3 lands after the episodes)
        version = engine.version + 1
        if version in weights:
            engine.update_weights(weights[version], version, mode="in_flight")

    env = CountingEnvironment(on_step=update)
    start = engine.version
    rollout = run_episodes(engine, env, in_flight=True, group=1)
    for parts in rollout.segments:  # every turn after an update: recomputed, nothing hit
        assert all(p["cached"] == 0 for p in parts if p["role"] == "assistant" and p["start"])
    models = {v: hf_model(path, weights[v - start]) for v in range(start, start + 3)}
    for i in range(rollout.num_samples):
        versions = expand_runs(rollout.token_versions[i])
        starts = [p["start"] for p in rollout.segments[i] if p["role"] == "assistant"]
        assert [versions[s] for s in starts] == [start, start + 1, start + 2]
        assert rollout.resumed_at[i] == starts[1:]
        prompt = rollout.prompt_ids[rollout.group_of(i)]
        parts = segments(rollout.token_versions[i], rollout.resumed_at[i])
        scores = replay_logprobs(prompt, rollout.response_ids[i], parts, models.__getitem__, 1.0)
        replayed = torch.tensor([v for part in scores for v in part])
        sampled = torch.tensor(rollout.loss_masks[i], dtype=torch.bool)
        stored = torch.tensor(rollout.temp_logprobs[i])
        assert torch.allclose(stored[sampled], replayed[sampled], atol=TOLERANCE)
        unaware = replay_logprobs(
            prompt,
            rollout.response_ids[i],
            segments(rollout.token_versions[i]),
            models.__getitem__,
            1.0,
        )
        stale = torch.tensor([v for part in unaware for v in part])
        assert (stale[sampled] - stored[sampled]).abs().max() > TOLERANCE


def test_observation_tokens_get_no_gradient(policy):
    """The episode's loss, ours with the loss mask, equals Hugging Face autograd of the same
    clipped loss summed over the sampled tokens only (at ratio 1: -A * mean logp)."""
    path, engine = policy
    rollout = run_episodes(engine, CountingEnvironment(), group=1)
    prompt, response = rollout.prompt_ids[0], rollout.response_ids[0]
    mask, behaviour = rollout.loss_masks[0], rollout.temp_logprobs[0]
    sample = TrainSample(prompt, response, behaviour, 1.5, loss_mask=mask)
    model = engine.model
    model.zero_grad(set_to_none=True)
    settings = UpdateSettings(1.0, 0.2, 0.0, 4096, 4096)
    accumulate_gradients(model, [sample], settings)
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    hf = hf_model(path)
    logits = hf(torch.tensor([prompt + response])).logits[0].float()
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1].gather(1, torch.tensor(response)[:, None])[
        :, 0
    ]
    keep = torch.tensor(mask, dtype=torch.bool)
    ratio = torch.exp(logp - torch.tensor(behaviour))
    (-(1.5 * ratio)[keep].sum() / keep.sum()).backward()
    assert_gradients_equal(ours, hf)


def test_a_share_of_the_batch_draws_the_whole_batchs_episodes(policy):
    """The one seed rule (`rollout.seeds.sample_seed`): a rank generating the second prompt's
    group alone, seeded as ranks seed their share, samples every turn of those episodes as the
    whole batch does (an environment job on two ranks draws what one process draws)."""
    _, engine = policy
    params = SamplingParams(temperature=1.0, max_tokens=6)
    info = RankInfo(rank=1, world_size=2, local_rank=1, device=torch.device("cpu"))

    def generate(batch, seed):
        generator = EpisodeGenerator(
            engine, params, 2, engine.tokenizer, CountingEnvironment(), EpisodeLimits(4, 200)
        )
        return generator.generate(batch, seed)

    batch = {"instruction": ["", ""], "input": ["2+3=?", "7*1=?"]}
    whole = generate(batch, 5)
    share, share_seed = seeded_share(batch, 5, info, 2)
    alone = generate(share, share_seed)
    assert alone.response_ids == whole.response_ids[2:] and alone.seeds == whole.seeds[2:]
    assert all(len(ids) > 6 for ids in alone.response_ids)  # several turns each
