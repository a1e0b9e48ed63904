"""The project's text speaks of the software, not of how it was made.

A reader of a clone cannot know what "the thirteenth session", "issue 12" or "item 3" was: a docstring says what
the code does and why, a test what property it checks, a measurement its date, machine, command and commit. This
test scans the text files of README.md, CHANGELOG.md, docs/, src/, tests/, scripts/, benchmarks/ and results/ and
fails naming ``file:line`` for each such reference. The patterns are narrow on purpose: an environment "session"
(WebShop's URL parameter, the rollout engine's episode sessions) or a PR number in a third-party URL is not history.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "CHANGELOG.md")
FOLDERS = ("docs", "src", "tests", "scripts", "benchmarks", "results")
TEXT_SUFFIXES = {".md", ".py", ".sh", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".cpp", ".h", ".hpp", ".c",
                 ".json", ".rst", ".log", ".summary", ".out", ".done", ""}
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".git"}
MAX_BYTES = 5_000_000  # larger files are data written by the code, not prose
SELF = Path(__file__).resolve()  # this file quotes the patterns it looks for

_ORDINAL = (r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
            r"twenty-(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)|thirtieth|\d+(?:st|nd|rd|th)")
PATTERNS: dict[str, re.Pattern[str]] = {
    # "the thirteenth session", "sixth and seventh sessions", "the 12th session"
    "a numbered round of work": re.compile(rf"\b(?:{_ORDINAL})(?:[- ](?:and|to|or)[- ](?:{_ORDINAL}))?\s+sessions?\b",
                                           re.IGNORECASE),
    # "session 24", "sessions 6-9"
    "a numbered session": re.compile(r"\bsessions?\s+\d+\b", re.IGNORECASE),
    # "this session", "the previous session", "the session's start", "between sessions"
    "a round of work": re.compile(r"\b(?:this|that|previous|next|earlier|later|last|one|same|helper)\s+sessions?\b"
                                  r"|\bsession'?s?\s+(?:start|end|closing)\b|\bbetween sessions\b", re.IGNORECASE),
    # "issue 12", "issues 11 and 14", "issue #3"
    "an issue number": re.compile(r"\bissues?\s+#?\d+\b", re.IGNORECASE),
    # "item 3", "items 1-4"
    "an item number": re.compile(r"\bitems?\s+#?\d+\b", re.IGNORECASE),
    # "(#12)", "PR #12", "fixes #12"
    "an issue or PR reference": re.compile(r"(?:\b(?:PR|pull request|fix(?:es|ed)?|close[sd]?|see)\s+#\d+\b)|\(#\d+\)",
                                           re.IGNORECASE),
    # "review fixes", "after the review fix"
    "a review round": re.compile(r"\breview[- ]fix(?:es)?\b|\breview rounds?\b", re.IGNORECASE),
}


def text_files() -> list[Path]:
    out = [ROOT / f for f in FILES if (ROOT / f).is_file()]
    for folder in FOLDERS:
        base = ROOT / folder
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts):
                continue
            if p.is_file() and p.resolve() != SELF and p.suffix in TEXT_SUFFIXES and p.stat().st_size <= MAX_BYTES:
                out.append(p)
    return out


def history_references(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, matched text) of every reference to how the project was made in ``text``."""
    hits = []
    for n, line in enumerate(text.splitlines(), start=1):
        for kind, rx in PATTERNS.items():
            m = rx.search(line)
            if m:
                hits.append((n, kind, m.group(0)))
    return hits


def test_patterns_flag_history_and_spare_ordinary_words():
    flagged = ["measured in the thirteenth session", "the sixth and seventh sessions", "in session 24", "see issue 12",
               "issue #3", "item 3 is met", "items 1 and 2", "fixed in (#41)", "after the review fixes",
               "at the session's start", "this session's runs", "the twenty-fourth session's AVX2 tiles"]
    spared = ["routes /<session>/<asin>", "one engine session per episode", "drop finished sessions",
              "env.reset(session=goal)", "a fresh one-turn session per episode and turn", "item_page/<session>",
              "the first turn of an episode", "3 rounds, fastest of 7", "color #1f77b4", "list item"]
    for s in flagged:
        assert history_references(s), s
    for s in spared:
        assert not history_references(s), s


def test_no_file_speaks_of_how_the_project_was_made():
    hits = []
    for path in text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, kind, found in history_references(text):
            hits.append(f"{path.relative_to(ROOT)}:{n}: {kind}: {found!r}")
    assert not hits, ("text that refers to how the project was made (say what the code does, or name a "
                      "measurement's date, machine, command and commit instead):\n" + "\n".join(hits))


# The project carries its own documentation: nothing points at design notes kept outside the repository, and every
# page of docs/ that a file names exists (a renamed page leaves no dangling reference behind).
OUTSIDE = re.compile(r"\bshared/(?:design|reference)\b|(?<![\w/.-])(?:interq-spec|quant-spec|quant_numerics|practical|style|envs)\.md\b")
DOC_PAGE = re.compile(r"\bdocs/([A-Za-z0-9_.-]+\.md)\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_file_points_outside_the_repository_or_to_a_missing_page():
    hits = []
    for path in text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), start=1):
            m = OUTSIDE.search(line)
            if m:
                hits.append(f"{path.relative_to(ROOT)}:{n}: points outside the repository: {m.group(0)!r}")
            for page in DOC_PAGE.findall(line):
                if not (ROOT / "docs" / page).is_file():
                    hits.append(f"{path.relative_to(ROOT)}:{n}: names a missing page: docs/{page}")
            if path.suffix == ".md" and (path.parts[len(ROOT.parts)] != "results" or path.name == "README.md"):
                for target in MD_LINK.findall(line):
                    if "://" in target or target.startswith("mailto:"):
                        continue
                    if not (path.parent / target).exists():
                        hits.append(f"{path.relative_to(ROOT)}:{n}: a link to a missing file: {target}")
    assert not hits, "\n".join(hits)
