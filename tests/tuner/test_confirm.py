"""The recommendation measured again in fresh processes, one batch per process (`tuner.backends.confirm`,
``--confirm N``).

A batch's peak depends on the batches run before it in a process, so the search
re-measures the config it recommends and the no-LMS baseline with one batch per
fresh worker, bracketing the largest batch that fits from the trial's, and
recommends that batch once it fitted in N processes. The workers here are the
test-only synthetic ones (``LMS_TUNER_FAULT``, no TensorFlow): ``ok`` fits at the
batch asked for, ``fitsN`` peaks linearly up to the usable budget at batch N.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from tuner.policy.bracket import start_from_peaks
from tuner.backends.confirm import CONFIRMATIONS_ATTR, METHOD, confirmed_figures, next_batch
from tuner.worker.faults import injected_fault

from .conftest import TINY_MODEL, run_cli

STUDY = "confirm"


def _search(tmp_path: Path, *extra: str, fault: str = "ok@*", trials: str = "3") -> dict:
    proc = run_cli(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "128MiB", "--study", STUDY,
                    "--seed", "0", "--trials", trials, "--screen-trials", "4", "--timeout", "0", "--no-report",
                    "--json", *extra], cwd=tmp_path, timeout=180, env={"LMS_TUNER_FAULT": fault})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fault_hook_targets_a_re_measurement() -> None:
    spec = "smaller@3.1,kill@3,fits90@3.*,ok@*"
    assert injected_fault(3, spec) == "kill"
    assert injected_fault(3, spec, confirm=1) == "smaller"  # its own entry before N.*
    assert injected_fault(3, spec, confirm=2) == "fits90"
    assert injected_fault(4, spec, confirm=1) == "ok"
    assert injected_fault(4, "smaller@3.1") is None
    assert injected_fault(3, "fits90@3.*") is None  # N.* is for re-measurements only
    assert injected_fault(3, "path90@3") == "path90"


def _runs(*pairs: tuple[int, str], peak_per_sample: int = 0) -> list[dict]:
    return [{"process": i + 1, "batch": b, "status": s,
             **({"peak_device_bytes": b * peak_per_sample} if peak_per_sample and s in ("ok", "infeasible") else {})}
            for i, (b, s) in enumerate(pairs)]


def test_next_batch_brackets_from_the_trials_batch() -> None:
    kw = dict(repeats=2, cap=4096, usable=1000, slope=10.0, max_processes=10)
    assert next_batch([], start=90, **kw) == 90
    assert next_batch([], start=9000, **kw) == 4096
    # grow: 100 peaked at 900, 100 bytes of headroom are 10 samples at the slope: aim one past them
    assert next_batch(_runs((90, "ok"), (100, "ok"), peak_per_sample=9), start=90,
                      **{**kw, "slope": None}) == 112  # the slope measured between 90 and 100: 9 bytes a sample
    assert next_batch(_runs((100, "ok"), peak_per_sample=9), start=100, **kw) == 111
    assert next_batch(_runs((100, "ok")), start=100, **kw) == 113  # no peak: +1/8
    assert next_batch(_runs((100, "ok"), peak_per_sample=1), start=100, **kw) == 125  # at most +25%
    # shrink: 120 peaked at 1200, 200 bytes over: 20 samples
    assert next_batch(_runs((120, "infeasible"), peak_per_sample=10), start=120, **kw) == 100
    assert next_batch(_runs((120, "oom")), start=120, **kw) == 105
    assert next_batch(_runs((1, "oom")), start=1, **kw) is None  # not even batch 1
    # inside the bracket: where the line through the two peaks meets the budget, an eighth from its ends
    assert next_batch(_runs((100, "ok"), (120, "infeasible"), peak_per_sample=9), start=100, **kw) == 111
    assert next_batch(_runs((100, "ok"), (200, "oom")), start=100, **kw) == 150
    near = [{"process": 1, "batch": 100, "status": "ok", "peak_device_bytes": 995},
            {"process": 2, "batch": 109, "status": "infeasible", "peak_device_bytes": 1085}]
    assert next_batch(near, start=100, **kw) == 101  # 5 bytes of headroom at 10 a sample: 100.5
    assert next_batch(_runs((100, "ok"), (102, "infeasible")), start=100, **kw) == 101
    # closed (101 does not fit): 100 again until it fitted `repeats` times
    closed = _runs((100, "ok"), (101, "infeasible"))
    assert next_batch(closed, start=100, **kw) == 100
    assert next_batch(closed + _runs((100, "ok")), start=100, **kw) is None
    # a repeat that does not fit moves the bracket below it
    assert next_batch(closed + _runs((100, "infeasible")), start=100, **kw) == 87
    # no verdict (killed, timed out) counts as a process, not as a verdict; the processes are capped
    assert next_batch(_runs((100, "killed")), start=100, **kw) == 100
    assert next_batch(_runs(*[(100, "killed")] * 10), start=100, **kw) is None
    # at the cap nothing can grow: repeat it
    assert next_batch(_runs((4096, "ok")), start=4096, **kw) == 4096


@pytest.mark.parametrize("start", [60, 90, 97, 130, 400])
def test_next_batch_finds_the_same_batch_from_any_start(start: int) -> None:
    """Peaks 10 bytes a sample plus a jagged allocator term; the largest batch that fits is 98 wherever it starts."""
    def peak(b: int) -> int:
        return 10 * b + 20 + (9 if b % 3 == 0 else 0)

    runs: list[dict] = []
    while (b := next_batch(runs, start=start, repeats=2, cap=4096, usable=1000, slope=12.0, max_processes=12)):
        runs.append({"process": len(runs) + 1, "batch": b, "peak_device_bytes": peak(b),
                     "status": "ok" if peak(b) <= 1000 else "infeasible"})
    got = confirmed_figures(SimpleNamespace(number=1, user_attrs={}), {"1": {"method": METHOD, "runs": runs}})
    assert (got["batch_size"], got["smallest_failing"], got["fits"]) == (98, 99, 2), runs
    assert len(runs) <= 8


def test_search_recommends_the_batch_fresh_processes_fit_and_resumes_from_the_stored_runs(
        tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    first = _search(tmp_path, "--confirm", "0")
    assert "confirmation" not in first
    chosen, batch = first["trial"], first["batch_size"]
    base = first["baseline"]
    assert base["trial"] != chosen and batch > base["batch_size"] > 3

    # resumed with --confirm 2: the recommended config fits 7 samples more than its trial found, in a fresh
    # process; the baseline 2 fewer
    up, down = batch + 7, base["batch_size"] - 2
    fault = f"fits{up}@{chosen}.*,fits{down}@{base['trial']}.*,ok@*"
    doc = _search(tmp_path, "--confirm", "2", fault=fault)
    assert doc["trial"] == chosen
    conf = doc["confirmation"]
    assert doc["batch_size"] == up and doc["tuned_for"] == {"batch_size": up}
    assert conf["batch_size"] == up and conf["fits"] == 2 and conf["smallest_failing"] == up + 1 and conf["closed"]
    assert conf["trial_batch"] == batch and conf["tried"][0] == [batch, "fits"]
    # the first process ran the simulator's batch for the config (here the trial's too: `ok` fits its first probe)
    assert conf["start"] == doc["predicted"]["batch_size"] == conf["tried"][0][0]
    assert conf["tried"][-1] == [up, "fits"] and [up + 1, "no"] in conf["tried"]
    assert doc["throughput"] == 100.0 + up  # the synthetic worker's throughput at that batch
    assert doc["baseline"]["batch_size"] == down and doc["baseline"]["confirmation"]["fits"] == 2
    assert doc["baseline"]["confirmation"]["tried"][0] == [base["batch_size"], "no"]
    assert doc["gain_vs_baseline"]["batch_size_ratio"] == round(up / down, 3)
    # one batch per process, each from its first step, in its own folder
    requests = sorted((tmp_path / "studies" / STUDY / "confirm").glob("*/request.json"))
    assert len(requests) == conf["processes"] + doc["baseline"]["confirmation"]["processes"]
    for path in requests:
        req = json.loads(path.read_text())["request"]
        assert req["fixed_batch"] is True and req["cap"] == req["start_batch"] and req["confirm"] >= 1
    written = json.loads((tmp_path / "studies" / STUDY / "recommended.json").read_text())
    assert written["batch_size"] == up
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    stored = study.user_attrs[CONFIRMATIONS_ATTR]
    assert sorted(stored) == sorted([str(chosen), str(base["trial"])])

    # resumed again: nothing measured twice (the stored runs are reused) ...
    mtimes = {p: p.stat().st_mtime_ns for p in requests}
    again = _search(tmp_path, "--confirm", "2", fault=fault)
    assert again["batch_size"] == up
    assert {p: p.stat().st_mtime_ns for p in requests} == mtimes
    # ... and with --confirm 3 only one more process for each, at the batch found
    more = _search(tmp_path, "--confirm", "3", fault=fault)
    assert more["confirmation"]["fits"] == 3 and more["confirmation"]["tried"][-1] == [up, "fits"]
    assert more["confirmation"]["processes"] == conf["processes"] + 1
    proc = run_cli(["best", "--study", STUDY], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (f"batch {up} fitted in 3 fresh processes, {up + 1} did not (the trial's {batch}, the simulator's {batch};"
            in proc.stdout)


def test_confirmed_figures_take_the_bracket_and_name_runs_without_a_verdict() -> None:
    trial = SimpleNamespace(number=7, user_attrs={"status": "ok", "batch_size": 140})
    runs = [{"process": 1, "batch": 140, "status": "infeasible", "peak_device_bytes": 9},
            {"process": 2, "batch": 136, "status": "ok", "throughput": 80.0, "peak_device_bytes": 5,
             "step_time_median_s": 1.7},
            {"process": 3, "batch": 138, "status": "killed", "reason": "SIGKILL"},
            {"process": 4, "batch": 138, "status": "ok", "throughput": 81.0, "peak_device_bytes": 6},
            {"process": 5, "batch": 138, "status": "infeasible", "peak_device_bytes": 7},  # fits in one, not another
            {"process": 6, "batch": 136, "status": "ok", "throughput": 70.0, "peak_device_bytes": 6,
             "step_time_median_s": 1.9}]
    got = confirmed_figures(trial, {"7": {"method": METHOD, "runs": runs, "trial_batch": 140}})
    assert got["batch_size"] == 136 and got["smallest_failing"] == 138 and got["fits"] == 2
    assert got["throughput"] == 80.0 and got["process"] == 2  # the faster of the two at 136 ...
    assert got["peak_device_bytes"] == 6 and got["step_time_median_s"] == 1.7  # ... and the higher peak there
    assert got["tried"] == [[140, "no"], [136, "fits"], [138, "?"], [138, "fits"], [138, "no"], [136, "fits"]]
    assert got["processes"] == 6 and got["trial_batch"] == 140
    assert got["closed"] is False  # stored without "closed": the time limit came before the bracket closed
    assert got["unconfirmed"] == [{"process": 3, "batch": 138, "status": "killed", "reason": "SIGKILL"}]
    assert confirmed_figures(trial, {"8": {"method": METHOD, "runs": runs}}) is None
    assert confirmed_figures(trial, None) is None
    # runs stored by the older down-search (no method) are not read as batches run from a first step
    assert confirmed_figures(trial, {"7": {"runs": runs}}) is None
    # nothing fitted: no confirmed figures
    assert confirmed_figures(trial, {"7": {"method": METHOD, "runs": runs[:1]}}) is None


def test_the_throughput_rule_reads_the_confirmed_figures() -> None:
    """A search measured its no-LMS trial at 87.9 samples/s and its LMS trial at 63.4 (0.72x: no LMS would be
    recommended); their fresh processes, best of each, say 67.7 and 74.3: the LMS config is."""
    from tuner.policy.selection import select_recommendation

    def trial(number: int, batch: int, thr: float, n: int) -> SimpleNamespace:
        return SimpleNamespace(number=number, state=SimpleNamespace(name="COMPLETE"), values=[batch, thr],
                               constraints={"memory": -0.1}, params={},
                               user_attrs={"status": "ok", "batch_size": batch, "throughput": thr, "measured": True,
                                           "config": {"n_tensors": n}, "peak_device_bytes": 1})

    def confirmed(batch: int, thr: float) -> dict:
        return {"method": METHOD, "closed": True,
                "runs": [{"process": 1, "batch": batch, "status": "ok", "throughput": thr, "peak_device_bytes": 2},
                         {"process": 2, "batch": batch + 1, "status": "infeasible"},
                         {"process": 3, "batch": batch, "status": "ok", "throughput": thr - 10,
                          "peak_device_bytes": 3}]}

    trials = [trial(0, 30, 87.9, 0), trial(3, 164, 63.4, 170)]
    assert select_recommendation(trials)[0].number == 0
    confirmations = {"0": confirmed(28, 67.7), "3": confirmed(175, 74.3)}
    chosen, front = select_recommendation(trials, confirmations=confirmations)
    assert chosen.number == 3 and chosen.values == [175.0, 74.3]
    assert [t.values for t in front] == [[175.0, 74.3]]  # it dominates the baseline now


def test_a_trial_whose_in_process_timed_runs_missed_is_timed_in_fresh_processes(tmp_path: Path, seed_graph) -> None:
    # `pathN`: every trial's probes fit the batch they start at, its timed runs after them do not (the process's
    # history), and a fresh process fits a batch when it is at most N (in-process trials: --confirm 0)
    seed_graph(tmp_path / "studies", STUDY)
    limit = 1000
    doc = _search(tmp_path, "--confirm", "0", fault=f"path{limit}@*")
    assert doc["confirmed"] is False and doc["unconfirmed"].startswith("--confirm 0")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    assert CONFIRMATIONS_ATTR not in study.user_attrs
    trials = [t for t in study.get_trials() if t.user_attrs.get("measured")]
    assert len(trials) == 3
    shrunk = 0
    for t in trials:
        a = t.user_attrs
        fresh = a["timed_in_fresh_process"]
        searched, tried = fresh["searched_batch"], fresh["tried"]
        assert fresh["in_process_reason"] == "the batches found by the search did not fit on their timed runs"
        # from the probes' batch down until a fresh process fits, at most 3 processes; the trial has its figures
        assert tried[0][0] == searched and tried[-1] == [a["batch_size"], "ok"] and len(tried) <= 3
        assert all(status == "infeasible" and b > limit for b, status in tried[:-1])
        assert a["status"] == "ok" and a["batch_size"] == min(searched, a["batch_size"]) <= limit
        assert t.values[1] == 100.0 + a["batch_size"]  # the synthetic worker's throughput at that batch
        shrunk += len(tried) > 1
        # each in a fresh process of its own, in the trial's folder, one batch each
        requests = [json.loads((tmp_path / "studies" / STUDY / "trials" / f"{t.number:04d}" / f"fresh-{k}"
                                / "request.json").read_text())["request"] for k in range(1, len(tried) + 1)]
        assert [(r["start_batch"], r["cap"], r["fixed_batch"]) for r in requests] == [(b, b, True) for b, _ in tried]
    assert shrunk >= 1  # some trial started above the limit (the batches probed: see `tried`)
    assert "confirmation" not in doc


def test_a_trial_no_fresh_process_fits_stays_infeasible_and_says_where_it_was_tried() -> None:
    from lms.config import LMSConfig
    from tuner.backends.measured import measured_record
    from tuner.policy.batch import Prediction
    from tuner.worker.protocol import MeasureResult
    from tuner.worker.run import WorkerOutcome

    res = MeasureResult(status="infeasible", reason="the batches found by the search did not fit on their timed runs",
                        search={"batch": 40})
    outcome = WorkerOutcome("infeasible", res, reason=res.reason)
    retimed = [{"batch": 40, "status": "infeasible", "peak_device_bytes": 120}, {"batch": 30, "status": "timeout"}]
    pred = Prediction(batch=40, peak_bytes=90, step_time_s=1.0, throughput=40.0)
    record = measured_record(LMSConfig(), outcome, pred, backend=SimpleNamespace(name="emulated", peak_source="x"),
                             usable=100, trial_dir=Path("t"), retimed=retimed)
    assert record.status == "infeasible" and record.batch_size == 0
    assert record.reason.endswith("; in fresh processes: batch 40 did not fit, batch 30 timeout")
    assert record.extra["timed_in_fresh_process"]["tried"] == [[40, "infeasible"], [30, "timeout"]]


def test_a_default_search_measures_each_trial_as_a_bracket_of_fresh_processes_then_repeats_side_by_side(
        tmp_path: Path, seed_graph) -> None:
    """--confirm 2 (the default): the baseline and the screen's pick, each a bracket of fresh processes (each batch
    once, from the simulator's batch), then one more process of each in turn at the batch found."""
    seed_graph(tmp_path / "studies", STUDY)
    doc = _search(tmp_path, fault="fits120@*,fits30@0", trials="2")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    trials = sorted((t for t in study.get_trials() if t.user_attrs.get("measured")), key=lambda t: t.number)
    assert [t.user_attrs["config"]["n_tensors"] for t in trials][0] == 0 and len(trials) == 2
    assert trials[1].user_attrs.get("from_screen") and not trials[1].user_attrs.get("warm_start")
    stored = study.user_attrs[CONFIRMATIONS_ATTR]
    for t, limit in zip(trials, (30, 120)):
        entry = stored[str(t.number)]
        assert entry["fresh_trial"] and entry["closed"] and entry["start"] == t.user_attrs["predicted_batch"]
        assert entry["runs"][0]["batch"] == entry["start"]  # the first process at the simulator's batch
        # the trial's figures are its bracket's: the largest batch that fitted, the next one up did not
        assert t.user_attrs["batch_size"] == limit and t.user_attrs["smallest_failing"] == limit + 1
        assert t.user_attrs["tried"] == [[r["batch"], "fits" if r["batch"] <= limit else "no"]
                                         for r in entry["runs"][:-1]]
        # ... and then one repeat: the batch fitted in 2 processes
        assert [r["batch"] for r in entry["runs"]].count(limit) == 2 and entry["runs"][-1]["batch"] == limit
    assert doc["confirmed"] is True and doc["batch_size"] == 120 and doc["baseline"]["batch_size"] == 30
    assert doc["confirmation"]["trial_batch"] is None and doc["confirmation"]["fits"] == 2
    # the bracket's processes in the trial's folder, the repeats in confirm/, one of each trial in turn; every
    # process stops its timed steps at the first one over the budget
    requests = {p.parent: json.loads(p.read_text())["request"]
                for p in (tmp_path / "studies" / STUDY).glob("**/request.json") if "trace" not in str(p)}
    assert all(r["fixed_batch"] and r["stop_over_budget"] and r["confirm"] >= 1 for r in requests.values())
    repeats = sorted((p for p in requests if p.parent.name == "confirm"), key=lambda p: p.stat().st_mtime_ns)
    assert [requests[p]["trial"] for p in repeats] == [trials[1].number, trials[0].number]
    proc = run_cli(["best", "--study", STUDY], cwd=tmp_path, timeout=60)
    assert (f"batch 120 fitted in 2 fresh processes, 121 did not (from the simulator's "
            f"{stored[str(trials[1].number)]['start']}; one batch per process:") in proc.stdout, proc.stdout


def test_a_trial_stopped_mid_bracket_goes_on_from_its_processes(tmp_path: Path, seed_graph) -> None:
    """The time limit stops the pick's bracket while a process runs: the trial is queued again, and its retry
    starts no process that had already ended."""
    seed_graph(tmp_path / "studies", STUDY)
    _search(tmp_path, fault="fits30@0", trials="1")  # the baseline and the screen; then the pick's trial alone:
    proc = run_cli(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "128MiB", "--study", STUDY,
                    "--seed", "0", "--trials", "2", "--screen-trials", "4", "--timeout", "20", "--no-report"],
                   cwd=tmp_path, timeout=180, env={"LMS_TUNER_FAULT": "fits30@0,hang@1.2,fits120@*"})
    assert proc.returncode == 1 and "WARNING: the recommendation is NOT CONFIRMED" in proc.stderr, proc.stderr[-2000:]
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    stopped = study.user_attrs[CONFIRMATIONS_ATTR]["1"]
    assert [r["process"] for r in stopped["runs"]] == [1] and not stopped["closed"]
    doc = _search(tmp_path, fault="fits30@0,fits120@*", trials="2")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    stored = study.user_attrs[CONFIRMATIONS_ATTR]
    assert "1" not in stored  # trial 1 (interrupted) handed its runs to its retry
    retry = next(t for t in study.get_trials() if t.user_attrs.get("retry_of") == 1)
    runs = stored[str(retry.number)]["runs"]
    assert runs[0] == stopped["runs"][0] and [r["process"] for r in runs] == list(range(1, len(runs) + 1))
    assert not (tmp_path / "studies" / STUDY / "trials" / f"{retry.number:04d}" / "process-1").exists()
    assert doc["confirmed"] is True and doc["trial"] == retry.number, doc.get("unconfirmed")


def test_the_throughput_is_the_fastest_process_at_the_batch_bracket_or_repeat() -> None:
    """Fresh processes of one config run at one of two speeds on a shared machine (about 29 or 45 samples/s):
    the fastest process at the batch, of the bracket or the side-by-side repeats, is the config's throughput."""
    trial = SimpleNamespace(number=3, user_attrs={"status": "ok", "batch_size": 180})
    runs = [{"process": 1, "batch": 180, "status": "ok", "throughput": 45.0, "peak_device_bytes": 5},
            {"process": 2, "batch": 181, "status": "infeasible", "peak_device_bytes": 9},
            {"process": 3, "batch": 180, "status": "ok", "throughput": 29.0, "peak_device_bytes": 5,
             "side_by_side": True}]
    got = confirmed_figures(trial, {"3": {"method": METHOD, "runs": runs, "fresh_trial": True, "closed": True}})
    assert (got["throughput"], got["process"], got["fits"], got["trial_batch"]) == (45.0, 1, 2, None)


def test_start_from_peaks_is_where_the_line_through_two_measured_peaks_meets_the_budget() -> None:
    mib = 1 << 20
    # ResNet-50 64x64's plain step as the default search's trace worker measured it (batches 4 and 16), against
    # its 547.2 MiB usable: 25 (fresh processes of the no-LMS baseline fitted 26-29; the simulator said 34-35)
    assert start_from_peaks({4: 371_324_928, 16: 486_310_912}, usable=int(547.2 * mib), cap=4096) == 25
    assert start_from_peaks({16: 1000, 4: 400, 8: 10**9}, usable=1500, cap=4096) == 26  # the two furthest apart
    assert start_from_peaks({4: 400, 16: 1000}, usable=1500, cap=20) == 20  # capped
    assert start_from_peaks({4: 400, 16: 1000}, usable=100, cap=4096) == 1  # under the first: 1
    assert start_from_peaks({4: 400}, usable=1500, cap=4096) is None  # one point: no line
    assert start_from_peaks({4: 400, 16: 400}, usable=1500, cap=4096) is None  # flat: no line
    assert start_from_peaks({}, usable=1500, cap=4096) is None


def test_the_baseline_bracket_starts_where_the_plain_steps_measured_peaks_point(tmp_path: Path, seed_graph) -> None:
    """The trace worker's measured peaks of the plain step (``graph.json``'s ``plain_peaks``) start the no-LMS
    baseline's bracket; every LMS config still starts at the simulator's batch; the outputs say which."""
    path = seed_graph(tmp_path / "studies", STUDY)
    graph = json.loads(path.read_text())
    mib = 1 << 20
    graph["plain_peaks"] = {"batches": [4, 16], "peak_bytes": [90 * mib, 102 * mib]}  # 1 MiB a sample
    path.write_text(json.dumps(graph))
    doc = _search(tmp_path, fault="fits120@*,fits30@0", trials="2")
    expected = 4 + (doc["usable_bytes"] - 90 * mib) // mib
    assert 20 < expected < 40  # near the baseline's 30, where the simulator starts elsewhere
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    trials = sorted((t for t in study.get_trials() if t.user_attrs.get("measured")), key=lambda t: t.number)
    stored = study.user_attrs[CONFIRMATIONS_ATTR]
    base, pick = (stored[str(t.number)] for t in trials)
    assert trials[0].user_attrs["config"]["n_tensors"] == 0
    assert base["start"] == expected != trials[0].user_attrs["predicted_batch"]
    assert base["start_from"] == "measured peaks" and base["runs"][0]["batch"] == expected
    assert pick["start"] == trials[1].user_attrs["predicted_batch"] and pick["start_from"] == "simulator"
    assert doc["baseline"]["batch_size"] == 30 and doc["batch_size"] == 120 and doc["confirmed"] is True
    assert doc["baseline"]["confirmation"]["start_from"] == "measured peaks"
    assert doc["confirmation"]["start_from"] == "simulator"


def test_the_baseline_runs_its_fresh_processes_while_the_screen_simulates(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    doc = _search(tmp_path, "--screen-trials", "8", fault="fits120@*,fits30@0", trials="2")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    screen = optuna.load_study(study_name=STUDY + ".simulated",
                               storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    base = next(t for t in study.get_trials() if t.user_attrs.get("warm_start"))
    assert base.datetime_start < max(t.datetime_complete for t in screen.get_trials() if t.datetime_complete)
    assert doc["baseline"]["batch_size"] == 30 and doc["confirmed"] is True


def test_plain_peaks_are_read_from_the_graph_cache_or_left_out(tmp_path: Path) -> None:
    from tuner.graphs import load_profile

    def load_plain_peaks(settings):
        return load_profile(settings)[1]

    settings = SimpleNamespace(study_dir=tmp_path)
    assert load_plain_peaks(settings) == {}  # no graph.json yet
    (tmp_path / "graph.json").write_text(json.dumps({"graph": {}}))
    assert load_plain_peaks(settings) == {}  # traced without profiling (or by an older version)
    (tmp_path / "graph.json").write_text(json.dumps({"plain_peaks": {"batches": [4, 16], "peak_bytes": [7, 9]}}))
    assert load_plain_peaks(settings) == {4: 7, 16: 9}
    (tmp_path / "graph.json").write_text(json.dumps({"plain_peaks": {"batches": [4, 16], "peak_bytes": [7]}}))
    assert load_plain_peaks(settings) == {}  # malformed: the simulator's start instead
    (tmp_path / "graph.json").write_text(json.dumps({"op_costs": {"schema": "other"},
                                                     "plain_peaks": {"batches": [4, 16], "peak_bytes": [7, 9]}}))
    assert load_profile(settings) == (None, {4: 7, 16: 9})  # bad op times do not cost the peaks


def test_a_bracket_in_tensorflows_own_order_gets_the_processes_its_noisy_verdicts_need() -> None:
    """The no-LMS baseline runs in TensorFlow's own order, whose verdicts do not repeat between processes: the ten
    processes a quiet default search gave it (ResNet-50 64x64, 547.2 MiB usable, 2026-12-04) left 28 fitted once,
    so the search ended unconfirmed. A config in TF's order gets `UNPINNED_EXTRA_PROCESSES` more; a pinned one
    (its verdicts repeat to the byte) does not."""
    from lms.config import LMSConfig
    from tuner.backends.confirm import EXTRA_PROCESSES, UNPINNED_EXTRA_PROCESSES, max_processes

    seen = [(34, "infeasible", 583622400), (32, "infeasible", 581240832), (25, "ok", 551561728),
            (30, "ok", 563120128), (31, "infeasible", 578013184), (30, "infeasible", 599545344),
            (27, "ok", 568182784), (28, "ok", 554349824), (29, "ok", 558566912), (29, "infeasible", 577645056)]
    runs = [{"batch": b, "status": st, "peak_device_bytes": p} for b, st, p in seen]
    usable = int(547.2 * (1 << 20))
    baseline, pick = LMSConfig(), LMSConfig(n_tensors=170, lb=1, schedule="memory")
    assert baseline.schedule == "tf"
    assert max_processes(pick, 2) == 2 + EXTRA_PROCESSES == len(runs)
    assert max_processes(baseline, 2) == 2 + EXTRA_PROCESSES + UNPINNED_EXTRA_PROCESSES > len(runs)

    def step(limit: int) -> int | None:
        return next_batch(runs, start=34, repeats=2, cap=4096, usable=usable, slope=None, max_processes=limit)

    assert step(max_processes(pick, 2)) is None  # spent: 28 fitted in 1 of the 2 processes asked
    assert step(max_processes(baseline, 2)) == 28  # the repeat the bracket still needs
    runs.append({"batch": 28, "status": "ok", "peak_device_bytes": 551000000})
    assert step(max_processes(baseline, 2)) is None  # closed: 28 fitted twice, 29 did not
    got = confirmed_figures(SimpleNamespace(number=0, user_attrs={}),
                            {"0": {"method": METHOD, "runs": [{**r, "process": i + 1} for i, r in enumerate(runs)],
                                   "fresh_trial": True, "closed": True}})
    assert (got["batch_size"], got["fits"], got["smallest_failing"]) == (28, 2, 29)
