"""The README is for users and the docs hold the rest: the README's size and first commands, links that resolve,
and measured results that cite files which exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
RESULT_FILE = re.compile(r"(?<![\w.{*-])([A-Za-z0-9][\w.-]*\.json)(?!l)")


def _outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", _outside_code(page.read_text()), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_readme_opens_with_the_two_commands_and_stays_short() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 400
    first_block = re.search(r"^```\w*\n(.*?)^```", text, flags=re.S | re.M)
    assert first_block is not None
    lines = first_block.group(1).splitlines()
    assert [line.split()[0] for line in lines] == ["scripts/demo.sh", "scripts/test.sh"]
    assert all("#" in line for line in lines)  # each with its one-line comment
    for section in ("The demo", "A study", "The service", "The best-config registry", "Deployment", "Workloads",
                    "Measured", "Tests"):  # fmt: skip
        assert re.search(rf"^## {section}", text, flags=re.M), section


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(_outside_code(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_measured_results_cite_files_in_bench_results() -> None:
    results = ROOT / "bench" / "results"
    pages = sorted((ROOT / "docs" / "results").glob("*.md"))
    assert {p.stem for p in pages} >= {"gemm", "attention", "quant", "decode", "train", "collectives", "search"}
    readme = (ROOT / "README.md").read_text()
    measured = readme[readme.index("## Measured") : readme.index("## Tests")]
    missing = []
    for name, text in [(p.name, p.read_text()) for p in pages] + [("README.md", measured)]:
        cited = set(RESULT_FILE.findall(text))
        assert cited or name == "norms.md" or name == "README.md", name
        missing += [f"{name}: {c}" for c in sorted(cited) if not (results / c).exists() and not (ROOT / c).exists()]
    assert not missing, missing
