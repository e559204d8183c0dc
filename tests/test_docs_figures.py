"""Every measurement in the docs says where and on what it was measured: beside a table of figures, and
beside a sentence of prose that states a measured figure (a number with a unit of speed, time, memory or
nats, said to be measured, taken, or on a named CPU), the paragraph itself or the one just before or after
it reads `Measured on <CPU>, <YYYY-MM-DD>, commit <sha>`, and the commit is one of this repository's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", ROOT / "deploy" / "README.md", ROOT / "service" / "openai" / "CONFORMANCE.md")
FENCE = re.compile(r"^```\w*\n.*?^```$", re.MULTILINE | re.DOTALL)
# NOTE: the CPU may hold commas inside parentheses: "a 2-core AMD EPYC Zen 4 (torch `AVX512`, no AMX)".
MEASURED = re.compile(
    r"Measured on ((?:[^,(]|\([^)]*\))+), (\d{4}-\d{2}-\d{2}), commit ([0-9a-f]{7,40})\b", re.IGNORECASE
)
# NOTE: a figure: `3.6 s`, `481 MiB`, `43.9 tok/s`, `0.17 nats`, `1.44×`; a sentence that says it measured one: its verb,
# or the CPU it names (`on a 2-core Zen 2`). Settings (`--sse-keepalive 15 s`) say neither.
FIGURE = re.compile(r"(?<![\w.-])\d[\d,.]*\s?(?:tok/s|tokens/s|req/s|ms|s|seconds|minutes|MiB|GiB|MB|GB|nats|×)(?![\w/])")
MEASURING = re.compile(
    r"\b(?:measured|takes?|took|peak|faster|slower|RSS|throughput|TTFT|decodes?|\d-core"
    r"|on (?:an? |this )(?:AMD|Intel|Zen|Xeon|EPYC|CPU|machine))\b", re.IGNORECASE,
)


def blocks(text: str) -> list[str]:
    """The doc's paragraphs and tables (code blocks left out), each on one line but a table's rows."""
    return [block.strip() for block in re.split(r"\n\s*\n", FENCE.sub("", text)) if block.strip()]


def is_table(block: str) -> bool:
    return all(line.startswith("|") for line in block.splitlines())


def is_measurements(table: str) -> bool:
    """A table whose cells (but the first column's) are mostly figures: `43.9 tok/s`, `7@0.11`, `1,713 MiB`."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    cells = [cell for row in rows for cell in row[1:] if cell]
    return bool(cells) and 2 * sum(cell[0].isdigit() for cell in cells) >= len(cells)


def measurement_tables(path: Path) -> list[tuple[str, str]]:
    """(a measurement table's first line, the paragraphs before and after it, joined) of one doc."""
    found = []
    paragraphs = blocks(path.read_text())
    for index, block in enumerate(paragraphs):
        if is_table(block) and is_measurements(block):
            around = [paragraphs[i] for i in (index - 1, index + 1) if 0 <= i < len(paragraphs)]
            found.append((block.splitlines()[0], " ".join(" ".join(around).split())))
    return found


def measured_sentences(path: Path) -> list[tuple[str, str]]:
    """(a prose sentence stating a measured figure, its paragraph and the ones before and after it, joined)."""
    found = []
    paragraphs = [" ".join(block.split()) for block in blocks(path.read_text())]
    for index, block in enumerate(paragraphs):
        sentences = [s for s in re.split(r"(?<=[.;:])\s", block) if FIGURE.search(s) and MEASURING.search(s)]
        if sentences and not is_table(block):
            around = [paragraphs[i] for i in (index - 1, index, index + 1) if 0 <= i < len(paragraphs)]
            found.append((sentences[0], " ".join(around)))
    return found


def tables() -> list[object]:
    return [pytest.param(around, id=f"{path.name}: {header[:60]}")
            for path in DOCS for header, around in measurement_tables(path)]


def test_the_readme_has_measurement_tables_and_the_rule_finds_them() -> None:
    assert len(measurement_tables(ROOT / "README.md")) >= 3
    flags = "| flag | default | what it does |\n| --- | --- | --- |\n| `--port N` | 8000 | where it listens |\n"
    assert not is_measurements(flags + "| `--api-key KEY` | none | the key clients send |")


def sentences() -> list[object]:
    return [pytest.param(around, id=f"{path.name}: {sentence[:60]}")
            for path in DOCS for sentence, around in measured_sentences(path)]


def test_the_prose_rule_finds_measured_sentences_and_not_settings() -> None:
    assert len(measured_sentences(ROOT / "README.md")) >= 3
    for setting in ("`--sse-keepalive` sends a ping every 15 s.", "Bodies over 8 MiB get a 413."):
        assert not (FIGURE.search(setting) and MEASURING.search(setting)), setting
    assert FIGURE.search("it decodes 43.9 tok/s") and MEASURING.search("it decodes 43.9 tok/s")


@pytest.mark.parametrize("around", [*tables(), *sentences()])
def test_each_measurement_names_its_cpu_date_and_commit(around: str) -> None:
    measured = MEASURED.search(around)
    assert measured, f"no 'Measured on <CPU>, <YYYY-MM-DD>, commit <sha>' beside it: {around[:300]}"
    if (ROOT / ".git").exists():
        commit = measured.group(3)
        is_known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
        assert is_known.returncode == 0, f"commit {commit} is not in this repository"
