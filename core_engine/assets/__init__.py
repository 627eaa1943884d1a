"""Files shipped with the package: the demo policies' checkpoints (`SHIPPED_POLICY`,
`CALCULATOR_POLICY`, `R1_POLICY`), the names a job or a command line gives them
(`SHIPPED_POLICIES`, the one place a name is resolved) and the modules that rebuild them
(`BUILDERS`, in `core_engine.policies`). Imports nothing heavy:
the job checks read them without torch."""

from pathlib import Path

SHIPPED_POLICY = Path(__file__).resolve().parent / "demo-policy"
CALCULATOR_POLICY = Path(__file__).resolve().parent / "calculator-policy"
R1_POLICY = Path(__file__).resolve().parent / "r1-policy"
DEMO_MODEL = "demo"  # 3-digit addition (`core_engine.policies.demo`)
CALCULATOR_MODEL = "calculator-demo"  # word problems with the calculator tool
R1_MODEL = "r1-demo"  # word problems in the <think>/<answer> template (the R1 recipe)
SHIPPED_POLICIES = {
    DEMO_MODEL: SHIPPED_POLICY,
    CALCULATOR_MODEL: CALCULATOR_POLICY,
    R1_MODEL: R1_POLICY,
}
# The module that rebuilds each (`python -m ...`; `core_engine.policies`).
BUILDERS = {
    DEMO_MODEL: "core_engine.policies.demo",
    CALCULATOR_MODEL: "core_engine.policies.calculator",
    R1_MODEL: "core_engine.policies.r1",
}


def shipped_checkpoint(model: str) -> str:
    """The checkpoint directory of a shipped policy's name (`SHIPPED_POLICIES`); any other
    model as it is."""
    path = SHIPPED_POLICIES.get(model)
    return model if path is None else str(path)
