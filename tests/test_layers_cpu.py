"""The package's layers and the absence of import cycles, as import-linter checks them (the
contracts in pyproject.toml: every module in its layer, imports only downwards, no cycle); imports
inside functions only of optional modules; CUDA timing events made in te_cudnn.timing only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

importlinter_cli = pytest.importorskip("importlinter.cli")

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(ROOT)
    code = importlinter_cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "BROKEN" not in out and out.count("KEPT") == 2, out


# ----------------------------------------------------------------------------- imports inside functions
#: Modules te_cudnn may import inside a function: optional dependencies (the ``hf`` and ``bench``
#: extras), and the cuDNN frontend, loaded once by te_cudnn.runtime.cudnn_module. Everything else
#: (torch, the standard library, te_cudnn's own modules) is imported at the top of the module.
LOCAL_IMPORTS_ALLOWED = ("transformers", "matplotlib", "cudnn", "torch._dynamo", "torch.nn.attention.flex_attention")
MAX_LOCAL_IMPORTS = 10


def _local_imports() -> list[tuple[str, str]]:
    """``(where, module)`` for every import statement inside a function of te_cudnn (each counted
    once, also in nested functions)."""
    found, seen = [], set()
    for path in sorted((ROOT / "te_cudnn").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                    seen.add(id(node))
                    where = f"{path.relative_to(ROOT).as_posix()}:{node.lineno} ({fn.name})"
                    if isinstance(node, ast.Import):
                        found += [(where, alias.name) for alias in node.names]
                    else:
                        found.append((where, "." * node.level + (node.module or "")))
    return found


def test_imports_inside_functions_are_few_and_of_optional_modules() -> None:
    local = _local_imports()
    others = [f"{where}: {module}" for where, module in local
              if not any(module == m or module.startswith(m + ".") for m in LOCAL_IMPORTS_ALLOWED)]  # fmt: skip
    assert not others, "import these at the top of the module:\n" + "\n".join(others)
    assert len(local) <= MAX_LOCAL_IMPORTS, local


# ----------------------------------------------------------------------------- one timing module
def test_cuda_timing_events_are_made_in_te_cudnn_timing_only() -> None:
    """te_cudnn.timing is the one place that makes timing events; the package, the examples and
    the tools time through it (the tests may make their own)."""
    made = re.compile(r"\bEvent\([^)]*enable_timing")
    timing = ROOT / "te_cudnn" / "timing.py"
    found = [f"{path.relative_to(ROOT).as_posix()}:{i}" for folder in ("te_cudnn", "examples", "tools")
             for path in sorted((ROOT / folder).rglob("*.py")) if path != timing
             for i, line in enumerate(path.read_text().splitlines(), 1) if made.search(line)]  # fmt: skip
    assert not found, found
    assert made.search(timing.read_text())
