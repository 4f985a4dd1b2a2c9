"""benchmarks/peers.py: the pure parts (bracket arithmetic, common batch, verdicts, tables, arguments). No TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peer_tuned
import peers

MiB = 1 << 20


def _run(batch: int, status: str, peak_mib: float | None = None, thr: float = 0.0) -> dict:
    return {"batch": batch, "status": status, "peak_device_bytes": int(peak_mib * MiB) if peak_mib else None,
            "throughput": thr}


def test_a_bracket_closes_when_the_largest_fitting_batch_fitted_every_repeat_next_to_a_failing_one():
    runs = [_run(28, "ok", 517, 60.1), _run(32, "infeasible", 560), _run(29, "infeasible", 550),
            _run(28, "ok", 530, 58.0)]
    r = peers.bracket_result(runs, repeats=2)
    assert (r["batch"], r["smallest_failing"], r["closed"], r["fits"]) == (28, 29, True, 2)
    assert r["throughput"] == 60.1 and r["throughput_median"] == pytest.approx(59.05)
    assert r["peak_bytes"] == 530 * MiB
    assert r["tried"] == [[28, "fits"], [32, "no"], [29, "no"], [28, "fits"]]


def test_a_bracket_with_too_few_repeats_or_a_gap_is_not_closed():
    assert not peers.bracket_result([_run(28, "ok", 517, 60.0), _run(29, "infeasible", 550)], repeats=2)["closed"]
    assert not peers.bracket_result([_run(28, "ok", 517, 60.0), _run(31, "infeasible", 550)], repeats=1)["closed"]


def test_a_batch_that_failed_once_does_not_count_as_fitting():
    runs = [_run(30, "ok", 540, 50.0), _run(30, "infeasible", 560), _run(29, "ok", 530, 49.0), _run(31, "infeasible")]
    r = peers.bracket_result(runs, repeats=1)
    assert (r["batch"], r["smallest_failing"]) == (29, 30)


def test_nothing_fitted_gives_batch_zero_and_no_throughput():
    r = peers.bracket_result([_run(1, "infeasible", 900)], repeats=2)
    assert (r["batch"], r["throughput"], r["peak_bytes"], r["closed"]) == (0, 0.0, None, True)


@pytest.mark.parametrize("peaks, start, slope", [
    ({8: 400 * MiB, 24: 480 * MiB}, 37, 5 * MiB),
    ({24: 480 * MiB, 8: 400 * MiB}, 37, 5 * MiB),  # order does not matter
    ({8: 400 * MiB}, None, None),  # one point: no line
    ({8: 480 * MiB, 24: 400 * MiB}, None, None),  # falling: no line
])
def test_a_probe_start_is_where_the_line_through_two_peaks_meets_the_usable_budget(peaks, start, slope):
    assert peers.probe_start(peaks, usable=547 * MiB) == (start, slope)


def test_probe_batches_are_a_quarter_and_three_quarters_of_the_simulators_plain_batch():
    assert [peers.probe_batches(p) for p in (34, 6, 1, 0)] == [(8, 25), (1, 4), (1, 2), (1, 2)]


def test_the_common_batch_is_ninety_percent_of_the_smallest_largest_batch_ignoring_methods_that_fit_nothing():
    assert peers.common_batch({"plain": 28, "lms_config": 165, "remat_full": 0}) == 25
    assert peers.common_batch({"plain": 7, "lms_auto": 14}) == 6
    assert peers.common_batch({"a": 1}) == 1
    assert peers.common_batch({"a": 0}) is None
    assert peers.common_batch({"plain": 20}, fraction=1.0) == 20


def test_each_round_starts_with_another_method():
    keys = ["plain", "remat", "lms"]
    assert [peers.rotated(keys, i)[0] for i in range(4)] == ["plain", "remat", "lms", "plain"]
    assert sorted(peers.rotated(keys, 2)) == sorted(keys) and peers.rotated([], 3) == []


def test_throughput_stats_give_fastest_median_and_relative_spread():
    s = peers.throughput_stats([50.0, 60.0, 55.0, 0.0])
    assert (s["n"], s["fastest"], s["median"]) == (3, 60.0, 55.0)
    assert s["spread"] == pytest.approx(10 / 55)
    assert peers.throughput_stats([]) == {"n": 0, "fastest": 0.0, "median": 0.0, "spread": None}


def _model(*, lms_batch: int, lms_thr: float, swapped: int, peer_batch: int = 55, peer_thr: float = 50.0,
           spread: float = 0.05) -> dict:
    def method(batch: int) -> dict:
        return {"status": "measured", "largest": {"batch": batch, "closed": True, "throughput": 40.0,
                                                   "peak_bytes": 540 * MiB, "tried": [[batch, "fits"]]}}

    return {"methods": {"plain": method(28), "recompute_grad_stage": method(peer_batch),
                        "remat_full": {"status": "unsupported", "reason": "ValueError: no kwargs"},
                        "lms_config": method(lms_batch)},
            "common": {"batch": 25, "fits": {"plain": 2, "recompute_grad_stage": 2, "lms_config": 2},
                       "throughput": {"plain": {"n": 2, "fastest": peer_thr, "median": peer_thr, "spread": spread},
                                      "recompute_grad_stage": {"n": 2, "fastest": 40.0, "median": 39.0,
                                                               "spread": spread},
                                      "lms_config": {"n": 2, "fastest": lms_thr, "median": lms_thr,
                                                     "spread": spread}},
                       "lms_summary": {"lms_config": {"n_swapped": swapped, "swapped_bytes": 300 * MiB}}}}


def test_lms_ahead_on_batch_and_throughput_makes_the_claim_hold():
    lines = peers.verdict_lines(_model(lms_batch=165, lms_thr=55.0, swapped=136))
    assert any("ahead of every peer" in ln and "3.00x" in ln for ln in lines)
    assert not any("BEATS" in ln for ln in lines)
    assert lines[-1].endswith(": holds")


def test_a_faster_peer_at_the_common_batch_is_named_with_the_swaps_as_the_cause():
    lines = peers.verdict_lines(_model(lms_batch=165, lms_thr=40.0, swapped=136))
    beats = [ln for ln in lines if "BEATS" in ln]
    assert len(beats) == 1 and beats[0].startswith("plain tf.function BEATS LMS, given config on throughput")
    assert "50.0 vs 40.0" in beats[0] and "0.80x" in beats[0] and "still swaps 136 tensors (300 MiB" in beats[0]
    assert "does not hold: 0.80x the best peer's throughput at batch 25" in lines[-1]


def test_without_swaps_a_small_gap_is_called_noise_and_a_large_one_is_not():
    small = peers.verdict_lines(_model(lms_batch=165, lms_thr=48.0, swapped=0, spread=0.10))
    assert any("swapped nothing" in ln and "within the spread of the processes (10%)" in ln for ln in small)
    large = peers.verdict_lines(_model(lms_batch=165, lms_thr=30.0, swapped=0, spread=0.10))
    assert any("more than the spread" in ln for ln in large)


def test_a_peer_with_a_larger_batch_beats_lms_on_the_batch():
    lines = peers.verdict_lines(_model(lms_batch=50, lms_thr=55.0, swapped=10, peer_batch=55))
    assert "tf.recompute_grad per stage BEATS LMS, given config on the largest batch: 55 > 50" in lines
    assert lines[-1].endswith("does not hold: a peer fits as large a batch or larger")


def test_the_measured_table_shows_ratios_to_plain_the_common_batch_and_why_a_method_did_not_run():
    text = "\n".join(peers.measured_table(_model(lms_batch=165, lms_thr=55.0, swapped=136)))
    assert "@25 fastest/median" in text
    lms = next(ln for ln in text.splitlines() if ln.startswith("LMS, given config"))
    assert lms.split()[3:5] == ["165", "5.89"] and "55.0 /  55.0 (2/2 fit)" in lms
    assert "RematScope(full)" in text and "unsupported: ValueError: no kwargs" in text


def test_the_predicted_table_says_what_the_simulator_cannot_express():
    pred = {"rows": {"plain": {"batch": 198, "throughput": 300.0, "how": "plain graph"},
                     "grappler_recompute": {"batch": None, "why": "rewritten inside TF's runtime"},
                     "lms_config": {"batch": 990, "throughput": 180.0, "how": "planned"}}}
    text = "\n".join(peers.predicted_table(pred))
    assert "not expressed: rewritten inside TF's runtime" in text
    assert any(ln.split()[3:6] == ["990", "5.00", "180.0"] for ln in text.splitlines() if ln.startswith("LMS"))


@pytest.mark.parametrize("values, error", [
    (["foo"], "--models 'foo': allowed values are resnet50, gpt2"),
    ([","], "--models: give at least one of"),
])
def test_pick_refuses_unknown_or_empty_lists(values, error):
    with pytest.raises(peers.BadArgs, match=error.replace("(", r"\(").replace(")", r"\)")):
        peers.pick(values, list(peers.MODELS), "models")


def test_pick_accepts_commas_and_spaces_and_drops_repeats():
    assert peers.pick(["plain,lms_auto", "plain"], peers.METHOD_KEYS, "methods") == ["plain", "lms_auto"]
    assert peers.pick(None, ["a", "b"], "x") == ["a", "b"]


@pytest.mark.parametrize("args, message", [
    (["--models", "vgg"], "--models 'vgg': allowed values are resnet50, gpt2"),
    (["--methods", "plain,zero"], "--methods 'zero': allowed values are plain,"),
    (["--repeats", "0"], "--repeats 0: must be an integer >= 1"),
    (["--rounds", "x"], "argument --rounds: invalid int value: 'x'"),
    (["--budget-gib", "-1"], "--budget-gib -1.0: must be a positive number"),
    (["--device", "X100"], "--device 'X100': unknown device"),
    (["--no-predicted", "--predicted-only"], "--no-predicted and --predicted-only exclude each other"),
    (["--common-only"], "--common-only needs --common-batch N"),
])
def test_bad_arguments_print_one_line_and_exit_2(args, message):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers.py"), *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("peers.py: error: ") and message in lines[0]
    assert proc.stdout == ""


def test_peers_faster_at_their_own_smaller_batch_are_named_with_the_swaps_lms_pays_for_its_batch():
    model = _model(lms_batch=165, lms_thr=55.0, swapped=136)
    model["methods"]["plain"]["largest"]["throughput"] = 60.0
    model["methods"]["lms_config"]["lms_summary_at_largest"] = {"n_swapped": 136}
    line = next(ln for ln in peers.verdict_lines(model) if ln.startswith("faster at their own"))
    assert "plain tf.function 60.0 at 28" in line and "recompute" not in line
    assert line.endswith("(136 tensors swapped out and back per step)")


def test_a_peer_with_the_same_batch_ties_and_the_claim_does_not_hold():
    lines = peers.verdict_lines(_model(lms_batch=55, lms_thr=55.0, swapped=10, peer_batch=55))
    assert "tf.recompute_grad per stage TIES with LMS, given config on the largest batch: 55" in lines
    assert lines[-1].endswith("does not hold: a peer fits as large a batch or larger")


def _step(throughput: float, *, stall: float = 0.0, moved_gib: float = 0.0) -> dict:
    return {"what": "x", "step_s": 1.0, "compute_s": 1.0, "stall_s": stall, "transfer_bytes": int(moved_gib * (1 << 30)),
            "throughput": throughput}


def test_predicted_verdicts_name_ties_and_faster_peers_with_the_link_time_as_the_cause():
    pred = {"rows": {"recompute_grad_stage": {"batch": 20}, "lms_auto": {"batch": 20}},
            "pairs": [{"lms": "lms_auto", "peer": "recompute_grad_stage", "batch": 20,
                       "lms_step": _step(1.6, stall=6.9, moved_gib=262.0), "peer_step": _step(2.9)}]}
    lines = peers.predicted_verdicts(pred)
    assert lines[0] == "tf.recompute_grad per stage TIES with LMS, config='auto' on the largest batch: 20 vs 20"
    assert lines[1].startswith("tf.recompute_grad per stage BEATS LMS, config='auto' on throughput at batch 20")
    assert "2.9 vs 1.6 samples/s (0.55x)" in lines[1] and "6.90 s waiting on the host link (262.0 GiB" in lines[1]
    pred["pairs"][0]["peer_step"] = _step(1.6)
    assert len(peers.predicted_verdicts(pred)) == 1  # equal speed: no verdict


# ---- the tuner at the common batch (benchmarks/peer_tuned.py) -------------------------------------------------

def test_the_tuner_is_asked_for_the_batch_with_the_same_budget_and_every_model_option(tmp_path):
    cmd = peer_tuned.tuner_command("gpt2_small", {"seq_len": 512, "n_layers": 2}, batch=4, budget_bytes=256 * MiB,
                                   study="gpt2-batch4", studies_dir=tmp_path, backend="simulate", device="P100-16GB",
                                   trials=80)
    assert cmd[:4] == [sys.executable, "-m", "tuner", "search"]
    flags = dict(zip(cmd[4::2], cmd[5::2]))
    assert flags["--budget"] == "256MiB" and flags["--batch"] == "4" and flags["--backend"] == "simulate"
    assert flags["--device"] == "P100-16GB" and flags["--trials"] == "80" and flags["--seed"] == "0"
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--model-option"] == ["seq_len=512", "n_layers=2"]
    assert cmd[-1] == "--no-report"
    odd = peer_tuned.tuner_command("m", {}, batch=1, budget_bytes=MiB + 1, study="s", studies_dir=tmp_path)
    assert odd[odd.index("--budget") + 1] == f"{MiB + 1}B"


def test_a_recommendation_is_read_with_its_config_and_whether_lms_is_on(tmp_path):
    from lms.config import LMSConfig

    path = tmp_path / "recommended.json"
    assert peer_tuned.read_recommendation(path)["config"] is None  # no file: nothing recommended
    path.write_text('{"schema": "lms.config", "schema_version": 3, "config": ' +
                    __import__("json").dumps(LMSConfig(n_tensors=0).to_dict()) + "}")
    off = peer_tuned.read_recommendation(path)
    assert off["config"]["n_tensors"] == 0 and off["lms_on"] is False
    path.write_text('{"schema": "lms.config", "schema_version": 3, "config": ' +
                    __import__("json").dumps(LMSConfig(n_tensors=12, lb=4).to_dict()) + "}")
    on = peer_tuned.read_recommendation(path)
    assert on["config"]["n_tensors"] == 12 and on["config"]["lb"] == 4 and on["lms_on"] is True


def _common(**fastest: tuple[float, float]) -> dict:
    return {"batch": 16, "throughput": {k: {"n": 2, "fastest": f, "median": f, "spread": sp}
                                        for k, (f, sp) in fastest.items()}}


@pytest.mark.parametrize("mine, spread, verdict", [
    (86.0, 0.02, "no slower: the tuner reaches the peers there"),
    (83.0, 0.05, "within the spread of the processes (5%): the tuner reaches the peers there"),
    (70.0, 0.05, "more than the spread of the processes (5%): the peer's point is NOT reached"),
])
def test_the_tuned_verdict_compares_with_the_fastest_peer_and_the_spread(mine, spread, verdict):
    labels = {m.key: m.label for m in peers.METHODS}
    common = _common(plain=(85.0, spread), recompute_grad_stage=(68.0, 0.01), lms_tuned=(mine, 0.01),
                     lms_config=(90.0, 0.0))  # an LMS method is never "the fastest peer"
    line = peer_tuned.tuned_verdict(common, peers=["plain", "recompute_grad_stage"], labels=labels)
    assert line.startswith(f"LMS, tuned at the common batch (16): {mine:.1f} samples/s, "
                           f"{mine / 85.0:.2f}x the fastest peer (plain tf.function, 85.0)")
    assert line.endswith(verdict)
    assert peer_tuned.tuned_verdict(_common(plain=(85.0, 0.0)), peers=["plain"], labels=labels) is None


def test_the_measured_table_shows_a_method_timed_only_at_the_common_batch_and_the_tuners_command():
    model = _model(lms_batch=165, lms_thr=55.0, swapped=136)
    model["common"]["throughput"]["lms_tuned"] = {"n": 2, "fastest": 84.0, "median": 80.0, "spread": 0.05}
    model["common"]["fits"]["lms_tuned"] = 2
    model["tuned"] = {"command": "python -m tuner search --batch 25", "exit": 0, "wall_s": 200.0,
                      "config": {"n_tensors": 0}}
    lines = peers.measured_table(model)
    row = next(ln for ln in lines if ln.startswith("LMS, tuned at the common batch"))
    assert "84.0 /  80.0 (2/2 fit)" in row
    assert lines[-1] == ("the tuner at batch 25: python -m tuner search --batch 25 -> exit 0 in 200 s, "
                         "config {'n_tensors': 0}")


def test_a_method_timed_only_at_the_common_batch_is_not_judged_on_the_largest_batch_when_predicted():
    pred = {"rows": {"recompute_grad_stage": {"batch": 20}, "lms_tuned": {"batch": 20}},
            "pairs": [{"lms": "lms_tuned", "peer": "recompute_grad_stage", "batch": 20,
                       "lms_step": _step(3.0), "peer_step": _step(2.9)}]}
    assert peers.predicted_verdicts(pred) == [
        "LMS, tuned at the common batch at batch 20: 3.0 samples/s, no slower than tf.recompute_grad per stage "
        "(2.9): the tuner reaches its point"]


@pytest.mark.parametrize("module", [peers, peer_tuned], ids=["peers", "peer_tuned"])
def test_the_docstring_examples_hold(module):
    import doctest

    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
