"""A checkpoint's chat template rendered in a child process: the template is code anyone can
publish (a Hub id makes any public repository a checkpoint), and a Jinja sandbox bounds
neither time nor memory (``{{ 'x' * 4*10**9 }}``, nested ``range`` loops).

The child (``python -m core_engine.rl.template_sandbox MEMORY``) limits its address space to
``RLWB_TEMPLATE_MEMORY`` bytes (`template_memory_bytes`, ``RLIMIT_AS``) before it imports
`transformers`' template renderer (no torch), reads the template, the tokenizer's special
tokens and then one conversation a line, and answers one JSON line each: the text
``apply_chat_template(..., add_generation_prompt=True)`` renders, or why not. The caller waits
at most ``RLWB_TEMPLATE_TIMEOUT`` seconds (`template_timeout_s`) for each answer, polling
``cancelled`` meanwhile; a text over `MAX_RENDERED_CHARS`, a `MemoryError`, a deadline passed
or a crash is a `TemplateBoundError` naming the bound, and the child is killed.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from core_engine.rl.parent_watch import exit_with_parent
from core_engine.rl.registry import limit_address_space

DEFAULT_TIMEOUT_S = 10.0  # per prompt
DEFAULT_MEMORY_BYTES = 1 << 30  # the child's own ~150 MiB (Python, jinja2), then the template's
MAX_RENDERED_CHARS = 1 << 21  # a prompt's text: ~500k tokens, past any context served
START_TIMEOUT_S = 300.0  # the child's imports, on a machine that may be busy
CANCEL_POLL_S = 0.2
READ_BYTES = 1 << 16
MAX_ANSWER_BYTES = 6 * MAX_RENDERED_CHARS + 64  # a text at its cap, JSON-escaped (\uXXXX)
MIB = 1 << 20
Conversation = Sequence[Mapping[str, Any]]


class TemplateBoundError(ValueError):
    """A chat template that took too long, needed too much memory or rendered too much."""


class RenderCancelled(Exception):
    """``cancelled`` said so while a template was being rendered."""


def template_timeout_s() -> float:
    """``RLWB_TEMPLATE_TIMEOUT`` (seconds per prompt), default `DEFAULT_TIMEOUT_S`."""
    return float(os.environ.get("RLWB_TEMPLATE_TIMEOUT") or DEFAULT_TIMEOUT_S)


def template_memory_bytes() -> int:
    """``RLWB_TEMPLATE_MEMORY`` (bytes of address space), default `DEFAULT_MEMORY_BYTES`."""
    return int(os.environ.get("RLWB_TEMPLATE_MEMORY") or DEFAULT_MEMORY_BYTES)


def render_prompts(
    tokenizer: Any,
    conversations: Iterable[Conversation],
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[str]:
    """The generation prompt of each conversation as ``tokenizer``'s chat template renders it
    (`core_engine.prompts.render_prompt`, without tools), rendered in the child: a
    `TemplateBoundError` past a bound, `RenderCancelled` once ``cancelled()``, and the
    template's own error (a `ValueError`) when it refuses a conversation."""
    header = {"template": tokenizer.get_chat_template(), "tokens": tokenizer.special_tokens_map}
    memory, timeout = template_memory_bytes(), template_timeout_s()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", __name__, str(memory)]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
    child = subprocess.Popen(command, env=env, **pipes)
    feeder = threading.Thread(target=_feed, args=(child.stdin, header, conversations), daemon=True)
    feeder.start()
    answers = _Answers(child, cancelled or (lambda: False))
    try:
        answers.next(START_TIMEOUT_S, memory)  # ready: its imports are done
        for answer in iter(lambda: answers.next(timeout, memory), None):
            if "error" in answer:
                raise ValueError(f"the model's chat template fails: {answer['error']}")
            yield answer["text"]
    finally:
        child.kill()
        child.wait()
        feeder.join()  # its next write fails, and it closes the child's stdin
        child.stdout.close()


def _feed(pipe: Any, header: dict[str, Any], conversations: Iterable[Conversation]) -> None:
    """The child's input: the header, one conversation a line, then end of file."""
    try:
        with pipe:
            pipe.write(json.dumps(header).encode() + b"\n")
            for conversation in conversations:
                pipe.write(json.dumps([dict(m) for m in conversation]).encode() + b"\n")
    except (OSError, ValueError):
        pass  # the child ended, or was killed and its pipe closed: its answers say why


class _Answers:
    """The child's JSON lines, each awaited for a bounded time, the cancel polled."""

    def __init__(self, child: subprocess.Popen, cancelled: Callable[[], bool]) -> None:
        self.child, self.cancelled, self.buffer = child, cancelled, b""
        self.fd = child.stdout.fileno()

    def next(self, timeout: float, memory: int) -> dict[str, Any] | None:
        """The next answer; None once the child has answered every conversation."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if self.cancelled():
                raise RenderCancelled("cancelled while the chat template was rendered")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TemplateBoundError(
                    f"the model's chat template took more than {timeout:g} s to render a "
                    "prompt (RLWB_TEMPLATE_TIMEOUT)"
                )
            if select.select([self.fd], [], [], min(left, CANCEL_POLL_S))[0]:
                chunk = os.read(self.fd, READ_BYTES)
                if not chunk:
                    return self._ended(memory)
                self.buffer += chunk
                if len(self.buffer) > MAX_ANSWER_BYTES:
                    raise TemplateBoundError(_too_long())
        line, _, self.buffer = self.buffer.partition(b"\n")
        answer = json.loads(line)
        if answer.get("memory"):
            raise TemplateBoundError(_out_of_memory(memory))
        if answer.get("too_long"):
            raise TemplateBoundError(_too_long())
        return answer

    def _ended(self, memory: int) -> None:
        status = self.child.wait()
        if status == 0:
            return None
        raise TemplateBoundError(_out_of_memory(memory) + f", or it crashed (exit code {status})")


def _out_of_memory(memory: int) -> str:
    return (
        f"the model's chat template needed more than {memory // MIB:,} MiB of memory to "
        "render a prompt (RLWB_TEMPLATE_MEMORY)"
    )


def _too_long() -> str:
    return (
        f"the model's chat template renders a prompt of more than {MAX_RENDERED_CHARS:,} characters"
    )


def _serve(memory_bytes: int) -> None:
    """The child: bounded, ``ready``, then one answer per conversation line on stdin; it
    ends itself if its parent dies (a template may never end)."""
    limit_address_space(memory_bytes)
    exit_with_parent()
    from transformers.utils.chat_template_utils import (
        _normalize_chat_messages,
        render_jinja_template,
    )

    header = json.loads(sys.stdin.readline())
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            rendered, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(json.loads(line))],
                chat_template=header["template"],
                add_generation_prompt=True,
                **header["tokens"],
            )
            text = rendered[0]
            answer = {"too_long": True} if len(text) > MAX_RENDERED_CHARS else {"text": text}
        except MemoryError:
            answer = {"memory": True}
        except Exception as exc:  # the template's own refusal (raise_exception, a bad key)
            answer = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
