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


def _proxy_raw(method: str, ms: float, tag: str | None = None) -> dict:
    """A raw `proxy` record of case_X with the fields the report reads."""
    machine = {"cpu": "cpu", "cpu_count": 2, "platform": "linux", "python": "3.11",
               "jax": "0.1", "jax_backend": "cpu", "git": "abc",
               "date": "2026-11-30T00:00:00"}  # fmt: skip
    base = {"case": "case_X", "variant": "real", "method": method, "tag": tag,
            "machine": machine, "settings": {"steps": 10}}  # fmt: skip
    if method == "solvers":
        solve = {"n_hours": 4, "rel_cost_diff_max": 0.0, "failed": 0,
                 "ms": {"median": ms}}  # fmt: skip
        return {**base, "clarabel_1e-08": solve}
    test = {"n_hours": 8, "gap_mean": 0.01, "gap": {"p99": 0.02},
            "overloaded_share": 0.0, "overload_mw": {"max": 0.0}, "successful": 1.0,
            "residual_over_eps32": {"max": 0.4},
            "timing": {"per_instance_ms": ms}}  # fmt: skip
    return {**base, "test": test, "train_s": 5.0}


def test_proxy_report_carries_what_it_did_not_rerun():
    """Rerunning some methods of one grid keeps the earlier run's rows of the
    others, its grids without raw records and their headline rows, and the
    merge is idempotent."""
    from benchmarks.dcopf._report import proxy_record

    first = proxy_record(
        [_proxy_raw("ours", 90.0), _proxy_raw("e2elr", 0.01),
         _proxy_raw("solvers", 50.0), {**_proxy_raw("solvers", 7.0), "case": "case_Y"},
         {**_proxy_raw("ours", 3.0), "case": "case_Y"}], {},
    )  # fmt: skip
    rerun = [_proxy_raw("ours", 45.0), _proxy_raw("solvers", 60.0)]
    merged = proxy_record(rerun, {}, first)
    text = records.section(merged)
    x = text.split("### case_X, real")[1]
    assert "| 45 |" in x and "| 90 |" not in x, "the rerun's row replaces the old"
    assert "| E2ELR |" in x and "Rows carried from the earlier run (E2ELR)" in x
    assert "### case_Y, real" in text and "| 3 |" in text.split("### case_Y")[1]
    measures = {row["measure"].split()[0]: row for row in merged["headline"]}
    assert set(measures) == {"case_X", "case_Y"}
    assert measures["case_X"]["ours"].endswith("45 ms")
    assert "E2ELR" in measures["case_X"]["baseline"]  # from the earlier row
    again = proxy_record(rerun, {}, merged)
    assert again["blocks"] == merged["blocks"]
    assert again["headline"] == merged["headline"]


def test_proxy_time_figure_keeps_the_carried_times():
    """The time figure is drawn from this run's raw records and from the times
    in the rows it carries: a method not rerun on one grid, and a grid not
    rerun at all, keep their points."""
    from benchmarks.dcopf._report import (
        _carried,
        _groups,
        _previous_sections,
        earlier_times,
        proxy_record,
    )

    def on(case, record):
        return {**record, "case": case}

    big, small = "case_ACTIVSg10k", "case_ACTIVSg200"
    first = proxy_record(
        [on(big, _proxy_raw("ours", 900.0)), on(big, _proxy_raw("e2elr", 0.5)),
         on(big, _proxy_raw("solvers", 200.0)), on(small, _proxy_raw("ours", 3.0))],
        {},
    )  # fmt: skip
    rerun = [on(big, _proxy_raw("ours", 450.0))]
    old = _previous_sections(first)
    carried, _ = _carried(_groups(rerun), old)
    times = earlier_times(old, carried)
    assert times["E2ELR"] == {10000: 0.5}
    assert times["ours (paper's recipe)"] == {200: 3.0}, "the rerun's is not carried"
    assert times["Clarabel (1e-8)"] == {10000: 200.0}


def test_proxy_headline_prefers_the_same_run_ratio():
    """Where a proxy was timed in the same run as Clarabel (`_same_run`), the
    headline gives that run's times and ratio, not the separate solvers
    run's; the notes say so too."""
    from benchmarks.dcopf._report import proxy_record

    ours = _proxy_raw("ours", 45.0)
    same = {"ours_ms": 44.0, "clarabel_ms": 88.0, "ratio": 0.5, "repeats": 3,
            "clarabel_hours": 8}  # fmt: skip
    ours["test"]["timing"]["same_run"] = same
    record = proxy_record([ours, _proxy_raw("solvers", 60.0)], {})
    row = record["headline"][0]
    assert row["ours"].endswith("44 ms")
    assert row["baseline"].startswith("Clarabel 88 ms (same run)")
    assert row["ratio"].startswith("0.50")
    assert "**0.50x** Clarabel" in records.section(record)
    # A rerun of the proxy alone (the solvers carried): its row is this run's.
    faster = {**same, "ours_ms": 22.0, "ratio": 0.25}
    again = {**ours, "test": {**ours["test"], "timing": {"same_run": faster}}}
    again["test"]["timing"]["per_instance_ms"] = 22.0
    rerun = proxy_record([again], {}, record)
    assert [row["ratio"][:4] for row in rerun["headline"]] == ["0.25"]
    alone = {**ours, "test": {**ours["test"], "timing": {"per_instance_ms": 45.0}}}
    assert proxy_record([alone], {})["headline"][0]["ratio"] == "-"


def test_proxy_headline_has_a_row_per_recipe():
    """The paper's recipe, the supervised one and a fine-tune of a checkpoint
    (`--init`, the paper's loss too) each get a headline row; of a recipe's
    runs (tags), the one of the best validation gap."""
    from benchmarks.dcopf._report import proxy_record

    tuned = _proxy_raw("ours", 30.0, tag="from-sup")
    tuned["settings"] = {"steps": 10, "init": "sup.eqx"}
    raws = [
        _proxy_raw("ours", 45.0), _proxy_raw("ours", 50.0, tag="long"),
        _proxy_raw("ours-sup", 20.0), _proxy_raw("ours-sup", 25.0, tag="long"),
        tuned, _proxy_raw("solvers", 60.0),
    ]  # fmt: skip
    for r, gap in zip(raws[:4], (0.02, 0.03, 0.02, 0.01)):
        r["best_val_gap"] = gap
    rows = proxy_record(raws, {})["headline"]
    assert [row["ours"].split(", ")[1] for row in rows] == ["45 ms", "25 ms", "30 ms"]
    assert "--init sup.eqx --tag from-sup" in rows[2]["command"]


def test_dcopf_report_does_not_drop_grids_it_did_not_rerun():
    """`report --record` rebuilds the distances record from the raw records
    alone, so a grid rerun by itself must not silently drop the others."""
    from benchmarks.dcopf._report import _keeps_every_grid

    grids = ["case1354pegase", "case2869pegase", "case9241pegase"]
    _keeps_every_grid("distances", [{"case": c} for c in grids])
    _keeps_every_grid("distances", [])  # no raw records: nothing rewritten
    with pytest.raises(SystemExit, match="case2869pegase"):
        _keeps_every_grid("distances", [{"case": "case1354pegase"}])


def test_proxy_rerun_of_one_recipe_keeps_the_others_notes_and_rows():
    """Rerunning one recipe of a grid whose section was merged before keeps,
    for the methods it carries, both runs' notes, the other recipes'
    headline rows and each row's own machine."""
    from benchmarks.dcopf._report import proxy_record

    def run(method, ms, cpu, tag=None, note=None):
        raw = _proxy_raw(method, ms, tag)
        raw["machine"] = {**raw["machine"], "cpu": cpu}
        return {**raw, "x_note": note} if note else raw

    first = proxy_record([run("e2elr", 0.1, "old", note="e2elr from the first")], {})
    second = proxy_record(
        [run("ours", 40.0, "mid", note="ours from the second"),
         run("ours-sup", 8.0, "mid", note="sup from the second")], {}, first,
    )  # fmt: skip
    third = proxy_record([run("ours", 30.0, "new")], {}, second)
    text = records.section(third)
    assert "sup from the second" in text and "e2elr from the first" in text
    assert "ours from the second" not in text, "the rerun's own notes replace it"
    rows = {
        row["command"].split("--method ")[1].split()[0]: row
        for row in third["headline"]
    }
    assert set(rows) == {"ours", "ours-sup"}
    assert rows["ours"]["ours"].endswith("30 ms")
    assert rows["ours"]["machine"].startswith("new")
    assert rows["ours-sup"]["machine"].startswith("mid")
    again = proxy_record([run("ours", 30.0, "new")], {}, third)
    assert again["blocks"] == third["blocks"]
