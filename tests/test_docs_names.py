"""Every dotted `lms.`/`tuner.` name in README.md, docs/*.md and the source's docstrings resolves, and
every path the source's docstrings and comments name exists.

A name in a guide that no test checks drifts (the README once sent users to
``lms.tf.measure.configure_gpu_memory_growth()``, which lives in `lms.tf.allocator`). A name
resolves when importing its longest module prefix and then ``getattr`` along the rest succeeds
(``lms.graph.Op.live``, ``lms.tf.allocator.configure_cpu_allocator``); ``from lms.x import a, b``
lines in code blocks are checked name by name. In the source of `lms`, `tuner` and `benchmarks`, a
name in backticks, single or double (`lms.tf.exact`, ``lms.function``), is checked; the few dotted
strings that are not Python names (the schema ``tuner.graph``, the entry-point group
``lms.document_schemas``) are listed in `NOT_PYTHON_NAMES`, each with what it is. A bare dotted word
in prose is not checked there (``x.lms.config``, a logger's name).

Paths: ``tests/...py``, ``lms/...py``, ``tuner/...py``, ``benchmarks/...py`` and ``docs/...md`` named
in a docstring or a comment of those packages or of the tests exist (a test file moved into
``tests/tuner/`` was still named at its old place in a docstring of ``tests/forked_cli.py``).

Two parts, so the common case stays fast: every name is resolved in a subprocess with TensorFlow
and Keras blocked (well under a second); names that need TensorFlow to resolve (``lms.function``,
``lms.tf.emulate.HOST_COPIES``) are then resolved with TensorFlow by a test marked ``tf``.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import re
import subprocess
import sys
import textwrap
import tokenize
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# A dotted name that starts with lms or tuner, not inside a longer name (``model.lms.summary``) or a
# path (``docs/lms.md``, ``lms/tf/apply.py`` has no dot after ``lms`` anyway).
_NAME = re.compile(r"(?<![\w./\\-])((?:lms|tuner)(?:\.[A-Za-z_]\w*)+)")
_FROM_IMPORT = re.compile(r"^\s*from\s+((?:lms|tuner)(?:\.\w+)*)\s+import\s+\(?([\w\s,]+?)\)?\s*(?:#.*)?$",
                          re.MULTILINE)
# ``lms.md``, ``tuner.md`` (link texts), ``results.json``: file names, not Python names
_FILE_SUFFIXES = {"md", "py", "json", "csv", "html", "png", "txt", "toml", "yaml", "yml", "log", "db"}

#: Dotted names the docs or the source use that are not Python names, each with what it is.
NOT_PYTHON_NAMES = {
    "tuner.recommendation": "the schema name of a recommended.json document (lms.jsonfile), not a module",
    "tuner.graph": "the schema name of the traced graph's JSON document the search caches (graph.json)",
    "lms.document_schemas": "the entry-point group that registers JSON document schemas (lms.config)",
}

NEEDS_TF = "needs TensorFlow"

_SOURCE_REFERENCE = re.compile(r"(?<![`\w.])(``?)((?:lms|tuner)(?:\.[A-Za-z_]\w*)+)(?:\(\))?\1(?!`)")
SOURCE_PACKAGES = ("lms", "tuner", "benchmarks")
SOURCES = sorted(p for package in SOURCE_PACKAGES for p in (ROOT / package).rglob("*.py"))
PATH_SOURCES = sorted([*SOURCES, *(ROOT / "tests").rglob("*.py")])
# A repository path to a module or a guide, not inside a longer path (``studies/x/tests/a.py``)
_SOURCE_PATH = re.compile(r"(?<![\w./-])((?:tests|lms|tuner|benchmarks)/(?:[\w.-]+/)*[\w.-]*\w\.py"
                          r"|docs/(?:[\w.-]+/)*[\w.-]*\w\.md)(?![\w/])")


def names_in(text: str) -> set[str]:
    """The dotted `lms.`/`tuner.` names in a Markdown text (prose, code spans and code blocks)."""
    found = set()
    for match in _NAME.finditer(text):
        name, after = match.group(1), text[match.end():match.end() + 1]
        if after in ("-", "/"):  # a path or a study name: `tuner.x-emulated`, `lms.x/...`
            continue
        if name.rsplit(".", 1)[1] in _FILE_SUFFIXES:
            continue
        found.add(name)
    for match in _FROM_IMPORT.finditer(text):
        module = match.group(1)
        for imported in match.group(2).split(","):
            imported = imported.split(" as ")[0].strip()
            if imported and imported != "*":
                found.add(f"{module}.{imported}")
    return found - set(NOT_PYTHON_NAMES)


def documented_names() -> dict[str, list[str]]:
    """Each name -> the docs (relative paths) that mention it."""
    where: dict[str, list[str]] = {}
    for doc in DOCS:
        for name in names_in(doc.read_text(encoding="utf-8")):
            where.setdefault(name, []).append(str(doc.relative_to(ROOT)))
    return where


def referenced_names() -> dict[str, list[str]]:
    """Each name in backticks in the source of `lms`, `tuner` and `benchmarks` -> the files that mention it."""
    where: dict[str, list[str]] = {}
    for source in SOURCES:
        for match in _SOURCE_REFERENCE.finditer(source.read_text(encoding="utf-8")):
            if match.group(2) in NOT_PYTHON_NAMES:
                continue
            files = where.setdefault(match.group(2), [])
            if str(source.relative_to(ROOT)) not in files:
                files.append(str(source.relative_to(ROOT)))
    return where


def prose_of(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring (module, class, function) of a Python source."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return sorted(found)


def paths_in(source: str) -> list[tuple[int, str]]:
    """(line, path) of each repository path named in the comments and docstrings of a Python source."""
    return [(line + text.count("\n", 0, match.start()), match.group(1))
            for line, text in prose_of(source) for match in _SOURCE_PATH.finditer(text)]


def referenced_paths() -> dict[str, list[str]]:
    """Each path named in a comment or docstring of `lms`, `tuner`, `benchmarks` and the tests -> ``file:line``s."""
    where: dict[str, list[str]] = {}
    for source in PATH_SOURCES:
        for line, path in paths_in(source.read_text(encoding="utf-8")):
            where.setdefault(path, []).append(f"{source.relative_to(ROOT)}:{line}")
    return where


def _all_names() -> dict[str, list[str]]:
    where = documented_names()
    for name, files in referenced_names().items():
        where.setdefault(name, []).extend(files)
    return where


def resolve(name: str) -> object:
    """The object a dotted name names: its longest importable module prefix, then ``getattr`` along the rest.

    Raises LookupError naming the first part that does not exist; ImportError from inside a module
    that exists (TensorFlow blocked, say) propagates.
    """
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i + 1])
        try:
            obj = getattr(obj, parts[i])
            continue
        except AttributeError:
            pass
        try:
            obj = importlib.import_module(prefix)
        except ModuleNotFoundError as e:
            if e.name == prefix or (e.name and prefix.startswith(e.name + ".")):
                raise LookupError(f"{'.'.join(parts[:i])} has no attribute or submodule {parts[i]!r}") from None
            raise
    return obj


def resolve_all(names: list[str]) -> dict[str, str]:
    """Each name -> "ok", NEEDS_TF (its import hit a blocked TensorFlow/Keras), or why it does not resolve."""
    results = {}
    for name in names:
        try:
            resolve(name)
            results[name] = "ok"
        except ImportError as e:
            if (e.name or "").split(".")[0] in ("tensorflow", "keras"):
                results[name] = NEEDS_TF
            else:
                results[name] = f"ImportError: {e}"
        except LookupError as e:
            results[name] = str(e)
    return results


@lru_cache(maxsize=1)
def resolved_without_tensorflow() -> dict[str, str]:
    """`resolve_all` of every name in the docs and docstrings, in a fresh process where ``import tensorflow`` fails."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.modules["tensorflow"] = None  # any "import tensorflow" now raises ImportError
        sys.modules["keras"] = None
        from tests.test_docs_names import resolve_all
        print(json.dumps(resolve_all({sorted(_all_names())!r})))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _broken(results: dict[str, str], where: dict[str, list[str]]) -> list[str]:
    return [f"{name} ({', '.join(where[name])}): {why}" for name, why in sorted(results.items())
            if name in where and why not in ("ok", NEEDS_TF)]


def test_names_are_found_in_prose_code_spans_and_code_blocks():
    text = textwrap.dedent("""\
        Call `lms.function` or lms.enable_lms, see [lms.md](docs/lms.md) and docs/tuner.md.
        `model.lms.summary.n_swapped`, studies/lms.x-emulated/, a study lms.demo-emulated, "schema": "tuner.recommendation".
        ```python
        from lms.sim.host import plan_within_host_budget, HostBudgetError as E  # comment
        x = lms.tf.allocator.configure_cpu_allocator()
        ```
        The end of a sentence names tuner.policy.batch.search_max_batch.
        """)
    assert names_in(text) == {"lms.function", "lms.enable_lms", "lms.sim.host",
                              "lms.sim.host.plan_within_host_budget", "lms.sim.host.HostBudgetError",
                              "lms.tf.allocator.configure_cpu_allocator", "tuner.policy.batch.search_max_batch"}


def test_source_references_are_backticked_names():
    text = 'See `lms.tf.exact`, `lms.function()`, ``tuner.graph``, ``lms.x`y``, `x.lms.config` and lms.graph.\n'
    assert [m.group(2) for m in _SOURCE_REFERENCE.finditer(text)] == ["lms.tf.exact", "lms.function", "tuner.graph"]


def test_paths_are_found_in_comments_and_docstrings_only():
    source = textwrap.dedent('''\
        """Module: see tests/test_planner.py and docs/lms.md."""
        PATH = "tests/in_code.py"  # a comment names lms/plan/swap_plan.py
        def f():
            """Writes benchmarks/results/x.json,
            from benchmarks/plan_apply.py; not studies/x/tests/a.py."""
        ''')
    assert paths_in(source) == [(1, "tests/test_planner.py"), (1, "docs/lms.md"), (2, "lms/plan/swap_plan.py"),
                                (5, "benchmarks/plan_apply.py")]


def test_resolve_follows_modules_then_attributes():
    assert resolve("lms.graph.Op.live") is importlib.import_module("lms.graph").Op.live
    assert resolve("tuner.policy.batch.search_max_batch").__name__ == "search_max_batch"
    with pytest.raises(LookupError, match=r"lms.graph has no attribute or submodule 'nothing_here'"):
        resolve("lms.graph.nothing_here")
    with pytest.raises(LookupError, match=r"lms has no attribute or submodule 'no_such_module'"):
        resolve("lms.no_such_module.x")


def test_the_check_finds_the_names_the_readme_once_had_wrong():
    results = resolve_all(["lms.tf.measure.configure_gpu_memory_growth", "lms.tf.allocator.configure_cpu_allocator"])
    assert results == {"lms.tf.measure.configure_gpu_memory_growth":
                       "lms.tf.measure has no attribute or submodule 'configure_gpu_memory_growth'",
                       "lms.tf.allocator.configure_cpu_allocator": "ok"}


def test_the_names_that_are_not_python_names_are_still_in_the_docs_or_the_source():
    text = "\n".join(p.read_text(encoding="utf-8") for p in [*DOCS, *SOURCES])
    assert [name for name in NOT_PYTHON_NAMES if name not in text] == []


def test_every_name_in_the_docs_resolves_without_tensorflow_or_needs_it():
    results, where = resolved_without_tensorflow(), documented_names()
    assert len(where) > 40, sorted(where)  # the extraction found the docs' names
    assert results["lms.LMSConfig.load"] == "ok"
    broken = _broken(results, where)
    assert not broken, "names in README.md or docs/ that do not resolve:\n" + "\n".join(broken)


def test_every_backticked_name_in_the_packages_source_resolves_without_tensorflow_or_needs_it():
    results, where = resolved_without_tensorflow(), referenced_names()
    assert results["lms.machine.nvml.gpu_inventory"] == "ok"  # docstrings once said lms.nvml.gpu_inventory
    broken = _broken(results, where)
    assert not broken, "names in the source of lms/, tuner/ or benchmarks/ that do not resolve:\n" + "\n".join(broken)


def test_every_path_in_the_sources_docstrings_and_comments_exists():
    where = referenced_paths()
    assert len(where) > 20, sorted(where)  # the extraction found the paths
    missing = [f"{path} ({', '.join(places)})" for path, places in sorted(where.items()) if not (ROOT / path).is_file()]
    assert not missing, "paths in docstrings or comments that do not exist:\n" + "\n".join(missing)


@pytest.mark.tf
def test_every_name_that_needs_tensorflow_resolves_with_it():
    pytest.importorskip("tensorflow")
    needing = sorted(name for name, why in resolved_without_tensorflow().items() if why == NEEDS_TF)
    assert "lms.function" in needing
    results = resolve_all(needing)
    broken = _broken(results, _all_names())
    assert not broken, "names in the docs or docstrings that do not resolve:\n" + "\n".join(broken)
    assert set(results.values()) == {"ok"}
