import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_db_imports_no_other_package_and_no_torch() -> None:
    code = (
        "import sys, db, db.__main__, db.migrate, db.repository\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'torch', 'core_engine', 'workers', 'ui', 'transformers', 'numpy'})\n"
        "print(bad)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
