"""Files shipped with the package: the demo policy's checkpoint (`SHIPPED_POLICY`, built by
`core_engine.rl.demo_policy`). Imports nothing heavy: the job checks read it without torch."""

from pathlib import Path

SHIPPED_POLICY = Path(__file__).resolve().parent / "demo-policy"
