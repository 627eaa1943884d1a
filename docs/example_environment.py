"""An example environment (README, "Environments"): spell the record's word backwards, with a
tool that lists its letters. Register it on the worker with
``RLWB_ENVIRONMENTS="spell_backwards=example_environment:SpellBackwards"`` (this folder on
``PYTHONPATH``); a job then names ``spell_backwards``."""

LETTERS_TOOL = {
    "type": "function",
    "function": {
        "name": "letters",
        "description": "The letters of a word, numbered from 1.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
        },
    },
}


class SpellBackwards:
    """One episode: the task's ``input`` is the word; the final answer (a turn without tool
    calls) earns 1.0 if it is the word backwards."""

    def __init__(self) -> None:
        self.tools = [LETTERS_TOOL]
        self.word = ""

    def reset(self, task: dict[str, str]) -> list[dict[str, str]]:
        self.word = task["input"]
        return [
            {"role": "system", "content": "Spell the word backwards; answer with it alone."},
            {"role": "user", "content": self.word},
        ]

    def step(self, turn: dict) -> dict:
        if turn["tool_calls"]:
            return {"messages": [self._letters(call) for call in turn["tool_calls"]]}
        right = turn["content"].strip() == self.word[::-1]
        return {"messages": [], "reward": float(right), "done": True}

    @staticmethod
    def _letters(call: dict) -> dict[str, str]:
        word = call["arguments"].get("word") if call["name"] == "letters" else None
        if not isinstance(word, str):
            return {"role": "tool", "content": "error: call letters with a string word"}
        listed = " ".join(f"{i}:{letter}" for i, letter in enumerate(word, 1))
        return {"role": "tool", "content": listed}
