"""Procedurally generated multi-step word problems in GSM8K's format: a question and a worked
answer whose last line is ``#### N`` (an integer). Seeded, so a sample file can be regenerated
exactly (`tests/data/word_problems_sample.jsonl`)."""

from __future__ import annotations

import random

NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia")
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards")


def _add(rng: random.Random, name: str, item: str, total: int) -> tuple[str, str, int]:
    n = rng.randint(2, 30)
    return (
        f"Then {name} buys {n} more {item}.",
        f"{total} + {n} = <<{total}+{n}={total + n}>>{total + n}",
        total + n,
    )


def _give(rng: random.Random, name: str, item: str, total: int) -> tuple[str, str, int]:
    if total < 3:  # nothing sensible to give away
        return _add(rng, name, item, total)
    n = rng.randint(1, total - 1)
    left = total - n
    return (
        f"{name} gives {n} {item} to a friend.",
        f"{total} - {n} = <<{total}-{n}={left}>>{left}",
        left,
    )


def _gifts(rng: random.Random, name: str, item: str, total: int) -> tuple[str, str, int]:
    friends, each = rng.randint(2, 6), rng.randint(2, 9)
    got = friends * each
    return (
        f"Each of {name}'s {friends} friends gives {name} {each} {item}.",
        f"The friends give {friends} x {each} = <<{friends}*{each}={got}>>{got} {item}, so "
        f"{name} has {total} + {got} = <<{total}+{got}={total + got}>>{total + got}",
        total + got,
    )


STEPS = (_add, _give, _gifts)


def word_problem(rng: random.Random) -> dict[str, str]:
    """One problem of 2 to 4 steps: a starting quantity, changes to it, and either the count
    left or the money made selling everything at a price (a rate)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(5, 40)
    question, worked = [f"{name} has {total} {item}."], []
    steps = rng.randint(2, 4)
    sell = rng.random() < 0.5
    for _ in range(steps - 1 if sell else steps):
        sentence, line, total = rng.choice(STEPS)(rng, name, item, total)
        question.append(sentence)
        worked.append(line + ".")
    if sell:
        price = rng.randint(2, 9)
        question.append(f"{name} sells all of the {item} for ${price} each.")
        question.append(f"How many dollars does {name} make?")
        worked.append(f"{total} x ${price} = $<<{total}*{price}={total * price}>>{total * price}.")
        total *= price
    else:
        question.append(f"How many {item} does {name} have now?")
    return {"question": " ".join(question), "answer": "\n".join([*worked, f"#### {total}"])}


def gsm8k_records(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` problems as GSM8K rows (``question``, ``answer``)."""
    rng = random.Random(seed)
    return [word_problem(rng) for _ in range(count)]


def word_problem_records(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` problems as prompt records: the question, and the final number as reference."""
    return [
        {"instruction": "", "input": row["question"], "output": row["answer"].rsplit("#### ", 1)[1]}
        for row in gsm8k_records(count, seed)
    ]
