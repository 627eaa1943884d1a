"""Files shipped with the package: the demo policies' checkpoints (`SHIPPED_POLICY`, built by
`core_engine.policies.demo`; `CALCULATOR_POLICY`, built by `core_engine.policies.calculator`)
and the names a job or a command line gives them (`SHIPPED_POLICIES`). Imports nothing heavy:
the job checks read them without torch."""

from pathlib import Path

SHIPPED_POLICY = Path(__file__).resolve().parent / "demo-policy"
CALCULATOR_POLICY = Path(__file__).resolve().parent / "calculator-policy"
DEMO_MODEL = "demo"  # 3-digit addition (`core_engine.policies.demo`)
CALCULATOR_MODEL = "calculator-demo"  # word problems with the calculator tool
SHIPPED_POLICIES = {DEMO_MODEL: SHIPPED_POLICY, CALCULATOR_MODEL: CALCULATOR_POLICY}
# The module that rebuilds each (`python -m ...`; `core_engine.policies`).
BUILDERS = {
    DEMO_MODEL: "core_engine.policies.demo",
    CALCULATOR_MODEL: "core_engine.policies.calculator",
}


def shipped_checkpoint(model: str) -> str:
    """The checkpoint directory of a shipped policy's name (`SHIPPED_POLICIES`); any other
    model as it is."""
    path = SHIPPED_POLICIES.get(model)
    return model if path is None else str(path)
