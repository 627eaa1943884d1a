"""A hang guard for tests of code that must not block: the action runs on a daemon thread, so
a regression fails the test instead of hanging the suite."""

import threading

GUARD_S = 120.0


def outcome_within(action, guard_s: float = GUARD_S):
    """What `action()` raised (None: it returned); fails the test if it is still running
    after `guard_s`."""
    outcome = []

    def run():
        try:
            action()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(guard_s)
    assert outcome, f"still blocked after {guard_s:g} s"
    return outcome[0]
