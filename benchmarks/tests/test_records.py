"""The results pages are rendered from the committed records, not written by
hand, and the headline fits one screen."""

import re

import pytest

from benchmarks._common import records

SUITES = list(records.SUITES)


@pytest.mark.parametrize("suite", [s for s in SUITES if s])
def test_suite_page_is_rendered_from_its_records(suite):
    page = records.folder(suite) / "RESULTS.md"
    assert page.read_text() == records.page(suite), "run python -m benchmarks.report"


def test_results_page_is_rendered_and_its_headline_fits_a_screen():
    text = (records.ROOT / "RESULTS.md").read_text()
    assert text == records.results_page(), "run python -m benchmarks.report"
    head = text.split("\n## ", 1)[0]
    assert len(head.splitlines()) <= 40
    rows = [line for line in head.splitlines() if line.startswith("| [")]
    assert len(rows) >= 7  # DC3, SOC, cvxpy, DC-OPF, proxy, training step, GPU
    for label in ("DC3", "SOC", "cvxpy", "DC-OPF proxy", "Training step", "GPU"):
        assert any(label in row for row in rows), label


@pytest.mark.parametrize("suite", SUITES)
def test_every_record_names_its_provenance(suite):
    for record in records.load(suite):
        assert record["suite"] == suite and record["blocks"]
        assert record.get("command") and "source" in record, record["name"]
        assert record["source"] == "run" or record["source"].startswith("transcribed")
        for row in record.get("headline", []):
            assert {"measure", "ours", "baseline", "ratio"} <= set(row)


@pytest.mark.parametrize("suite", SUITES)
def test_linked_figures_exist(suite):
    page = records.folder(suite) / "RESULTS.md"
    for link in re.findall(r"\]\(([^)#]+\.png)\)", page.read_text()):
        assert (page.parent / link).resolve().is_file(), link


def test_blocks_round_trip():
    text = "Intro, `a | b` in code.\n\n| x | y |\n|---|---:|\n| 1 | 2 |\n\nAfter."
    blocks = records.blocks(text)
    assert blocks[1] == {"table": {"columns": ["x", "y"], "rows": [["1", "2"]]}}
    body = records.section({"title": "T", "blocks": blocks, "command": "c"})
    assert "| x | y |\n|---|---|\n| 1 | 2 |" in body and body.endswith("After.\n")
