"""The project's files speak about the product, never about the project's own history: no work sessions, no
issue numbers, no dated work notes. Old figures and notes live in git history, where readers of the product
never meet them. "Session" also means a process session (setsid, `gpulab.proc.session`) and pytest's session
scope; the patterns name only the history meanings, and the examples below hold them to that."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_ORDINAL = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth"
# 11-26, never 2026-11-26, and never a range of notebooks (02-04, both under 10)
_DATE = r"(?<![\w.\-/])(?!0\d-0\d)(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?![\w\-/])"
_NOT_A_RANGE = r"(?!\s*(?:%|x\b|[mun]?s\b|min\b|[kMG]i?B\b|ops?\b|runs?\b|cases?\b|steps?\b|tokens?\b))"

HISTORY = {
    "a work session": re.compile(
        rf"\b(?:{_ORDINAL}|(?<!of )this|next|previous|last|earlier|later|future)\s+sessions?\b"
        r"(?!'s\s+(?:children|processes|leader|members|id|group)|\s+(?:leader|id|group)\b)", re.I),
    "a work session's progress": re.compile(
        r"\bsession's\s+(?:start|code|final|goals?|device time|time limit|changes?)\b", re.I),
    "a numbered session": re.compile(r"\bsessions?\s+#?\d+\b", re.I),
    "a work session's bounds": re.compile(r"\b(?:the|that)\s+session\s+(?:before|after)\b|\bsession\s+(?:start|end)\b", re.I),
    "an issue number": re.compile(r"(?<![\w#/-])issues?\s+#?\d+\b", re.I),
    "an issue reference": re.compile(r"(?:\(|\b(?:see|fixes|fixed in|closes|closed by|per)\s+)#\d+\b", re.I),
    "a dated work note": re.compile(
        rf"(?:\(|,\s|\b(?:until|since|on|before|after|dated|marked|as of)\s+){_DATE}{_NOT_A_RANGE}"
        rf"|{_DATE}(?=[:),](?!\d))"),
}

HISTORY_PHRASES = [
    "### Set-up and the chain, 11-26 (sixth session): where issue 20's goals stand",
    "Measured on the H100 in the next session (11-25, third; one H100 of a two-GPU host)",
    "not measured on the H100 yet: this session's device time ran out",
    "132 s at the session's start",
    "97 s with the session's final code",
    "## machine, 11-26: 11 min 35 s with 3 workers",
    "# torch._dynamo imported by the recorder before the program, as until 11-25 (now: when the program does)",
    "the 2-core machine, 11-26), handed out first",
    '"""Fast and light by default (issue 20): a run folder keeps what a reader needs',
    "Figures dated 2026-11-23 unless marked 11-22",
    "a later session will measure it",
    "the fix for this (see #20)",
    "done in session 6",
    "| before (session start, ba78fb1) | after |",
    "170 s (233 s the session before)",
    "the code before this\nsession in a worktree",
    "Before this session's changes, the chain never left 02",
    "Not measured on the H100 this session (no device time was left)",
]

PRODUCT_PHRASES = [
    "start_new_session=True",
    "os.setsid()",
    "with proc.session('gpulab run') as s:",
    "its own session and process group, writes its output to files",
    "the guard sidecar lives as long as the test session",
    "at the end of the session none may be alive",
    "def pytest_sessionfinish(session, exitstatus):",
    "def pytest_sessionstart(session):",
    '@pytest.fixture(scope="session")',
    "children of the same session are stopped together",
    "the children of this session are stopped together",
    "this session's children get SIGTERM, then SIGKILL",
    "this session leader's process group",
    "at the session's end no process may be alive",
    "a session leader's descendants",
    "`aten.mm.default` #12 at `spin_then_sync.py:13`",
    "`aten._softmax.default` #13, the first recorded op queued behind it",
    "pytorch#133053: when a job hangs on synchronize() it is rarely due to that call",
    "intermittent hangs at ~2% of launches (flashinfer#3700)",
    "ladder 5/20 (Wilson 11-47%, holds 25%)",
    "| 2026-11-25 | H100 | 91 s |",
    "the same variant's blocks swing between 12-25 us per op",
    "a stall window (10-20 s) is enough",
    "a stall window (10-20 s)",
    "every watched child (notebooks 02-04)",
    "the 03-05 notebooks: ladder, fixes, oracle",
    "(01-06):",
    "an op of 10-12 steps",
    "python benchmarks/bench_fresh_clone.py --out /tmp/fc --revs 7bcf310,HEAD",
]


def located(text: str) -> list[tuple[int, str]]:
    """(offset, 'kind: phrase') of what in `text` speaks of the project's history."""
    return [(m.start(), f"{kind}: {m.group(0)!r}") for kind, rx in HISTORY.items() for m in rx.finditer(text)]


def history(text: str) -> list[str]:
    return [h for _, h in located(text)]


@pytest.mark.parametrize("phrase", HISTORY_PHRASES)
def test_history_phrasings_are_found(phrase):
    assert history(phrase), phrase


@pytest.mark.parametrize("phrase", PRODUCT_PHRASES)
def test_product_phrasings_are_left_alone(phrase):
    assert not history(phrase), history(phrase)


TEXT = {".md", ".py", ".ipynb", ".yaml", ".yml", ".sh", ".toml", ".c", ".h", ".cpp", ".cc", ".cu", ".hpp", ".cfg",
        ".ini", ".txt", ".html", ".css", ".j2", ".tpl"}
NAMED = {"Makefile", "run"}  # run: .ci/run


def project_files() -> list[Path]:
    """Every file a user or a contributor reads: tracked, or new and not ignored (this file's examples aside)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    files = [ROOT / p for p in out.split("\0") if p]
    return [f for f in files if f.is_file() and (f.suffix in TEXT or f.name in NAMED)
            and f != Path(__file__).resolve()]


def test_project_files_are_found():
    names = {f.relative_to(ROOT).as_posix() for f in project_files()}
    assert {"README.md", "Makefile", ".ci/run", "pyproject.toml", "docs/architecture.md",
            "notebooks/01_environment.ipynb", "lib/gpulab/proc.py", "scripts/setup.sh"} <= names


def test_no_project_history_in_the_project():
    found = []
    for f in project_files():
        text = f.read_text(errors="replace")   # whole, as a phrase may wrap onto the next line
        found += [f"{f.relative_to(ROOT)}:{text.count(chr(10), 0, at) + 1}: {h}" for at, h in located(text)]
    assert not found, "history belongs in git, not in the product:\n" + "\n".join(found)


def test_the_package_readme_is_the_user_readme():
    """PKG-INFO carries pyproject's readme: it must be the README users read, whatever it holds."""
    import tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["readme"] == "README.md"
    readme = (ROOT / "README.md").read_text()
    assert not history(readme)
    assert len(readme.splitlines()) <= 320, "the README is for users; figures go to docs/performance.md"
