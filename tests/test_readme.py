"""The README is a short front door: at most 1,000 words, one click from the algorithm, results and verl pages."""

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_is_at_most_a_thousand_words():
    assert len(README.read_text().split()) <= 1000


def test_readme_links_the_algorithm_results_and_verl_pages():
    text = README.read_text()
    for page in ("docs/algorithm.md", "docs/results.md", "docs/verl.md"):
        assert f"]({page})" in text, page
