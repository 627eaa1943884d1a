"""An environment and an engine for episode tests that need no model: the environment opens
and answers with fixed texts, the engine answers a fixed text (as `TOKENIZER` encodes it)."""

from dataclasses import dataclass, field

from core_engine.task import FinishReason, GenerationResult
from core_engine.toy import DEFAULT_ALPHABET, char_tokenizer

# a character tokenizer with the characters of tool calls and special tokens as plain text,
# and a NUL token (as byte-level tokenizers have)
TOKENIZER = char_tokenizer(DEFAULT_ALPHABET + "<>{}_[]|\x00")


@dataclass(frozen=True)
class Reply:
    """`env_sandbox.EnvResult`'s shape."""

    messages: list[dict]
    reward: float | None = None
    done: bool = False
    error: str | None = None
    code: str | None = None


@dataclass
class Environment:
    """Opens with `opening`, then answers every turn with `observation` (done at turn 2)."""

    opening: str = "hi"
    observation: str = "ok"
    tools: list = field(default_factory=list)
    turns: int = 0

    def reset(self, ids, tasks):
        self.turns = 0
        return [Reply([{"role": "user", "content": self.opening}]) for _ in ids]

    def step(self, ids, turns):
        self.turns += 1
        return [Reply([{"role": "user", "content": self.observation}], 1.0, self.turns >= 2)]

    def close(self, ids=None):
        pass


class ScriptedEngine:
    """Every request answers `text` (as the tokenizer encodes it), under version 0."""

    version = 0

    def __init__(self, text: str) -> None:
        self.ids = TOKENIZER(text, add_special_tokens=False)["input_ids"]
        self.prompts: list[list[int]] = []

    def run_batch(self, prompts, params, cancelled=lambda: False):
        self.prompts += prompts
        return [self._result(prompt) for prompt in prompts]

    def _result(self, prompt):
        n = len(self.ids)
        return GenerationResult(
            0, prompt, list(self.ids), [-1.0] * n, [-1.0] * n, FinishReason.STOP, None, None,
            0, len(prompt), 0, 0, None, 0.0, None, None,
        )  # fmt: skip
