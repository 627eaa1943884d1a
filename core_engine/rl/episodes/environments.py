"""Environments: what an operator implements, the registry, the checks and the built-ins.

An environment is a factory (usually a class) taking no arguments; each call makes the state
of one episode, an object with

- ``tools``: the tool JSON schemas the model may call (OpenAI function tools), ``[]`` for none;
- ``reset(task) -> list[dict]``: the opening messages (roles ``system``/``user``) for a data
  record ``{"instruction", "input", "output"}`` (``output``: the reference);
- ``step(turn) -> dict``: answer one assistant turn ``{"content", "tool_calls", "text"}``
  (``tool_calls``: ``[{"name", "arguments"}]``) with ``{"messages": [...], "reward": float |
  None, "done": bool}`` (messages of roles ``tool``/``user``/``system``; reward and done
  optional, None and False).

An operator registers factories by name: ``RLWB_ENVIRONMENTS="name=package.module:factory,..."``
or the ``rlwb.environments`` entry-point group. The built-ins ``calculator`` and
``guess_number`` have fixed names. A job names an environment, never a module: nothing is
imported here, only in the sandbox child (`core_engine.rl.episodes.env_sandbox`).
"""

from __future__ import annotations

import ast
import hashlib
import math
import operator
import random
import re
from typing import Any

from core_engine.rl.episodes.record import messages_problem, observation_problem
from core_engine.rl.registry import registered

ENTRY_POINT_GROUP = "rlwb.environments"
BUILTIN_ENVIRONMENTS = {
    "calculator": f"{__name__}:Calculator",
    "guess_number": f"{__name__}:GuessNumber",
}
MAX_MESSAGES = 64  # per reset or step
RESET_ROLES = ("system", "user")
STEP_ROLES = ("tool", "user", "system")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def registered_environments() -> dict[str, str]:
    """name -> ``module:factory``: the operator's registrations (read, never imported, here)
    and the built-ins, whose names an operator cannot take."""
    return {**registered(ENTRY_POINT_GROUP, "RLWB_ENVIRONMENTS"), **BUILTIN_ENVIRONMENTS}


def environment_target(name: str) -> str:
    """The ``module:factory`` registered as `name`; ValueError listing the registered names."""
    registered = registered_environments()
    if not isinstance(name, str) or name not in registered:
        raise ValueError(
            f"unknown environment {name!r}: not registered on this worker (registered: "
            f"{', '.join(sorted(registered))}; operators add theirs with RLWB_ENVIRONMENTS or "
            f"the {ENTRY_POINT_GROUP} entry-point group)"
        )
    return registered[name]


# The contract's checks, run in the child on what the operator's code returns.


def check_tools(tools: Any) -> list[dict]:
    """`tools` if it is a list of OpenAI function tools; ValueError naming the problem."""
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a list, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (
            tool.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
        ):
            raise ValueError(
                f'tool {i} must be {{"type": "function", "function": {{"name": ...}}}}'
            )
    return tools


def check_reset(messages: Any) -> list[dict[str, str]]:
    """What `reset` returned, if it is at least one message of role system or user whose
    texts an episode's record holds (`core_engine.rl.episodes.record`)."""
    _check_messages(messages, RESET_ROLES)
    if not messages:
        raise ValueError("reset returned no messages")
    _check_record(messages_problem(messages, "the opening"))
    return messages


def check_step(result: Any) -> dict[str, Any]:
    """What `step` returned as ``{"messages", "reward", "done"}``; ValueError naming the
    problem (a missing reward is None, a missing done False; messages an episode's record
    does not hold)."""
    if not isinstance(result, dict):
        raise ValueError(f"step must return a dict, got {type(result).__name__}")
    unknown = set(result) - {"messages", "reward", "done"}
    if unknown:
        raise ValueError(f"step returned unknown keys {sorted(map(str, unknown))}")
    if "messages" not in result:
        raise ValueError("step returned no 'messages'")
    _check_messages(result["messages"], STEP_ROLES)
    _check_record(observation_problem(result["messages"]))
    reward, done = result.get("reward"), result.get("done", False)
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
    ):
        raise ValueError(f"reward must be a finite number or None, got {reward!r}")
    if not isinstance(done, bool):
        raise ValueError(f"done must be True or False, got {done!r}")
    reward = None if reward is None else float(reward)
    return {"messages": result["messages"], "reward": reward, "done": done}


def _check_record(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


def _check_messages(messages: Any, roles: tuple[str, ...]) -> None:
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list, got {type(messages).__name__}")
    if len(messages) > MAX_MESSAGES:
        raise ValueError(f"{len(messages)} messages, more than {MAX_MESSAGES}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ValueError(f"message {i} must be a dict of 'role' and 'content' only")
        if message["role"] not in roles:
            raise ValueError(f"message {i} has role {message['role']!r}, not one of {roles}")
        if not isinstance(message["content"], str):
            raise ValueError(f"message {i} content must be a string")


# The calculator's evaluator: arithmetic on numbers, never eval.

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e100  # of every number met, literal or intermediate
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, + - * / // % **, unary +/- and
    parentheses, parsed with `ast` (nothing is executed). ValueError for anything else, a
    division by zero, an exponent over 64 in size or a number over 1e100 in size."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponents are limited to {MAX_EXPONENT} in size")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError(f"a number over {MAX_MAGNITUDE:g} in size") from None
    raise ValueError(
        f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and parentheses"
    )


def _bounded(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise ValueError("the result is not a real number")
    if not abs(value) <= MAX_MAGNITUDE:  # also inf and nan
        raise ValueError(f"a number over {MAX_MAGNITUDE:g} in size")
    return value


def calculate(expression: str) -> str:
    """The calculator tool's reply: the value as a short string, or ``error: ...``."""
    try:
        value = evaluate(expression)
    except ValueError as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return f"{value:.12g}" if isinstance(value, float) else str(value)


def last_number(text: str) -> float | None:
    """The last number written in `text` (``-12``, ``3.5``, ``1,234``), or None."""
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def final_answer(text: str) -> float | None:
    """The number answered: the last number inside the last ``<answer>...</answer>``, or
    without one the last number in the text."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return last_number(text[start + len("<answer>") : end] if start >= 0 else text)


def _question(task: dict[str, str]) -> str:
    return "\n\n".join(part for part in (task.get("instruction"), task.get("input")) if part)


CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate arithmetic: numbers, + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (12 + 30) * 4"}},
            "required": ["expression"],
        },
    },
}
CALCULATOR_SYSTEM = (
    "Solve the user's problem. You may call the tool `calculate` with an arithmetic expression "
    "as often as you like. When you are done, reply without a tool call and put your final "
    "answer, a number, inside <answer></answer>; without answer tags the last number of that "
    "reply is your answer."
)


class Calculator:
    """Word problems (records whose ``output`` is the number to find) with a `calculate` tool:
    a turn with tool calls gets one ``tool`` message per call; a turn without is the final
    answer, reward 1.0 if it equals the reference (relative tolerance 1e-6), else 0.0."""

    def __init__(self) -> None:
        self.tools = [CALCULATE_TOOL]
        self.reference = 0.0

    def reset(self, task: dict[str, str]) -> list[dict[str, str]]:
        reference = last_number(task.get("output", ""))
        if reference is None:
            raise ValueError(f"calculator: the record's output {task.get('output')!r} is no number")
        self.reference = reference
        return [
            {"role": "system", "content": CALCULATOR_SYSTEM},
            {"role": "user", "content": _question(task)},
        ]

    def step(self, turn: dict[str, Any]) -> dict[str, Any]:
        calls = turn.get("tool_calls") or []
        if calls:
            messages = [{"role": "tool", "content": self._call(call)} for call in calls]
            return {"messages": messages, "reward": None, "done": False}
        answer = final_answer(turn.get("content", ""))
        right = answer is not None and math.isclose(answer, self.reference, rel_tol=1e-6)
        return {"messages": [], "reward": float(right), "done": True}

    @staticmethod
    def _call(call: dict[str, Any]) -> str:
        if call.get("name") != "calculate":
            return f"error: unknown tool {call.get('name')!r}; the tools are: calculate"
        arguments = call.get("arguments")
        if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
            return "error: calculate takes one string argument, expression"
        return calculate(arguments["expression"])


GUESS_SYSTEM = (
    "I am thinking of a whole number between 1 and 100. Guess it: say one number per turn and "
    "I answer higher, lower or correct."
)
GUESS_PROMPT = "Guess my number between 1 and 100."


def guess_target(task: dict[str, str]) -> int:
    """The number to guess: the record's ``output`` if it is an integer in 1..100, else
    1..100 from a hash of the record's instruction, input and output."""
    output = task.get("output", "").strip()
    if output.isdigit() and 1 <= int(output) <= 100:
        return int(output)
    fields = "\x00".join(task.get(key, "") for key in ("instruction", "input", "output"))
    return int(hashlib.sha256(fields.encode()).hexdigest(), 16) % 100 + 1


def guess_number_records(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` guess_number tasks, seeded: the target is the ``output``."""
    rng = random.Random(seed)
    return [
        {"instruction": "", "input": GUESS_PROMPT, "output": str(rng.randint(1, 100))}
        for _ in range(count)
    ]


class GuessNumber:
    """Find a number in 1..100 over several turns, no tools: each turn's last number is the
    guess, answered ``higher``, ``lower`` or ``correct`` (reward 1.0, done); a turn without a
    whole number in range is asked for one."""

    def __init__(self) -> None:
        self.tools: list[dict] = []
        self.target = 0

    def reset(self, task: dict[str, str]) -> list[dict[str, str]]:
        self.target = guess_target(task)
        return [
            {"role": "system", "content": GUESS_SYSTEM},
            {"role": "user", "content": _question(task) or GUESS_PROMPT},
        ]

    def step(self, turn: dict[str, Any]) -> dict[str, Any]:
        guess = last_number(turn.get("content", ""))
        if guess is None or not guess.is_integer() or not 1 <= guess <= 100:
            reply, reward = "say a number between 1 and 100", None
        elif guess == self.target:
            reply, reward = "correct", 1.0
        else:
            reply, reward = ("higher" if guess < self.target else "lower"), None
        return {
            "messages": [{"role": "user", "content": reply}],
            "reward": reward,
            "done": reward is not None,
        }
