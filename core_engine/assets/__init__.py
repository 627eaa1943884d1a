"""Files shipped with the package: the demo policies' checkpoints (`SHIPPED_POLICY`, built by
`core_engine.rl.demo_policy`; `CALCULATOR_POLICY`, built by `core_engine.rl.calculator_policy`).
Imports nothing heavy: the job checks read them without torch."""

from pathlib import Path

SHIPPED_POLICY = Path(__file__).resolve().parent / "demo-policy"
CALCULATOR_POLICY = Path(__file__).resolve().parent / "calculator-policy"
