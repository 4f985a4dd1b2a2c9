"""One truth: recommended.json, ``tuner best``, trials.csv and the HTML report state the same confirmed figures;
a time limit that falls inside the confirmation fails the search and says so, it never becomes another answer.

The workers are the test-only synthetic ones (``LMS_TUNER_FAULT``, no TensorFlow): ``fitsN`` fits a batch when
it is at most N (peak linear up to the usable budget at N, throughput 100 + batch), ``hang`` sleeps until the
search stops it.
"""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import optuna

from .conftest import TINY_MODEL, run_cli

STUDY = "truth"


def _search(tmp_path: Path, *extra: str, fault: str, expect: int = 0) -> dict | None:
    proc = run_cli(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "128MiB", "--study", STUDY,
                    "--seed", "0", "--screen-trials", "6", "--no-report", "--json", *extra], cwd=tmp_path, timeout=300,
                   env={"LMS_TUNER_FAULT": fault})
    assert proc.returncode == expect, proc.stderr[-3000:]
    return proc


class _Text(HTMLParser):
    """The text of the elements with a given id (and everything in them), and every table's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str | None] = []
        self.by_id: dict[str, list[str]] = {}
        self.rows: list[list[str]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._table = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("br", "img", "meta"):
            return
        self.stack.append(dict(attrs).get("id"))
        if tag == "table":
            self._table = dict(attrs).get("class") or ""
        if tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("br", "img", "meta"):
            return
        if self.stack:
            self.stack.pop()
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self.tables.setdefault(self._table, []).append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        for ident in self.stack:
            if ident:
                self.by_id.setdefault(ident, []).append(data)
        if self._cell is not None:
            self._cell.append(data)


def test_report_best_recommended_json_and_trials_csv_agree_on_the_confirmed_figures(tmp_path: Path,
                                                                                      seed_graph) -> None:
    from tuner.report.data import report_data, trials_frame
    from tuner.report.provenance import Recommendation

    seed_graph(tmp_path / "studies", STUDY)
    # in-process trials first (--confirm 0: their own batch searches), then the confirmation in fresh processes,
    # where the recommended config fits 7 samples more than its trial found and the baseline 2 fewer: the trials'
    # own figures and the confirmed ones differ, and every output must show the confirmed ones
    first = json.loads(_search(tmp_path, "--confirm", "0", "--trials", "3", fault="ok@*").stdout)
    chosen, base = first["trial"], first["baseline"]["trial"]
    up, down = first["batch_size"] + 7, first["baseline"]["batch_size"] - 2
    fault = f"fits{up}@{chosen}.*,fits{down}@{base}.*,ok@*"
    doc = json.loads(_search(tmp_path, "--confirm", "2", "--trials", "3", fault=fault).stdout)
    assert doc["confirmed"] is True and "unconfirmed" not in doc
    assert (doc["trial"], doc["batch_size"], doc["baseline"]["batch_size"]) == (chosen, up, down)
    assert doc["throughput"] == 100.0 + up and doc["baseline"]["throughput"] == 100.0 + down
    ratio, t_ratio = doc["gain_vs_baseline"]["batch_size_ratio"], doc["gain_vs_baseline"]["throughput_ratio"]

    best = run_cli(["best", "--study", STUDY, "--json"], cwd=tmp_path, timeout=60)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout) == doc
    text = run_cli(["best", "--study", STUDY], cwd=tmp_path, timeout=60).stdout
    assert f"batch size   {up} " in text and f"no-LMS baseline: batch {down}," in text
    assert f"-> batch x{ratio:.2f}, throughput x{t_ratio:.2f}" in text

    # trials.csv: the confirmed figures, the trials' own (in-process) ones beside them
    rows = {int(r["number"]): r for r in csv.DictReader((tmp_path / "studies" / STUDY / "trials.csv").open())
            if r["study"] == STUDY}
    for number, batch in ((chosen, up), (base, down)):
        assert (int(rows[number]["batch_size"]), float(rows[number]["throughput"])) == (batch, 100.0 + batch)
        assert float(rows[number]["fresh_processes"]) >= 2
    assert int(rows[chosen]["trial_batch_size"]) == first["batch_size"] != up

    proc = run_cli(["report", "--study", STUDY], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = _Text()
    page.feed((tmp_path / "reports" / STUDY / "index.html").read_text())
    card = " ".join(" ".join(page.by_id["recommendation"]).split())
    assert f"batch size {up:,} {ratio:.2f}× the no-LMS maximum of {down:,}" in card, card
    assert (f"throughput {100.0 + up:,.1f} samples/s {t_ratio:.2f}× no LMS ({100.0 + down:,.1f} samples/s at batch "
            f"{down:,})") in card, card
    assert f"Fresh processes: batch {up:,} fitted in 2 of {doc['confirmation']['processes']}" in card
    process_rows = [r for r in page.rows if len(r) == 7 and r[0].isdigit()]
    assert [[int(r[1].replace(",", "")), r[2]] for r in process_rows] == [
        [b, {"fits": "fits", "no": "does not fit"}[v]] for b, v in doc["confirmation"]["tried"]]
    # the front table, the trial table and the simulator check show the confirmed point of the recommended
    # trial and the baseline (batch, samples/s: the columns of each table)
    for number, batch, tables in ((chosen, up, ("front", "trials", "")), (base, down, ("trials", ""))):
        for table, columns in ((t, {"front": (1, 2), "trials": (2, 3), "": (2, 5)}[t]) for t in tables):
            shown = [r for r in page.tables[table] if r and r[0] == f"#{number}"]
            assert len(shown) == 1, (table, shown)
            assert [shown[0][i] for i in columns] == [f"{batch:,}", f"{100.0 + batch:,.1f}"], (table, shown)
    # the plots' data: the recommended star and the baseline square sit at the confirmed figures
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    data = report_data(STUDY, study.get_trials(), study_attrs=dict(study.user_attrs),
                       recommendation=Recommendation.from_document(doc), recommendation_path="r.json", generated="")
    pts = data.fronts[0].points
    star, square = pts[pts["recommended"]].iloc[0], pts[pts["baseline"]].iloc[0]
    assert (star["x"], star["y"], square["x"], square["y"]) == (up, 100.0 + up, down, 100.0 + down)
    # without the confirmations the same trials show their own figures (the overlay is what moved them)
    own = trials_frame(study.get_trials())
    assert int(own[own["number"] == chosen]["batch_size"].iloc[0]) == first["batch_size"]


def test_a_time_limit_inside_the_confirmation_fails_the_search_and_marks_the_recommendation_unconfirmed(
        tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    fits = "fits120@*,fits30@0"
    # every trial measured (each a bracket of fresh processes, each batch once); nothing left but the repeats
    done = json.loads(_search(tmp_path, "--confirm", "1", fault=fits).stdout)
    assert done["confirmed"] is True and (done["batch_size"], done["baseline"]["batch_size"]) == (120, 30)
    # --confirm 2 asks each of them to fit once more; the time limit comes while the first repeat runs
    proc = _search(tmp_path, "--confirm", "2", "--timeout", "20", fault="hang@*", expect=1)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("WARNING: the recommendation is NOT CONFIRMED: the time limit (20 s) ended the search "
                           "before the confirmation ended"), proc.stderr[-2000:]
    finish = re.search(r"Finish it with: (.*)$", last).group(1)
    assert finish.startswith("python -m tuner search --model") and finish.endswith("--confirm 2 --timeout 0"), finish
    assert "--timeout 20" not in finish
    rec = json.loads((tmp_path / "studies" / STUDY / "recommended.json").read_text())
    assert rec["confirmed"] is False and "the confirmation ended" in rec["unconfirmed"]
    assert json.loads(proc.stdout)["confirmed"] is False
    best = run_cli(["best", "--study", STUDY], cwd=tmp_path, timeout=60).stdout
    assert "NOT CONFIRMED: the time limit (20 s) ended the search before the confirmation ended" in best
    # the command it names finishes it: confirmed, the same answer
    args = finish.split()[3:]  # after "python -m tuner"
    again = run_cli(args, cwd=tmp_path, timeout=300, env={"LMS_TUNER_FAULT": fits})
    assert again.returncode == 0, again.stderr[-2000:]
    rec = json.loads((tmp_path / "studies" / STUDY / "recommended.json").read_text())
    assert rec["confirmed"] is True and "unconfirmed" not in rec
    assert (rec["batch_size"], rec["confirmation"]["fits"], rec["baseline"]["confirmation"]["fits"]) == (120, 2, 2)
    assert rec["config"] == done["config"]
