"""Environments (issue 30): the calculator's safe evaluator, the built-ins driven by hand-written
assistant turns, and operator-registered environments in a real sandbox child: registration
only, and a hanging, memory-eating, crashing or contract-breaking environment answers an
error for its own episodes while the session goes on."""

import os
import re
import resource
import sys
from pathlib import Path

import pytest

from core_engine.rl import registry
from core_engine.rl.data.word_problems import word_problem_records
from core_engine.rl.episodes import env_sandbox, environments
from core_engine.rl.episodes.env_sandbox import EnvironmentSession
from core_engine.rl.episodes.environments import (
    calculate,
    evaluate,
    final_answer,
    guess_number_records,
    guess_target,
    registered_environments,
)
from tests.core_engine.envs_for_tests import EAT_BYTES

EXAMPLES = Path(__file__).resolve().parents[2] / "docs"


def turn(content: str = "", tool_calls: list | None = None) -> dict:
    return {"content": content, "tool_calls": tool_calls or [], "text": content}


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def pids(results) -> list[int]:
    return [int(result.messages[0]["content"]) for result in results]


def gone(pid: int) -> bool:
    """The process no longer exists (killed and reaped: a zombie would still answer)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# The calculator's evaluator.


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2+3*4", 14),
        ("(2+3)*4", 20),
        ("-3**2", -9),  # ** binds tighter than unary minus
        ("2**3**2", 512),  # and is right-associative
        ("2**-1", 0.5),
        ("+5 - -2", 7),
        ("10/4", 2.5),
        ("7//2", 3),
        ("-7//2", -4),
        ("7 % 3", 1),
        ("1_000 * 3", 3000),
        ("9**64", 9**64),  # the exponent at its bound
    ],
)
def test_the_evaluator_computes_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("2**65", "exponents are limited"),
        ("2**1000", "exponents are limited"),
        ("(10**60)**2", r"over 1e\+100 in size"),
        ("1e999", r"over 1e\+100 in size"),
        ("(-8)**0.5", "not a real number"),
        ("x + 1", "Name is not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("abs(-1)", "Call is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("__import__('os').system('true')", "Call is not allowed"),
        ("'a' * 3", "Constant is not allowed"),
        ("True + 1", "Constant is not allowed"),
        ("2j", "Constant is not allowed"),
        ("[1][0]", "Subscript is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("2 +", "not an arithmetic expression"),
        ("1+" * 100 + "1", "longer than 200"),
    ],
)
def test_the_evaluator_refuses_everything_else(expression, why):
    with pytest.raises(ValueError, match=why):
        evaluate(expression)
    assert calculate(expression).startswith("error: ")


def test_the_tool_answers_a_short_number():
    expressions = ["6/3", "1/3", "2**0.5", "3*4", "2**64", "123456789012345/1"]
    assert [calculate(e) for e in expressions] == [
        "2",
        "0.333333333333",
        "1.41421356237",
        "12",
        "18446744073709551616",
        "123456789012345",  # a whole result in full, not rounded to 12 digits
    ]


def test_the_final_answer_is_the_last_answer_tag_else_the_last_number():
    assert final_answer("3 apples <answer>12</answer> and <answer>$1,234</answer> 7") == 1234
    assert final_answer("<answer>twelve</answer> 12") is None
    assert final_answer("<answer>12</answer> or <answer>none</answer>") is None
    assert final_answer("5 + 7 = 12, so 12.5") == 12.5
    assert final_answer("it is -4") == -4
    assert final_answer("no idea") is None


# The built-ins through a real session.


def test_a_calculator_episode_scores_the_final_answer():
    records = word_problem_records(3, seed=7)
    with EnvironmentSession("calculator") as session:
        assert [t["function"]["name"] for t in session.tools] == ["calculate"]
        opening = session.reset([0, 1, 2], records)
        for result, record in zip(opening, records, strict=True):
            system, user = result.messages
            assert system["role"] == "system" and "calculate" in system["content"]
            assert "<answer></answer>" in system["content"]
            assert user == {"role": "user", "content": record["input"]}

        calls = [
            call("calculate", expression="12*4+3"),
            call("calculate", expression="7/0"),
            call("search", query="answer"),
            call("calculate", text="1+1"),
        ]
        (tools,) = session.step([0], [turn("let me compute", calls)])
        assert [m["role"] for m in tools.messages] == ["tool"] * 4
        answers = [m["content"] for m in tools.messages]
        assert answers[0] == "51" and answers[1] == "error: division by zero"
        assert answers[2].startswith("error: unknown tool 'search'")
        assert answers[3].startswith("error: calculate takes")
        assert (tools.reward, tools.done, tools.error) == (None, False, None)

        right, wrong = records[0]["output"], str(int(records[1]["output"]) + 1)
        finals = session.step(
            [0, 1, 2],
            [
                turn(f"<answer>{right}</answer> (from 3 steps)"),
                turn(f"<answer>{wrong}</answer>"),
                turn(f"So the total is {records[2]['output']}."),
            ],
        )
        assert [(r.reward, r.done, r.error) for r in finals] == [
            (1.0, True, None),
            (0.0, True, None),
            (1.0, True, None),
        ]


def test_a_record_without_a_numeric_reference_fails_its_reset():
    with EnvironmentSession("calculator") as session:
        bad, good = session.reset([0, 1], [{"input": "q", "output": "many"}, {"output": "4"}])
        assert bad.code == "env_error" and "is no number" in bad.error
        assert good.error is None


def test_guess_number_answers_higher_lower_until_correct():
    with EnvironmentSession("guess_number") as session:
        assert session.tools == []
        session.reset([0], [{"instruction": "", "input": "Guess.", "output": "37"}])
        replies = []
        for said in ["50", "I'd say 25", "hmm", "101", "37"]:
            (result,) = session.step([0], [turn(said)])
            replies.append((result.messages[0]["content"], result.reward, result.done))
    assert replies == [
        ("lower", None, False),
        ("higher", None, False),
        ("say a number between 1 and 100", None, False),
        ("say a number between 1 and 100", None, False),
        ("correct", 1.0, True),
    ]


def test_guess_number_records_hold_their_targets():
    records = guess_number_records(6, seed=3)
    assert records == guess_number_records(6, seed=3)
    assert records != guess_number_records(6, seed=4)
    with EnvironmentSession("guess_number") as session:
        session.reset(list(range(6)), records)
        low, high = [1] * 6, [100] * 6
        found = [None] * 6
        for _ in range(7):  # binary search over 1..100
            live = [i for i in range(6) if found[i] is None]
            guesses = [(low[i] + high[i]) // 2 for i in live]
            for i, guess, result in zip(
                live, guesses, session.step(live, [turn(str(g)) for g in guesses]), strict=True
            ):
                reply = result.messages[0]["content"]
                if reply == "correct":
                    found[i] = (guess, result.reward)
                elif reply == "higher":
                    low[i] = guess + 1
                else:
                    high[i] = guess - 1
    assert found == [(int(r["output"]), 1.0) for r in records]


def test_a_target_without_a_numeric_output_is_a_hash_of_the_record():
    tasks = [{"instruction": "", "input": f"game {i}", "output": ""} for i in range(20)]
    targets = [guess_target(task) for task in tasks]
    assert targets == [guess_target(dict(task)) for task in tasks]
    assert all(1 <= t <= 100 for t in targets) and len(set(targets)) > 5
    assert guess_target({"output": "250"}) == guess_target({"output": "250"}) in range(1, 101)


# Registration.


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A module whose import leaves a file behind (nothing unregistered may import it)."""
    witness = tmp_path / "imported"
    (tmp_path / "rlwb_env_canary.py").write_text(
        f"open({str(witness)!r}, 'w').close()\n"
        "class Env:\n"
        "    tools = []\n"
        "    def reset(self, task):\n"
        "        return [{'role': 'user', 'content': 'hi'}]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return witness


@pytest.mark.parametrize("name", ["rlwb_env_canary:Env", "rlwb_env_canary", "canary", "os:system"])
def test_an_unregistered_environment_is_refused_without_importing(name, canary):
    with pytest.raises(ValueError, match="not registered") as refused:
        EnvironmentSession(name)
    assert "calculator" in str(refused.value) and "guess_number" in str(refused.value)
    assert not canary.exists() and "rlwb_env_canary" not in sys.modules


def test_a_registered_environment_is_imported_in_the_child_only(canary, monkeypatch):
    monkeypatch.setenv(
        "RLWB_ENVIRONMENTS", "canary=rlwb_env_canary:Env, calculator=rlwb_env_canary:Env"
    )
    assert (
        registered_environments()["calculator"] == environments.BUILTIN_ENVIRONMENTS["calculator"]
    )
    with EnvironmentSession("canary") as session:
        (opening,) = session.reset([0], [{"input": "x"}])
    assert opening.messages == [{"role": "user", "content": "hi"}]
    assert canary.exists() and "rlwb_env_canary" not in sys.modules


def test_installed_packages_register_environments_by_entry_point(monkeypatch, canary):
    from importlib.metadata import EntryPoint

    group = environments.ENTRY_POINT_GROUP
    installed = {group: [EntryPoint("canary", "rlwb_env_canary:Env", group)]}
    monkeypatch.setattr(registry, "entry_points", lambda group: installed.get(group, []))
    assert registered_environments()["canary"] == "rlwb_env_canary:Env"
    with EnvironmentSession("canary") as session:
        assert session.reset([0], [{}])[0].messages[0]["content"] == "hi"
    assert "rlwb_env_canary" not in sys.modules


def test_the_readme_example_environment(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("RLWB_ENVIRONMENTS", "spell_backwards=example_environment:SpellBackwards")
    with EnvironmentSession("spell_backwards") as session:
        assert session.tools[0]["function"]["name"] == "letters"
        session.reset([0, 1], [{"input": "stressed"}, {"input": "drawer"}])
        (listed,) = session.step([0], [turn("", [call("letters", word="abc")])])
        assert listed.messages == [{"role": "tool", "content": "1:a 2:b 3:c"}]
        finals = session.step([0, 1], [turn("desserts"), turn("drawer")])
    assert [(r.reward, r.done) for r in finals] == [(1.0, True), (0.0, True)]


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("tests.core_engine.envs_for_tests:BadTools", "tool 0 must be"),
        ("tests.core_engine.envs_for_tests:Missing", "AttributeError"),
    ],
)
def test_an_environment_that_cannot_start_is_refused_by_name(target, why, monkeypatch):
    monkeypatch.setenv("RLWB_ENVIRONMENTS", f"broken={target}")
    with pytest.raises(RuntimeError, match=f"environment 'broken' .* did not start: .*{why}"):
        EnvironmentSession("broken")


# A misbehaving environment: its episodes fail, the session goes on.


def test_one_environment_per_episode_in_a_child_process(scripted):
    session = scripted()
    pid, same = pids(session.reset([0, 1], [{"input": "a"}, {"input": "b"}]))
    assert pid == same != os.getpid()
    first = session.step([0, 1], [turn("a"), turn("b")])
    assert [r.messages[0]["content"] for r in first] == [f"a 1 {pid}", f"b 1 {pid}"]
    assert [(r.reward, r.done) for r in first] == [(0.5, False)] * 2
    (again,) = session.step([0], [turn("c")])
    assert again.messages[0]["content"] == f"c 2 {pid}"
    session.close([0])
    closed, other = session.step([0, 1], [turn("d"), turn("e")])
    assert closed.code == "env_error" and "no environment" in closed.error
    assert other.messages[0]["content"] == f"e 2 {pid}"
    session.close()
    assert gone(pid)


def test_exceptions_are_errors_of_their_episode(scripted):
    session = scripted()
    failed = session.reset([0, 1], [{"input": "raise"}, {"input": "b"}])
    assert failed[0].error == "env_error: KeyError: 'no such task'"
    (pid,) = pids(failed[1:])
    boom, fine = session.step([1, 0], [turn("raise"), turn("x")])
    assert boom.error == "env_error: RuntimeError: boom" and boom.done
    assert fine.code == "env_error" and "no environment" in fine.error  # its reset failed
    session.reset([2], [{"input": "c"}])
    (after,) = session.step([2], [turn("x")])
    assert after.messages[0]["content"] == f"x 1 {pid}"  # the same child


@pytest.mark.parametrize(
    ("action", "why"),
    [
        ("not_a_dict", "step must return a dict, got list"),
        ("no_messages", "step returned no 'messages'"),
        ("unknown_key", r"unknown keys \['rewards'\]"),
        ("nan_reward", "reward must be a finite number or None, got nan"),
        ("text_reward", "reward must be a finite number or None, got '1'"),
        ("text_done", "done must be True or False, got 'yes'"),
        ("assistant_role", "message 0 has role 'assistant'"),
        ("number_content", "message 0 content must be a string"),
        ("extra_field", "message 0 must be a dict of 'role' and 'content' only"),
        ("too_many", "65 messages, more than 64"),
        ("too_big", "the observation is 2097152 characters, more than the 65536"),
        ("nul", "the observation's message 0 contains a NUL character"),
        ("surrogate", "the observation's message 0 contains a lone surrogate"),
    ],
)
def test_a_result_breaking_the_contract_is_an_env_error(scripted, action, why):
    session = scripted()
    pid, _ = pids(session.reset([0, 1], [{"input": "a"}, {"input": "b"}]))
    bad, good = session.step([0, 1], [turn(action), turn("x")])
    assert bad.code == "env_error" and bad.done and bad.messages == []
    assert re.search(why, bad.error), bad.error
    assert good.messages[0]["content"] == f"x 1 {pid}"  # the child went on


def test_a_hanging_step_times_out_and_loses_the_childs_other_episodes(scripted, monkeypatch):
    monkeypatch.setenv("RLWB_ENV_TIMEOUT", "2")
    session = scripted()
    (pid, *_) = pids(session.reset([0, 1, 2], [{"input": "a"}] * 3))
    hung, waiting = session.step([0, 1], [turn("hang"), turn("x")])
    assert hung.code == "env_timeout" and "episode 0's step took longer than 2 s" in hung.error
    restarted = "env_error: the environment process was restarted after episode 0 timed out"
    assert waiting.error == restarted
    assert gone(pid)  # killed and reaped
    (later,) = session.step([2], [turn("x")])
    assert later.error == restarted
    (new_pid,) = pids(session.reset([3], [{"input": "d"}]))
    assert new_pid != pid
    (fresh,) = session.step([3], [turn("x")])
    assert fresh.messages[0]["content"] == f"x 1 {new_pid}"
    assert scripted().reset([0], [{"input": "a"}])[0].error is None  # a new session too


def test_the_time_limit_is_per_item_not_per_call(scripted):
    """Four 1 s steps in one call of a 3 s limit: each item has its own deadline."""
    session = scripted(timeout_s=3)
    session.reset([0, 1, 2, 3], [{"input": "a"}] * 4)
    results = session.step([0, 1, 2, 3], [turn("sleep")] * 4)
    assert [r.error for r in results] == [None] * 4


def test_a_memory_eating_step_fails_alone(scripted, monkeypatch):
    monkeypatch.setenv("RLWB_ENV_MEMORY", str(256 << 20))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    session = scripted()
    pid, _ = pids(session.reset([0, 1], [{"input": "a"}, {"input": "b"}]))
    eaten, other = session.step([0, 1], [turn("eat"), turn("x")])
    assert eaten.error.startswith("env_error: MemoryError")
    assert other.messages[0]["content"] == f"x 1 {pid}"  # the same child went on
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert after - before < EAT_BYTES // 8


def test_a_crashing_child_fails_its_episodes_and_the_next_reset_starts_afresh(scripted):
    session = scripted()
    pid, _, _ = pids(session.reset([0, 1, 2], [{"input": "a"}] * 3))
    crashed, waiting = session.step([0, 1], [turn("crash"), turn("x")])
    assert crashed.code == "env_error" and "exited (signal 9) during episode 0's step" in (
        crashed.error
    )
    restarted = "env_error: the environment process was restarted after episode 0 crashed"
    assert waiting.error == restarted and session.step([2], [turn("x")])[0].error == restarted
    assert gone(pid)
    (new_pid,) = pids(session.reset([2], [{"input": "c"}]))
    assert new_pid != pid and session.step([2], [turn("x")])[0].error is None


def test_a_reply_too_long_for_the_parent_ends_the_child(scripted, monkeypatch):
    """The parent reads at most `MAX_LINE_BYTES` a line whatever the child does (here the
    parent's bound is lowered under what the child allows itself)."""
    monkeypatch.setattr(env_sandbox, "MAX_LINE_BYTES", 4096)
    session = scripted()
    pid, _ = pids(session.reset([0, 1], [{"input": "a"}, {"input": "b"}]))
    (long,) = session.step([0], [turn("y" * 8000)])
    assert long.error.startswith("env_error: episode 0's step reply was unreadable: longer than")
    lost = "env_error: the environment process was restarted after episode 0 sent an unreadable"
    assert session.step([1], [turn("x")])[0].error.startswith(lost)
    assert gone(pid)


def test_an_environment_whose_import_hangs_is_refused(tmp_path, monkeypatch):
    (tmp_path / "rlwb_env_slow.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLWB_ENVIRONMENTS", "slow=rlwb_env_slow:Env")
    monkeypatch.setattr(env_sandbox, "START_TIMEOUT_S", 2.0)
    with pytest.raises(RuntimeError, match="did not start: it took longer than 2 s"):
        EnvironmentSession("slow")


def test_a_child_that_cannot_restart_fails_the_resets(tmp_path, monkeypatch):
    """The first child imports, then crashes; the second one's import fails."""
    started = tmp_path / "started"
    (tmp_path / "rlwb_env_once.py").write_text(
        "import os, signal\n"
        f"if os.path.exists({str(started)!r}):\n"
        "    raise ImportError('only once')\n"
        f"open({str(started)!r}, 'w').close()\n"
        "class Env:\n"
        "    tools = []\n"
        "    def reset(self, task):\n"
        "        return [{'role': 'user', 'content': 'hi'}]\n"
        "    def step(self, turn):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLWB_ENVIRONMENTS", "once=rlwb_env_once:Env")
    with EnvironmentSession("once") as session:
        session.reset([0], [{}])
        assert session.step([0], [turn("x")])[0].code == "env_error"
        refused = session.reset([0, 1], [{}, {}])
    assert [r.error for r in refused] == [
        "env_error: environment 'once' (rlwb_env_once:Env) did not start: ImportError: only once"
    ] * 2
