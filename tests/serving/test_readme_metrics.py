"""The README says what perfcast predicts and how its serving metrics are defined."""

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_says_what_it_predicts_and_defines_the_metrics():
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "serving and training steps" in text
    assert "## Metric definitions" in README.read_text(encoding="utf-8")
    assert "it includes queueing" in text            # TTFT
    assert "it excludes the first token" in text     # TPOT
