"""The repository reads as a product: no notes about how the work was organised in any tracked
text file, no stray scripts at the top level, and benchmark results kept small. CPU only; skipped
outside a git checkout (an sdist or an installed package has nothing to check)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# The words this test looks for are assembled from pieces, so that its own source does not
# carry them (a plain text search over the repository finds none anywhere).
SES, ISS, LNT, BRF, NEW, OUT = "ses" "sion", "is" "sue", "le" "nt", "bri" "ef", "new" "comer", "$" "OUT"
DEV = "dev" "ice"

#: Words about how the work was organised rather than what the code does. Each pattern is narrow
#: enough to leave ordinary English and code alone (a short pause, GPU time per call, a borrowed
#: reference, upstream bug numbers such as "frontend #1571").
PROCESS_WORDS: dict[str, re.Pattern[str]] = {
    "numbered work period": re.compile(
        rf"\b{SES}(?:s|'s)?[ -]?#?\d+"
        rf"|\b(?:this|that|the|each|every|a|one|next|last|earlier|later|previous|GPU|device|work)(?:'s)? {SES}s?\b"
        rf"|\b{SES}'s\b"
        rf"|\b(?:gpu|cp)_{SES}\b"
        r"|\bs\d{1,2}-(?:h[12]00|full|suite|targets|quick)"
        r"|\bwork periods?\b",
        re.IGNORECASE),
    "dated benchmark folder": re.compile(r"\bbenchmarks/\d{4}-\d{2}-\d{2}"),
    NEW: re.compile(rf"\b{NEW}s?\b", re.IGNORECASE),
    "the task text": re.compile(
        rf"\b{BRF}'s\b"
        rf"|\b(?:the|this|that|our|my|your|per) {BRF}\b(?!ly| (?:pause|moment|spell|delay|wait|window|interval|time|"
        r"period|look|note|summary|description|while|stall|burst|overview|history|explanation|sleep|spin|run|test))"
        rf"|\b{BRF} (?:says|said|asks|asked|wants|requires|required)\b",
        re.IGNORECASE),
    f"{ISS} number": re.compile(rf"\b{ISS}s? ?#?\d+|\bthe {ISS}'s\b", re.IGNORECASE),
    "bare #number": re.compile(r"(?<![\w/&#-])#\d{1,5}\b"),
    "loaned machine": re.compile(
        rf"\b{LNT}\b|\bborrowed (?:machines?|GPUs?|hosts?|H[12]00s?|nodes?|cards?|boxes?)\b", re.IGNORECASE),
    "device-time budget": re.compile(
        r"\bdevice[- ]time (?:left|budget|remaining|allowance)\b"
        r"|\b(?:spend|spends|spent|spending|save|saves|saved|waste|wastes|wasted|cost|costs|costing) (?:\w+ ){0,3}"
        r"of device[- ]time\b"
        r"|\bdevice[- ]tool\b",
        re.IGNORECASE),
    OUT: re.compile(rf"{re.escape(OUT)}\b|\$\{{{OUT[1:]}\b"),
}

#: An issue number of another project is a citation, not a note: "frontend #1571".
UPSTREAM_BEFORE_HASH = re.compile(
    r"(?:frontend|cudnn-frontend|cudnn_frontend|pytorch|torch|transformers|TransformerEngine|triton|flash-attention|"
    r"nccl|CUDA|cuDNN) $", re.IGNORECASE)

#: Python files allowed at the top level (packaging and test-runner conventions).
TOP_LEVEL_PY = {"setup.py", "conftest.py", "noxfile.py"}

BENCHMARKS_MAX_BYTES = 2 * 1024 * 1024


def _files() -> list[str]:
    """Tracked files plus new ones git does not ignore, that exist in the work tree."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=REPO, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"git failed: {e}")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != REPO:
        pytest.skip("not a git checkout of this repository")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True, timeout=60).stdout  # fmt: skip
    names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
    return [n for n in names if (REPO / n).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _process_word_hits(name: str, text: str) -> list[str]:
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, pattern in PROCESS_WORDS.items():
            for m in pattern.finditer(line):
                if what == "bare #number" and UPSTREAM_BEFORE_HASH.search(line[: m.start()]):
                    continue
                hits.append(f"{name}:{lineno}: {what}: {m.group(0)!r} in {line.strip()[:160]!r}")
    return hits


@pytest.mark.parametrize("line, flagged", [
    (f"measured in {SES} 18 on an H100", True),
    (f"{SES.title()} 17 took 0.6 us off", True),
    (f"the {SES}-16 targets run", True),
    ("see benchmarks/2026-11-26-s18-h100-full/", True),
    (f"run on a {LNT} H100 host", True),
    (f"({ISS} 15, item 2)", True),
    ("fixed in #36", True),
    (f"a {NEW}'s first hour", True),
    (f"the {BRF}'s clear-cut case", True),
    (f"spent 3 minutes of {DEV} time", True),
    (f"logs under {OUT}", True),
    (f"a {BRF} pause between rounds", False),
    (f"{DEV} time per call with CUDA events", False),
    ("a borrowed reference to the tensor", False),
    ("cuDNN SDPA needs 16-byte aligned strides (frontend #1571)", False),
    ("fixed upstream (pytorch/pytorch#190348)", False),
    ("case s1-training with llama_h32_s16k", False),
])  # fmt: skip
def test_the_process_word_patterns(line: str, flagged: bool) -> None:
    assert bool(_process_word_hits("x", line)) is flagged, _process_word_hits("x", line)


def test_no_tracked_text_file_carries_process_words() -> None:
    hits = []
    for name in _files():
        if name == THIS:
            continue
        text = _text(REPO / name)
        if text is not None:
            hits += _process_word_hits(name, text)
    assert not hits, f"{len(hits)} notes about the work process:\n" + "\n".join(hits)


def test_no_stray_python_files_at_the_top_level() -> None:
    stray = [n for n in _files() if "/" not in n and n.endswith(".py") and n not in TOP_LEVEL_PY]
    assert not stray, f"top-level scripts (move them under tools/ or examples/, or delete them): {stray}"


def test_benchmark_results_stay_small() -> None:
    files = [n for n in _files() if n.startswith("benchmarks/")]
    size = sum((REPO / n).stat().st_size for n in files)
    assert size <= BENCHMARKS_MAX_BYTES, (
        f"benchmarks/ holds {size / 2**20:.2f} MiB in {len(files)} files (at most 2 MiB: the current run per GPU "
        "kind, see benchmarks/README.md)")
