"""Issue 28, reliability round three: twenty defects found by hostile use, each through the real CLI.

Each test names its defect by number (see ``issues show 28``). They run the
simulate backend on the tiny cached graph, or the emulated backend with the
test-only fault hook (``LMS_TUNER_FAULT``, `tuner.worker.faults`), so each takes
seconds; the few that trace a model in a worker (TensorFlow) are marked.
The fault-suite figures (trials attempted, recorded, lost, duplicates,
orphans) of the externally killed worker and of the forking user model go
to the terminal summary with the others (tests/tuner/test_faults.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from .conftest import ROOT, TINY_MODEL, postgres_server, report_fault_figures, run_cli
from .test_faults import _worker_alive, figures, worker_pids

SIM = ("--backend", "simulate", "--no-report")

# A user model: the tiny residual CNN, with knobs for hostile behaviour (used by several tests).
USER_MODEL = '''
import dataclasses
import sys
import time

from tuner.models import load_workload


def make_workload(sleep_s=0, spam_mb=0, fail_in_trace=False):
    if "/trace/" in sys.argv[-1]:  # in the trace worker (not in `describe`, which runs in a temporary folder)
        for _ in range(spam_mb):
            sys.stdout.write("spam " * 209716 + "\\n")  # about 1 MiB a line
        sys.stdout.flush()
        if fail_in_trace:
            raise RuntimeError("injected: the model does not load in the trace worker")
    base = load_workload("residual")

    def build_model():
        time.sleep(sleep_s)
        return base.build_model()

    return dataclasses.replace(base, build_model=build_model, spec="", options={}, growable={})
'''

# A user model that forks a child at import (the child sleeps and would outlive the search).
FORK_MODEL = '''
import os
import time

from tuner.models import load_workload

child = os.fork()
if child == 0:
    with open(os.path.join(os.environ["FORK_PIDS"], str(os.getpid())), "w"):
        pass
    time.sleep(120)
    os._exit(0)
# the import returns once the child has said it runs: on a loaded machine it might otherwise not have been
# scheduled before the worker ended and took it down, and the test would see no child at all
for _ in range(200):
    if os.path.exists(os.path.join(os.environ["FORK_PIDS"], str(child))):
        break
    time.sleep(0.05)


def make_workload():
    return load_workload("residual")
'''


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("lms-tuner: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _seed(tmp_path: Path, study: str, graph: dict, *, model: str = TINY_MODEL, options: dict | None = None) -> None:
    """The tiny graph, cached for `study` under the key `model` (a user model wrapping it traces the same graph)."""
    doc = {**graph, "key": {"model": model, "model_options": options or {}}}
    folder = tmp_path / "studies" / study
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.json").write_text(json.dumps(doc))


def _study(tmp_path: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'studies' / name / 'study.db'}")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    env.pop("LMS_TUNER_FAULT", None)
    env.update(extra)
    return env


def _popen(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=cwd, env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and (path.is_dir() or path.stat().st_size)):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        assert proc is None or proc.poll() is None, proc.communicate()
        time.sleep(0.05)


def _wait_for_handlers(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until the CLI catches SIGHUP and SIGTERM (`tuner.cli.exits.StopSignals`): its command has begun."""
    wanted = (1 << (signal.SIGHUP - 1)) | (1 << (signal.SIGTERM - 1))
    deadline = time.monotonic() + timeout
    while True:
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines())
            if int(fields["SigCgt"], 16) & wanted == wanted:
                return
        except (OSError, KeyError, ValueError):
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ================================================================ High

@pytest.mark.slow
def test_01_two_first_runs_with_other_settings_do_not_merge(tmp_path: Path) -> None:
    """The settings record is written before tracing: a second first run with another budget or model is refused."""
    (tmp_path / "slowmodel.py").write_text(USER_MODEL)
    common = ["search", *SIM, "--model", "slowmodel.py:make_workload", "--study", "s", "--trials", "2", "-q"]
    first = _popen([*common, "--model-option", "sleep_s=5", "--seed", "1", "--budget", "64MiB"], tmp_path)
    try:
        _wait_for(tmp_path / "studies" / "s" / "trace" / "request.json", first)  # the first run is tracing now
        others = [_popen([*common, "--model-option", "sleep_s=5", "--seed", "2", "--budget", "1GiB"], tmp_path),
                  _popen([*common, "--seed", "2", "--budget", "64MiB"], tmp_path)]
        budget, model = (subprocess.CompletedProcess(p.args, p.wait(timeout=300), *p.communicate()) for p in others)
    finally:
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert "was created with budget 64.00 MiB, not 1.00 GiB" in _one_line(budget, 2)
    assert "was created with model_options={'sleep_s': 5}, not {}" in _one_line(model, 2)
    doc = json.loads((tmp_path / "studies" / "s" / "recommended.json").read_text())
    assert doc["budget_bytes"] == 64 << 20 and doc["peak_device_bytes"] <= doc["usable_bytes"]
    trials = _study(tmp_path, "s").get_trials(deepcopy=False)
    assert {t.user_attrs["owner"]["pid"] for t in trials if "owner" in t.user_attrs} == {first.pid}


def test_02_secrets_in_query_parameters_and_one_letter_passwords(tmp_path: Path) -> None:
    for url, secret in [("postgresql://tuner:pw@127.0.0.1:1/tdb?sslmode=disable&sslpassword=KEYPASS123", "KEYPASS123"),
                        ("postgresql://tuner@127.0.0.1:1/tdb?pass%77ord=S3cr3tPW", "S3cr3tPW")]:
        proc = run_cli(["search", *SIM, "--model", "mlp", "--study", "l", "--storage", url], cwd=tmp_path, timeout=300)
        line = _one_line(proc, 2)
        assert secret not in proc.stderr + proc.stdout and "is unreachable" in line, line
        assert "=***" in line, line
    # a one-letter password is masked where it stands, not in every word
    proc = run_cli(["list", "--storage", "postgresql://u:e@127.0.0.1:1/db"], cwd=tmp_path, timeout=300)
    line = _one_line(proc, 2)
    assert "storage 'postgresql://u:***@127.0.0.1:1/db' is unreachable: connection to server" in line, line
    assert list(tmp_path.iterdir()) == []


def test_02_a_query_secret_leaks_nowhere_on_a_real_server(postgres_url: str, tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "q")
    url = postgres_url + "?sslmode=disable&sslpassword=KEYPASS123"
    proc = run_cli(["search", "--backend", "simulate", "--model", TINY_MODEL, "--study", "q", "--trials", "2",
                    "--budget", "160MiB", "--storage", url, "-v"], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    best = run_cli(["best", "--study", "q", "--storage", url, "--json"], cwd=tmp_path, timeout=300)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["storage"].endswith("?sslmode=disable&sslpassword=***")
    texts = [proc.stdout, proc.stderr, best.stdout, best.stderr]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert (tmp_path / "reports" / "q" / "index.html").is_file()
    assert not [t for t in texts if "KEYPASS123" in t]
    from tuner.study.storage import engine_url

    study = optuna.load_study(study_name="q", storage=engine_url(postgres_url))
    assert "KEYPASS123" not in json.dumps(study.user_attrs)


# ================================================================ Medium

def _kill_worker(tmp_path: Path, study: str, number: int, sig: int, proc: subprocess.Popen) -> None:
    """Send `sig` to the worker process running trial `number`, found by its request.json."""
    events = tmp_path / "studies" / study / "trials" / f"{number:04d}" / "events.jsonl"
    _wait_for(events, proc)  # the worker wrote its first event: it is running the trial now
    pids = worker_pids(events.with_name("request.json"))
    assert len(pids) == 1, pids
    os.kill(pids[0], sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_03_a_worker_killed_from_outside_keeps_its_trial(sig: int, tmp_path: Path, seed_graph) -> None:
    """kill of a trial's worker (not by the tuner): the trial runs again in a fresh process, nothing is lost."""
    seed_graph(tmp_path / "studies", "k")
    args = ["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "1GiB", "--study", "k", "--seed",
            "0", "--trials", "3", "--screen-trials", "3", "--confirm", "0", "--timeout", "0", "--no-report", "-q"]
    proc = _popen(args, tmp_path, LMS_TUNER_FAULT="hangonce@1,ok@*")
    _kill_worker(tmp_path, "k", 1, sig, proc)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    trials = _study(tmp_path, "k").get_trials(deepcopy=False)
    killed = trials[1]
    assert killed.state == optuna.trial.TrialState.COMPLETE and killed.user_attrs["status"] == "ok"
    assert f"worker killed by {signal.Signals(sig).name}" in killed.user_attrs["killed_first"]
    from tuner.policy.records import counted

    assert sum(1 for t in trials if counted(t)) == 3
    assert all(t.user_attrs.get("status") == "ok" for t in trials if counted(t))
    f = figures(_study(tmp_path, "k"), {1: f"external {signal.Signals(sig).name}"})
    report_fault_figures(f"worker killed from outside ({signal.Signals(sig).name}; run again in a fresh process)", f)
    assert f["lost"] == 0 and f["duplicates"] == 0


def test_04_children_forked_by_the_model_do_not_outlive_the_search(tmp_path: Path, tiny_graph_doc: dict) -> None:
    (tmp_path / "forkmodel.py").write_text(FORK_MODEL)
    pids = tmp_path / "pids"
    pids.mkdir()
    _seed(tmp_path, "f", tiny_graph_doc, model="forkmodel.py:make_workload")
    proc = run_cli(["search", *SIM, "--model", "forkmodel.py:make_workload", "--study", "f", "--trials", "3",
                    "--budget", "160MiB", "-q"], cwd=tmp_path, env={"FORK_PIDS": str(pids)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    forked = [int(p.name) for p in pids.iterdir()]
    assert forked, "the model's import forked no child"
    alive = [pid for pid in forked if _alive(pid)]
    for pid in alive:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    f = figures(_study(tmp_path, "f"), {}, orphans=len(alive))
    report_fault_figures("a user model that forks a child at import (the worker's process group is ended)", f)
    assert alive == [] and f["lost"] == 0 and f["duplicates"] == 0


def _read_only(folder: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run the CLI with `folder` read-only: a read-only bind mount in a private mount namespace (root), else
    chmod (any other user, for whom the mode holds)."""
    env = _env()
    cli = [sys.executable, "-m", "tuner", *args]
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.iterdir()]}
        for p in modes:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            return subprocess.run(cli, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "-m", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("root without a private mount namespace (unshare -m): cannot make a folder read-only")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift && exec "$@"'
    return subprocess.run([unshare, "-m", "sh", "-c", script, "sh", str(folder), *cli], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_05_a_study_on_read_only_storage_can_be_read(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "ro")
    assert run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "ro", "--trials", "3", "--budget", "160MiB",
                    "-q"], cwd=tmp_path, timeout=300).returncode == 0
    folder = tmp_path / "studies" / "ro"
    (folder / "recommended.json").unlink()  # `best` computes it from the storage
    before = _files(folder)
    listed = _read_only(folder, ["list"], tmp_path)
    assert listed.returncode == 0 and "UNREADABLE" not in listed.stdout + listed.stderr, listed.stdout + listed.stderr
    assert any(line.split()[:2] == ["ro", "3"] for line in listed.stdout.splitlines()), listed.stdout
    best = _read_only(folder, ["best", "--study", "ro", "--json"], tmp_path)
    assert best.returncode == 0 and json.loads(best.stdout)["study"] == "ro", best.stderr
    report = _read_only(folder, ["report", "--study", "ro", "--reports-dir", str(tmp_path / "out")], tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "out" / "ro" / "index.html").is_file()
    assert _files(folder) == before


def test_06_a_study_that_is_not_ours_is_never_taken_over(tmp_path: Path, seed_graph) -> None:
    journal = ["--storage", "journal:j.log"]
    seed_graph(tmp_path / "studies", "x.simulated")
    assert run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "x.simulated", "--trials", "3", "--budget",
                    "160MiB", "-q", *journal], cwd=tmp_path, timeout=300).returncode == 0
    seed_graph(tmp_path / "studies", "x")
    measured = ["search", "--backend", "emulated", "--model", TINY_MODEL, "--trials", "1", "--screen-trials", "2",
                "--confirm", "0", "--budget", "1GiB", "--no-report", "-q", *journal]
    clash = run_cli([*measured, "--study", "x"], cwd=tmp_path, env={"LMS_TUNER_FAULT": "ok@*"}, timeout=300)
    assert ("study 'x.simulated' in journal:j.log is a study of its own, not the screening study of study 'x'"
            in _one_line(clash, 2))
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    def storage() -> JournalStorage:
        return JournalStorage(JournalFileBackend(str(tmp_path / "j.log")))

    assert sorted(optuna.study.get_all_study_names(storage())) == ["x.simulated"]  # nothing was created
    # a plain Optuna study (one objective, minimised) with trials of its own
    foo = optuna.create_study(study_name="foo", storage=storage())
    foo.optimize(lambda t: t.suggest_float("a", 0, 1), n_trials=3)
    seed_graph(tmp_path / "studies", "foo")
    taken = run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "foo", "--trials", "2", *journal],
                    cwd=tmp_path, timeout=300)
    assert "study 'foo' in journal:j.log was not made by lms-tuner (3 trials" in _one_line(taken, 2)
    foo = optuna.load_study(study_name="foo", storage=storage())
    assert foo.user_attrs == {} and len(foo.trials) == 3
    # a measured search's screening study is not a study of its own
    seed_graph(tmp_path / "studies", "y")
    assert run_cli([*measured, "--study", "y"], cwd=tmp_path, env={"LMS_TUNER_FAULT": "ok@*"},
                   timeout=300).returncode == 0
    seed_graph(tmp_path / "studies", "y.simulated")
    screen = run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "y.simulated", "--trials", "9", *journal],
                     cwd=tmp_path, timeout=300)
    assert "study 'y.simulated' in journal:j.log is the simulated screening study of study 'y'" in _one_line(screen, 2)


def test_07_a_bad_max_batch_is_bad_input_and_a_study_left_unset_takes_the_next_settings(
        tmp_path: Path, tiny_graph_doc: dict) -> None:
    _seed(tmp_path, "mb", tiny_graph_doc)
    before = _files(tmp_path)
    huge = run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "mb", "--max-batch", "9" * 20], cwd=tmp_path,
                   timeout=300)
    assert "--max-batch: 99999999999999999999 must be between 1 and 2147483647" in _one_line(huge, 2)
    assert _files(tmp_path) == before
    ok = run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "mb", "--max-batch", "512", "--trials", "2",
                  "--budget", "160MiB", "-q"], cwd=tmp_path, timeout=300)
    assert ok.returncode == 0, ok.stderr
    # a first run that failed before its setup was stored (here: the model does not load in the trace worker)
    (tmp_path / "usermodel.py").write_text(USER_MODEL)
    spec = "usermodel.py:make_workload"
    _seed(tmp_path, "fix", tiny_graph_doc, model=spec)
    failed = run_cli(["search", *SIM, "--model", spec, "--model-option", "fail_in_trace=true", "--study", "fix",
                      "--budget", "64MiB", "-q"], cwd=tmp_path, timeout=300)
    assert "injected: the model does not load in the trace worker" in _one_line(failed, 2)
    assert "setup" in _study(tmp_path, "fix").user_attrs["tuner"]  # its settings record, never finished
    fixed = run_cli(["search", *SIM, "--model", spec, "--study", "fix", "--budget", "160MiB", "--trials", "2", "-q"],
                    cwd=tmp_path, timeout=300)
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads((tmp_path / "studies" / "fix" / "recommended.json").read_text())["budget_bytes"] == 160 << 20


# ================================================================ Low

def test_08_a_study_name_ending_in_a_newline_is_refused(tmp_path: Path) -> None:
    for args in (["search", *SIM, "--model", "mlp"], ["best"], ["report"]):
        proc = run_cli([*args, "--study", "abc\n"], cwd=tmp_path, timeout=300)
        assert "study name 'abc\\n' is not allowed" in _one_line(proc, 2)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_study(tmp_path: Path, seed_graph) -> Path:
    """A finished simulate study `r` (3 trials); returns its folder."""
    seed_graph(tmp_path / "studies", "r")
    proc = run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "r", "--trials", "3", "--budget", "160MiB",
                    "-q"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "studies" / "r"


def _edit(change):
    def edit(text: str) -> str:
        doc = json.loads(text)
        change(doc)
        return json.dumps(doc)  # NaN is written as NaN, as Python's json does
    return edit


#: recommended.json edited by hand (text -> text), and what `best` must say about it.
TAMPERED = {
    "negative-batch": (_edit(lambda d: d.update(batch_size=-5)), "key 'batch_size'=-5: expected an integer >= 1"),
    "nan-throughput": (_edit(lambda d: d.update(throughput=float("nan"))), "NaN is not a JSON number"),
    "huge-peak": (lambda t: re.sub(r'"peak_device_bytes": \d+', '"peak_device_bytes": 1e400', t, count=1),
                  "number 1e400 is too large"),
    "missing-study": (_edit(lambda d: d.pop("study")), "key 'study'=None: expected a study name"),
    "string-batch": (_edit(lambda d: d.update(batch_size="12")), "key 'batch_size'='12': expected an integer >= 1"),
    "no-sources": (_edit(lambda d: d.update(sources=[])), "key 'sources'=[]: expected an object"),
    "duplicate-key": (lambda t: t.replace("{", '{"batch_size": 3, ', 1), "key 'batch_size' given twice"),
    "deep": (lambda t: t.replace("{", '{"deep": ' + "[" * 100_000 + "]" * 100_000 + ", ", 1), "nested too deeply"),
    "array": (lambda t: "[1, 2, 3]", "not a tuner recommendation"),
}


def test_09_10_best_and_list_check_what_recommended_json_says(small_study: Path) -> None:
    rec = small_study / "recommended.json"
    good = rec.read_text()
    cwd = small_study.parent.parent
    for i, (case, (edit, fragment)) in enumerate(sorted(TAMPERED.items())):
        rec.write_text(edit(good))
        proc = run_cli(["best", "--study", "r", *(["--json"] if i % 2 else [])], cwd=cwd, timeout=300)
        line = _one_line(proc, 1)
        assert f"cannot read {Path('studies/r/recommended.json')}: " in line and fragment in line, (case, line)
        assert proc.stdout == "", case
        if case in ("array", "nan-throughput"):  # `list` blames the file, not the study's database
            listed = run_cli(["list"], cwd=cwd, timeout=300)
            assert listed.returncode == 0 and "UNREADABLE" not in listed.stdout + listed.stderr, listed.stdout
            assert "(unreadable recommended.json)" in listed.stdout, listed.stdout
    # the report is written without a recommendation it cannot trust
    rec.write_text(TAMPERED["huge-peak"][0](good))
    proc = run_cli(["report", "--study", "r"], cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "is not a valid recommendation (" in proc.stderr and "Traceback" not in proc.stderr
    assert (cwd / "reports" / "r" / "index.html").is_file()
    # Ctrl-C while `report` runs: one line, whichever phase it hits (it once printed "Exception ignored ...
    # KeyboardInterrupt" and exited 0)
    rec.write_text(good)
    report = _popen(["report", "--study", "r"], cwd)
    _wait_for_handlers(report)
    report.send_signal(signal.SIGINT)  # somewhere in the report (or after it): every outcome below is checked
    out, err = report.communicate(timeout=300)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert (report.returncode, err.strip()) == (1, "lms-tuner: interrupted (SIGINT)") or (
        report.returncode == 0 and out.startswith("report: ")), (report.returncode, out, err)
    # and what `best --json` prints is JSON
    proc = run_cli(["best", "--study", "r", "--json"], cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr
    from tuner.outputs import strict_json_loads

    assert strict_json_loads(proc.stdout)["study"] == "r"


#: Run as ``python -m probe``: the CLI, interrupted inside code that runs from source text (as dataclasses'
#: methods are built at import), the way the report above was once cut off (exit -2 instead of 1).
INTERRUPT_IN_EXEC = """
import os, signal, time

from tuner.cli import main, run

real_build_parser = run.build_parser


def build_parser():
    exec("os.kill(os.getpid(), signal.SIGINT)\\nwhile True: time.sleep(0.01)", {"os": os, "signal": signal, "time": time})
    return real_build_parser()


run.build_parser = build_parser
raise SystemExit(main())
"""


def test_09_10_an_interrupt_inside_source_text_still_exits_1(tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__main__.py").write_text(INTERRUPT_IN_EXEC)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    proc = subprocess.run([sys.executable, "-m", "probe", "list"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (1, "lms-tuner: interrupted (SIGINT)", "")


def test_11_best_from_the_storage_picks_as_the_search_did(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "p")
    proc = run_cli(["search", *SIM, "--model", TINY_MODEL, "--study", "p", "--trials", "8", "--seed", "0",
                    "--budget", "160MiB", "--prefer", "throughput", "-q", "--json"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    front = written["pareto_front"]
    assert max(p["batch_size"] for p in front) > written["batch_size"]  # the batch rule would pick another
    (tmp_path / "studies" / "p" / "recommended.json").unlink()
    best = run_cli(["best", "--study", "p", "--json"], cwd=tmp_path, timeout=300)
    assert best.returncode == 0, best.stderr
    computed = json.loads(best.stdout)
    assert (computed["trial"], computed["batch_size"]) == (written["trial"], written["batch_size"])
    assert computed["selection"]["prefer"] == "throughput"


def test_12_sighup_stops_a_search_with_a_message(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "h")
    proc = _popen(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "1GiB", "--study", "h",
                   "--trials", "3", "--screen-trials", "3", "--confirm", "0", "--timeout", "0", "--no-report", "-q"],
                  tmp_path, LMS_TUNER_FAULT="hang@*")
    _wait_for(tmp_path / "studies" / "h" / "trials" / "0000" / "events.jsonl", proc)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (proc.returncode, err)
    assert err.strip().splitlines()[-1].startswith("lms-tuner: interrupted") and "Traceback" not in err, err
    assert not _worker_alive(tmp_path / "studies" / "h" / "trials" / "0000" / "request.json")
    t = _study(tmp_path, "h").trials[0]
    assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["status"] == "interrupted"


@pytest.mark.slow
def test_12_sigterm_during_the_final_report_says_so(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "t")
    proc = _popen(["search", "--backend", "simulate", "--model", TINY_MODEL, "--study", "t", "--trials", "2",
                   "--budget", "160MiB", "-q"], tmp_path, PYTHONUNBUFFERED="1")
    for line in proc.stdout:  # the summary ends with "wrote ...": the report is being built now
        if line.startswith("wrote "):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == "lms-tuner: interrupted (SIGTERM)", err
    assert json.loads((tmp_path / "studies" / "t" / "recommended.json").read_text())["study"] == "t"


def test_13_a_model_option_nested_too_deeply_is_bad_input(tmp_path: Path) -> None:
    proc = run_cli(["search", *SIM, "--model", "mlp", "--model-option", "hidden=" + "[" * 100_000], cwd=tmp_path,
                   timeout=300)
    line = _one_line(proc, 2)
    assert "model option hidden=[[[[" in line and "nested too deeply" in line and len(line) < 300, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code, fragment", [
    ("raise RuntimeError('broken at import')", "broken at import"),
    ("import sys\nsys.exit(0)", "its code called sys.exit(0) while loading"),
    ("import os\nos._exit(3)", "exited with code 3 without a result"),
    ("while True:\n    pass", "it did not load within 3 s"),
], ids=["raise", "sys.exit", "os._exit", "endless-loop"])
def test_14_a_model_file_that_does_not_load_is_bad_input(code: str, fragment: str, tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(code + "\n\ndef make_workload():\n    pass\n")
    before = _files(tmp_path)
    proc = run_cli(["search", *SIM, "--model", "broken.py:make_workload", "--trial-timeout", "3"], cwd=tmp_path,
                   timeout=300)
    line = _one_line(proc, 2)
    assert "broken.py" in line and fragment in line, line
    assert _files(tmp_path) == before


def test_15_a_corrupt_journal_is_named(tmp_path: Path) -> None:
    (tmp_path / "bad.log").write_text("this is not a journal\nnor is this\n")  # Optuna forgives a broken last line
    before = _files(tmp_path)
    for args in (["list"], ["best", "--study", "x"], ["search", *SIM, "--model", "mlp", "--study", "x"]):
        proc = run_cli([*args, "--storage", "journal:bad.log"], cwd=tmp_path, timeout=300)
        line = _one_line(proc, 2)
        assert f"{tmp_path / 'bad.log'} is not an Optuna journal file (JSONDecodeError" in line, line
    assert _files(tmp_path) == before
    # reading commands write nothing, not even Optuna's tables into an empty database
    (tmp_path / "empty.db").touch()
    best = run_cli(["best", "--study", "x", "--storage", "sqlite:///empty.db"], cwd=tmp_path, timeout=300)
    assert "study 'x' does not exist in sqlite:///empty.db (it holds no studies)" in _one_line(best, 2)
    listed = run_cli(["list", "--storage", "sqlite:///empty.db"], cwd=tmp_path, timeout=300)
    assert listed.returncode == 0 and listed.stdout == "no studies in sqlite:///empty.db\n", listed.stderr
    assert (tmp_path / "empty.db").stat().st_size == 0


# ================================================================ Misleading messages

def test_16_a_database_server_stopped_mid_run_is_reported_as_such(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "gone")
    with postgres_server() as server:
        proc = _popen(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "1GiB", "--study", "gone",
                       "--trials", "3", "--screen-trials", "3", "--confirm", "0", "--timeout", "0", "--trial-timeout",
                       "3", "--no-report", "-q", "--storage", server.url], tmp_path, LMS_TUNER_FAULT="hang@*")
        _wait_for(tmp_path / "studies" / "gone" / "trials" / "0000" / "events.jsonl", proc)
        server.stop()
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    line = err.strip().splitlines()[-1]
    assert line.startswith("lms-tuner: storage postgresql://tuner:***@127.0.0.1:") and "failed during the search (" \
        in line and "OperationalError" in line, err[-3000:]
    assert "invalid data in the commit" not in err and "Traceback" not in err


def test_17_storage_messages_keep_their_words(tmp_path: Path) -> None:
    proc = run_cli(["best", "--study", "x", "--storage", "postgresql://u:r@127.0.0.1:1/db"], cwd=tmp_path, timeout=300)
    line = _one_line(proc, 2)
    assert "storage 'postgresql://u:***@127.0.0.1:1/db' is unreachable: connection to server" in line
    assert "***efused" not in line and "Connection refused" in line, line


def test_18_long_values_loops_and_a_zero_trial_timeout(tmp_path: Path) -> None:
    proc = run_cli(["search", *SIM, "--model", "mlp", "--budget", "9" * 5000], cwd=tmp_path, timeout=300)
    line = _one_line(proc, 2)
    assert len(line) < 300 and "(5000 characters)" in line, line
    proc = run_cli(["search", *SIM, "--model", "mlp", "--trial-timeout", "0"], cwd=tmp_path, timeout=300)
    assert "--trial-timeout: '0' must be > 0 seconds" in _one_line(proc, 2)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "loop.json").symlink_to("loop.json")
    (tmp_path / "dangling.json").symlink_to("missing.json")
    proc = run_cli(["validate-config", "loop.json"], cwd=tmp_path, timeout=300)
    assert "config file loop.json is a symbolic link loop" in _one_line(proc, 2)
    proc = run_cli(["validate-config", "dangling.json"], cwd=tmp_path, timeout=300)
    assert "config file dangling.json is a symbolic link to a missing file" in _one_line(proc, 2)


def test_19_duplicate_keys_and_scopes_of_another_model(tmp_path: Path, tiny_graph_doc: dict) -> None:
    (tmp_path / "c.json").write_text('{"schema": "lms.config", "schema_version": 1, '
                                     '"config": {"n_tensors": 0, "n_tensors": 7}}')
    proc = run_cli(["validate-config", "c.json"], cwd=tmp_path, timeout=300)
    assert "c.json: key 'n_tensors' is given twice" in _one_line(proc, 2)
    (tmp_path / "graph.json").write_text(json.dumps(tiny_graph_doc))
    code = ("import json, logging, sys\n"
            "from lms import LMSConfig\nfrom lms.graph import Graph\nfrom lms.plan import plan_swaps\n"
            "logging.basicConfig(level=logging.WARNING)\n"
            "graph = Graph.from_dict(json.load(open('graph.json'))['graph'])\n"
            "plan = plan_swaps(graph, LMSConfig(n_tensors=-1, incl_scopes=('conv2_block1_1_conv',)))\n"
            "print(len(plan.swaps))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stderr
    assert "incl_scopes 'conv2_block1_1_conv' name no op of graph" in proc.stderr, proc.stderr
    assert "nothing is swapped" in proc.stderr


def test_20_bad_output_folders_are_bad_input_before_any_work(tmp_path: Path) -> None:
    proc = run_cli(["search", "--backend", "simulate", "--model", "mlp", "--reports-dir", "/dev/null"], cwd=tmp_path,
                   timeout=300)
    assert "--reports-dir /dev/null: /dev/null is not a folder" in _one_line(proc, 2)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "studies" / "foo" / "study.db").mkdir(parents=True)
    before = _files(tmp_path)
    proc = run_cli(["search", *SIM, "--model", "mlp", "--study", "foo"], cwd=tmp_path, timeout=300)
    assert "study.db is not a file" in _one_line(proc, 2)
    assert _files(tmp_path) == before and sorted(p.name for p in (tmp_path / "studies" / "foo").iterdir()) == [
        "study.db"]


def test_20_a_model_printing_without_end_does_not_grow_worker_log(tmp_path: Path) -> None:
    (tmp_path / "usermodel.py").write_text(USER_MODEL)
    proc = run_cli(["search", *SIM, "--model", "usermodel.py:make_workload", "--model-option", "spam_mb=20",
                    "--model-option", "fail_in_trace=true", "--study", "spam", "-q"], cwd=tmp_path, timeout=300)
    assert "injected: the model does not load in the trace worker" in _one_line(proc, 2)
    log = tmp_path / "studies" / "spam" / "trace" / "worker.log"
    size = log.stat().st_size
    assert size <= (2 << 20) + 4096, size
    text = log.read_bytes()
    assert b"bytes of output cut (worker.log keeps the first 1 MiB and the last 1 MiB)" in text
    assert text.count(b"spam") > 100_000
