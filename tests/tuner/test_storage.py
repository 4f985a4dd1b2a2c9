"""Study names, storage URLs, password masking, reachability; nothing created on failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.study.storage import (StorageError, StudyNameError, check_reachable, mask_secrets, mask_url, open_storage,
                           resolve_storage, study_names, validate_study_name)


@pytest.mark.parametrize("name", ["resnet50", "r50-16g", "a.b_c-1", "A" * 100])
def test_valid_study_names(name: str) -> None:
    assert validate_study_name(name) == name


@pytest.mark.parametrize("name, fragment", [
    ("a/b", "path separator"), ("a\\b", "path separator"), ("..", "'..'"), ("x..y", "'..'"),
    ("", "empty"), (".hidden", "not allowed"), ("sp ace", "not allowed"), ("A" * 101, "not allowed"),
])
def test_invalid_study_names(name: str, fragment: str) -> None:
    with pytest.raises(StudyNameError, match=fragment.replace("(", r"\(")):
        validate_study_name(name)


def test_default_storage_is_sqlite_under_studies(tmp_path: Path) -> None:
    spec = resolve_storage(None, "s1", studies_dir=tmp_path / "studies")
    assert spec.kind == "sqlite" and spec.default
    assert spec.path == (tmp_path / "studies" / "s1" / "study.db").absolute()
    assert spec.url == f"sqlite:///{spec.path}"
    check_reachable(spec, create=True)
    assert not (tmp_path / "studies").exists()  # checking creates nothing


@pytest.mark.parametrize("url, kind", [
    ("sqlite:////tmp/x.db", "sqlite"), ("journal:studies/j.log", "journal"), ("journal:///tmp/j.log", "journal"),
    ("postgresql://u:p@h/db", "rdb"), ("postgresql+psycopg2://u@h/db", "rdb"), ("mysql+pymysql://u@h/db", "rdb"),
])
def test_storage_kinds(url: str, kind: str) -> None:
    assert resolve_storage(url, "s").kind == kind


@pytest.mark.parametrize("url, fragment", [
    ("redis://localhost", "unknown scheme 'redis'"), ("notaurl", "not a URL"), ("sqlite://", "give a file"),
    ("sqlite:///:memory:", "give a file"), ("journal:", "no journal file"),
])
def test_bad_storage_urls(url: str, fragment: str) -> None:
    with pytest.raises(StorageError, match=fragment):
        resolve_storage(url, "s")


def test_unreachable_file_storage_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder\n")
    for url in ("sqlite:///afile/sub/x.db", "journal:afile/sub/x.log"):
        with pytest.raises(StorageError, match="not a writable folder"):
            check_reachable(resolve_storage(url, "s"), create=True)
    for url in ("sqlite:///no/x.db", "journal:no/x.log"):  # list/best/report: it must exist
        with pytest.raises(StorageError, match="does not exist"):
            check_reachable(resolve_storage(url, "s"), create=False)
    monkeypatch.chdir("/proc")  # a missing folder outside the current one is more likely a typo
    for url in (f"sqlite:///{tmp_path}/no/x.db", f"journal:{tmp_path}/no/x.log"):
        with pytest.raises(StorageError, match="does not exist"):
            check_reachable(resolve_storage(url, "s"), create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_missing_folder_of_a_new_file_storage_is_created_when_opened(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's journal:./studies/<study>/journal.log works in a fresh directory (issue 12, item 14)."""
    import optuna

    monkeypatch.chdir(tmp_path)
    for url in ("journal:./j/s/journal.log", "sqlite:///q/s/study.db"):
        spec = resolve_storage(url, "s")
        check_reachable(spec, create=True)
        assert not spec.path.parent.exists()  # checking writes nothing
        optuna.create_study(study_name="s", storage=open_storage(spec))
        assert spec.path.is_file()


@pytest.mark.parametrize("url, shown", [
    ("postgresql://bob:s3cret@db.example:5432/optuna", "postgresql://bob:***@db.example:5432/optuna"),
    ("postgresql+psycopg2://bob:p%40ss@h/db", "postgresql+psycopg2://bob:***@h/db"),
    ("mysql://h/db?user=bob&password=s3cret", "mysql://h/db?user=bob&password=***"),
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_mask_secrets_hides_raw_and_decoded_password() -> None:
    url = "postgresql://bob:p%40ss@h/db"
    text = f"could not connect to {url}: password 'p@ss' rejected (p%40ss)"
    masked = mask_secrets(text, url)
    assert "p@ss" not in masked and "p%40ss" not in masked
    assert "bob:***@h/db" in masked


def test_unreachable_server_message_masks_password() -> None:
    spec = resolve_storage("postgresql://bob:Sup3rS3cret@127.0.0.1:1/optuna", "s")
    with pytest.raises(StorageError) as info:
        check_reachable(spec, create=True)
    assert "Sup3rS3cret" not in str(info.value)
    assert "bob:***@127.0.0.1:1/optuna" in str(info.value)


def test_journal_storage_round_trip(tmp_path: Path) -> None:
    import optuna

    spec = resolve_storage(f"journal:{tmp_path}/j.log", "s")
    check_reachable(spec, create=True)
    storage = open_storage(spec)
    optuna.create_study(study_name="s", storage=storage, directions=["maximize", "maximize"])
    assert study_names(open_storage(spec)) == ["s"]
    assert spec.exists()


def test_sqlite_storage_uses_wal(tmp_path: Path) -> None:
    import sqlite3

    import optuna

    spec = resolve_storage(None, "w", studies_dir=tmp_path)
    optuna.create_study(study_name="w", storage=open_storage(spec))
    mode = sqlite3.connect(spec.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


# Passwords holding every character class a password can hold (issue 12, item 1).
TRICKY_PASSWORDS = ["Sl4sh/SeKrit", "At@Secret9", "Co:lon:S3c", "Ha#sh#S3c", "Qu?est?S3c", "Pe%rc%S3c",
                    "Pl+us+S3c", "Sp ace S3c", "Ünï¢ødé-S3c"]


def _url_forms(password: str) -> list[str]:
    """The password as a user may write it in a URL: raw, and %-encoded."""
    from urllib.parse import quote

    return [f"postgresql://u:{password}@127.0.0.1:55432/db", f"postgresql://u:{quote(password, safe='')}@h:1/db",
            f"postgresql+psycopg2://u:{quote(password, safe='')}@h/db?sslmode=disable"]


def _leaks(text: str, password: str) -> list[str]:
    from urllib.parse import quote

    forms = {password, quote(password, safe=""), quote(password)}
    forms |= {part for part in password.replace("@", " ").split() if len(part) >= 4}  # pieces around an '@'
    return sorted(f for f in forms if f in text)


@pytest.mark.parametrize("password", TRICKY_PASSWORDS)
def test_mask_url_hides_every_kind_of_password(password: str) -> None:
    for url in _url_forms(password):
        shown = mask_url(url)
        assert not _leaks(shown, password), (url, shown)
        assert shown.startswith(url.split(":", 1)[0] + "://u:***@"), shown
        message = mask_secrets(f"cannot connect to {url} ({url.replace('postgresql', 'postgresql+psycopg2')}) "
                               f"as u with password {password}", url)
        assert not _leaks(message, password), message


@pytest.mark.parametrize("password", TRICKY_PASSWORDS)
def test_list_with_an_unreachable_server_never_prints_the_password(password: str, tmp_path: Path) -> None:
    from .conftest import run_cli

    url = f"postgresql://u:{password}@127.0.0.1:1/db"
    proc = run_cli(["list", "--storage", url], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "u:***@" in proc.stderr and not _leaks(proc.stdout + proc.stderr, password), proc.stderr
