"""The calculator demo policy: the shipped checkpoint (engine = transformers, checksum, EOS
rule, a tokenizer that round-trips a tool-call conversation token for token, a greedy held-out
episode end to end against the calculator environment) and its builder on a tiny budget."""

import json

import pytest
import torch
import transformers

from core_engine.assets import CALCULATOR_POLICY
from core_engine.engine import end_of_sequence_ids, load_engine
from core_engine.model import load_model
from core_engine.policies.calculator import (
    INFO_FILE,
    WarmupSettings,
    build_calculator_policy,
    conversation,
    episode_accuracy,
    heldout_records,
    supervised_batch,
    tool_expressions,
    training_example,
)
from core_engine.policies.word_chat import TURN_END
from core_engine.rl.data.tasks import HELDOUT_SEED
from core_engine.rl.data.word_problems import gsm8k_records
from core_engine.rl.episodes.env_sandbox import EnvironmentSession
from core_engine.rl.episodes.environments import CALCULATOR_SYSTEM, Calculator, calculate
from core_engine.scheduler import EngineConfig
from core_engine.tool_calls import parse_tool_calls
from core_engine.weights import model_checksum

TOOLS = Calculator().tools


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(CALCULATOR_POLICY)


@pytest.fixture(scope="module")
def info():
    return json.loads((CALCULATOR_POLICY / INFO_FILE).read_text())


def worked_conversation() -> list[dict]:
    return conversation(gsm8k_records(1, HELDOUT_SEED + 1)[0])


def test_the_shipped_checkpoint_is_what_its_metadata_says(info):
    """Our decoder and Hugging Face load the same weights (the recorded checksum) and give the
    same logits on a rendered tool-call conversation."""
    ours = load_model(CALCULATOR_POLICY)
    hf = transformers.AutoModelForCausalLM.from_pretrained(CALCULATOR_POLICY).eval()
    assert model_checksum(ours) == model_checksum(hf) == info["weights_checksum"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(CALCULATOR_POLICY)
    ids, _ = training_example(tokenizer, worked_conversation(), TOOLS)
    with torch.no_grad():
        x = torch.tensor([ids])
        torch.testing.assert_close(ours(x), hf(x).logits, rtol=1e-4, atol=1e-4)
    assert info["reached_target"] and info["accuracy"] >= info["target_accuracy"]
    assert info["heldout"]["seed"] == HELDOUT_SEED
    assert info["built_with"]["builder"] == (
        "core_engine.policies.calculator.build_calculator_policy"
    )
    assert info["parameters"] == sum(p.numel() for p in ours.parameters())
    assert len(ids) < hf.config.max_position_embeddings
    size = sum(f.stat().st_size for f in CALCULATOR_POLICY.iterdir())
    assert size < 8 * 2**20


def test_the_tokenizer_round_trips_a_tool_call_conversation(tokenizer):
    """The rendered conversation encodes to exactly the ids an episode is made of (opening
    prompt, sampled turns, the template's tokens between them) and decodes back to itself; a
    turn decoded as the runner decodes it parses to its call; OpenAI-shaped `tool_calls`
    render as the text the policy writes."""
    messages = worked_conversation()
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text.startswith(f"<|im_start|>system\n{CALCULATOR_SYSTEM}\nTools: calculate{TURN_END}")
    assert "<|im_start|>tool\n" in text
    ids, mask = training_example(tokenizer, messages, TOOLS)
    whole = text.removesuffix("\n")  # an episode ends at its last end-of-turn token
    assert tokenizer(whole, add_special_tokens=False)["input_ids"] == ids
    assert tokenizer.decode(ids) == whole
    turn = [i for i, m in zip(ids, mask, strict=True) if m]
    turn = turn[: turn.index(tokenizer.eos_token_id) + 1]
    first = tokenizer.decode(turn, skip_special_tokens=True)
    expression = tool_expressions(gsm8k_records(1, HELDOUT_SEED + 1)[0]["answer"])[0]
    parsed = parse_tool_calls(first, names=["calculate"])
    assert (parsed.error, parsed.content) == (None, "")
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("calculate", {"expression": expression})
    ]
    for arguments in ({"expression": expression}, json.dumps({"expression": expression})):
        call = {"type": "function", "function": {"name": "calculate", "arguments": arguments}}
        openai = [*messages[:2], {"role": "assistant", "content": None, "tool_calls": [call]}]
        assert tokenizer.apply_chat_template(openai, tools=TOOLS, tokenize=False) == (
            tokenizer.apply_chat_template(messages[:3], tools=TOOLS, tokenize=False)
        )


def test_the_end_of_turn_is_the_eos_the_engine_stops_on(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(TURN_END)
    assert tokenizer.eos_token == TURN_END
    generation = json.loads((CALCULATOR_POLICY / "generation_config.json").read_text())
    config = json.loads((CALCULATOR_POLICY / "config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"] == eos
    assert end_of_sequence_ids(tokenizer, CALCULATOR_POLICY) == (eos,)
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False).endswith(f"4{TURN_END}\n")


def test_a_greedy_heldout_episode_calls_the_tool_and_reads_its_result(tokenizer):
    """One held-out problem through the engine and the calculator environment: the first turn
    is a parsed `calculate` call ending at the EOS, the next segment the tool's result."""
    engine = load_engine(CALCULATOR_POLICY, EngineConfig(max_batch_size=1))
    record = heldout_records(1)
    with EnvironmentSession("calculator") as session:
        score = episode_accuracy(engine, record, session)
    rollout = score.rollout
    assert score.mean_reward in (0.0, 1.0) and rollout.num_samples == 1
    first, observation = rollout.segments[0][:2]
    assert first["role"] == "assistant" and first.get("tool_error") is None
    [call] = first["tool_calls"]
    assert call["name"] == "calculate" and set(call["arguments"]) == {"expression"}
    tokens = rollout.response_ids[0]
    assert tokens[first["end"] - 1] == tokenizer.eos_token_id
    value = calculate(call["arguments"]["expression"])
    assert (observation["role"], observation["text"]) == ("tool", value)
    bridge = tokenizer.decode(tokens[observation["start"] : observation["end"]])
    assert bridge == f"\n<|im_start|>tool\n{value}{TURN_END}\n<|im_start|>assistant\n"
    assert rollout.episode_finishes[0] in ("done", "max_turns")
    opening = Calculator().reset(record[0])
    prompt = tokenizer.apply_chat_template(
        opening, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert rollout.prompt_ids[0] == tokenizer(prompt, add_special_tokens=False)["input_ids"]


def test_tool_expressions_follow_the_worked_lines():
    answer = (
        "The friends give 4 x 4 = <<4*4=16>>16 stickers, so Dana has 16 + 16 = <<16+16=32>>32.\n"
        "32 - 7 = <<32-7=25>>25.\n"
        "25 x $3 = $<<25*3=75>>75.\n"
        "#### 75"
    )
    assert tool_expressions(answer) == ["16+4*4", "32-7", "25*3"]


def test_the_loss_is_on_the_assistant_tokens_only():
    inputs, targets = supervised_batch([([5, 6, 7, 8], [0, 0, 1, 1]), ([5, 9], [0, 1])], 0)
    assert inputs.tolist() == [[5, 6, 7, 8], [5, 9, 0, 0]]
    assert targets.tolist() == [[-100, 7, 8, -100], [9, -100, -100, -100]]


def test_the_builder_on_a_tiny_budget(tmp_path):
    """The checkpoint format, the record, and a cached checkpoint reused."""
    tiny = WarmupSettings(batch_size=2, eval_every=1, eval_count=2)
    path = build_calculator_policy(tmp_path / "p", max_steps=1, settings=tiny, tokenizer_rows=20)
    info = json.loads((path / INFO_FILE).read_text())
    assert (info["steps"], info["reached_target"]) == (1, False)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {
        f.name for f in path.iterdir()
    }
    hf = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert model_checksum(hf) == info["weights_checksum"]
    before = (path / "model.safetensors").stat().st_mtime_ns
    assert build_calculator_policy(path, max_steps=5, settings=tiny) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == before
