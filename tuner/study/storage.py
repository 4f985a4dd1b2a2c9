"""Where studies live: study names, storage URLs, and opening them without leaking secrets.

Default: one embedded SQLite file per study, ``studies/<study>/study.db``.
``--storage`` takes any Optuna storage URL, plus a journal file:

- ``sqlite:///path/to/file.db``: one process (or a few on one node, with care);
- ``journal:path/to/file.log`` (or ``journal:///abs/path.log``): an append-only
  Optuna journal file, safe for several processes on one node (file locks);
- ``postgresql://user:password@host/db`` (``postgresql+psycopg2://...``) or
  ``mysql+pymysql://...``: several machines. Needs the driver
  (``pip install 'tflms-tuner[postgres]'``).

A password in a URL (or a secret in its query) is never printed, logged or written:
`tuner.study.masking.mask_url` replaces it with ``***`` and every message built here goes through it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .masking import mask_secrets, mask_url, sqlalchemy_url

__all__ = [
    "StorageSpec", "StorageError", "EmptyStorage", "StudyNameError", "validate_study_name", "resolve_storage",
    "mask_url", "mask_secrets", "engine_url", "open_storage", "storage_lock", "check_reachable", "study_names",
    "storage_failure", "writable_folder", "DEFAULT_STUDIES_DIR",
]

log = logging.getLogger(__name__)

DEFAULT_STUDIES_DIR = Path("studies")
STUDY_DB = "study.db"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # matched whole (fullmatch: no "$" before a final newline)
_RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")
_DRIVERS = {"postgresql": ("psycopg2", "psycopg"), "postgres": ("psycopg2", "psycopg"),
            "mysql": ("pymysql", "MySQLdb"), "mariadb": ("pymysql", "MySQLdb")}
_CONNECT_TIMEOUT_S = 5
# Database servers (several machines): a running trial's process records a heartbeat this often;
# a trial whose heartbeat is older than the grace period is failed and queued again by any worker.
HEARTBEAT_INTERVAL_S = 10
HEARTBEAT_GRACE_S = 60
_CREATE_ATTEMPTS = 5


class StorageError(ValueError):
    """A storage URL that is malformed, of an unknown scheme, or unreachable."""


class EmptyStorage(StorageError):
    """A database opened read-only that holds no Optuna tables: no study was ever stored there."""


class StudyNameError(ValueError):
    """A study name that would not be a plain folder name."""


def validate_study_name(name: str) -> str:
    """Return `name` if it is a plain folder name: letters, digits, ``.``, ``_``, ``-``.

    Raises:
        StudyNameError: empty, too long, a path separator, ``..``, a leading dot, or other characters.
    """
    if not isinstance(name, str) or not name:
        raise StudyNameError("study name is empty; use letters, digits, '.', '_' or '-'")
    if "/" in name or "\\" in name or os.sep in name:
        raise StudyNameError(f"study name {name!r} contains a path separator; use a plain name such as 'resnet50-16g'")
    if ".." in name:
        raise StudyNameError(f"study name {name!r} contains '..'; use a plain name such as 'resnet50-16g'")
    if not _NAME.fullmatch(name):
        raise StudyNameError(
            f"study name {name!r} is not allowed; use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit")
    return name


@dataclass(frozen=True)
class StorageSpec:
    """A resolved storage.

    Attributes:
        url: the full URL (may hold a password: never print it; print `display`).
        kind: ``"sqlite"``, ``"journal"`` or ``"rdb"`` (a database server).
        path: the file for ``sqlite``/``journal``; ``None`` for a server.
        default: True when this is the per-study default under ``studies/``.
    """

    url: str
    kind: str
    path: Path | None = None
    default: bool = False

    @property
    def display(self) -> str:
        """The URL with any password masked, safe to print and store."""
        return mask_url(self.url)

    def exists(self) -> bool:
        """False when the file of a file-based storage is missing (servers: True)."""
        return self.path.is_file() if self.path is not None else True


def resolve_storage(storage: str | None, study: str, *, studies_dir: Path = DEFAULT_STUDIES_DIR) -> StorageSpec:
    """Turn ``--storage`` (or its absence) into a `StorageSpec`; nothing is created.

    Raises:
        StorageError: unknown scheme or malformed URL (message masks passwords).
    """
    if storage is None or storage == "":
        path = (studies_dir / study / STUDY_DB).absolute()
        return StorageSpec(url=f"sqlite:///{path}", kind="sqlite", path=path, default=True)
    if not isinstance(storage, str):
        raise StorageError(f"storage {storage!r}: expected a URL")
    shown = mask_url(storage)
    if storage.startswith("journal:"):
        rest = storage[len("journal:"):]
        if rest.startswith("//"):
            rest = rest[2:]
            if not rest.startswith("/"):
                raise StorageError(f"storage {shown!r}: use journal:///absolute/path.log or journal:relative/path.log")
        if not rest:
            raise StorageError(f"storage {shown!r}: no journal file given, e.g. journal:studies/shared.log")
        return StorageSpec(url=storage, kind="journal", path=Path(rest).absolute())
    m = re.match(r"^([A-Za-z][A-Za-z0-9.-]*)(\+[A-Za-z0-9_]+)?://", storage)
    if not m:
        raise StorageError(
            f"storage {shown!r} is not a URL; use sqlite:///file.db, journal:file.log, "
            "postgresql://user@host/db (or leave --storage out for studies/<study>/study.db)")
    scheme = m.group(1).lower()
    parsed = sqlalchemy_url(storage)
    if parsed is not None and "@" in (parsed.host or ""):
        raise StorageError(f"storage {shown!r}: the password holds a raw '@', which ends it early; write it as "
                           "%40 (and any '%' as %25)")
    if scheme not in _RDB_SCHEMES:
        raise StorageError(
            f"storage {shown!r}: unknown scheme {scheme!r}; supported: sqlite, journal, postgresql, mysql")
    if scheme == "sqlite":
        rest = storage[m.end():]
        if not rest.startswith("/") or rest in ("/", "/:memory:"):
            raise StorageError(f"storage {shown!r}: give a file, e.g. sqlite:///studies/my.db "
                               "(an in-memory database would lose the study)")
        return StorageSpec(url=storage, kind="sqlite", path=Path(rest[1:]).absolute())
    return StorageSpec(url=storage, kind="rdb")


def check_reachable(spec: StorageSpec, *, create: bool) -> None:
    """Fail early, writing nothing, when the storage cannot be used.

    Files: the folder must exist and be writable when `create` (a missing folder
    under the current directory is fine when it can be created; `open_storage`
    makes it). Servers: the driver must be
    installed and a connection must open within a few seconds.

    Raises:
        StorageError: one line, password masked.
    """
    if spec.path is not None:
        folder = spec.path.parent
        if spec.path.exists() and not spec.path.is_file():  # checked first: nothing (no lock file) is made beside it
            raise StorageError(f"storage {spec.display!r}: {spec.path} is not a file")
        if spec.default or (create and not folder.exists() and folder.is_relative_to(Path.cwd())):
            # made when the storage is opened (the default studies/<study>/, or a folder under the current
            # one, e.g. journal:./studies/<study>/journal.log in a fresh directory): check only that it can be.
            # A missing folder elsewhere (sqlite:////no/such/dir/s.db) is more likely a typo: unreachable.
            probe = next((p for p in (folder, *folder.parents) if p.exists()), None)
            if probe is None or not probe.is_dir() or (create and not writable_folder(probe)):
                what = "the study folder" if spec.default else f"the folder of storage {spec.display!r},"
                raise StorageError(f"cannot create {what} {folder}: {probe} is not a writable folder")
            return
        if not folder.is_dir():
            raise StorageError(f"storage {spec.display!r} is unreachable: folder {folder} does not exist")
        if create and not writable_folder(folder):
            raise StorageError(f"storage {spec.display!r} is unreachable: folder {folder} is not writable")
        if spec.path.exists() and not spec.path.is_file():
            raise StorageError(f"storage {spec.display!r}: {spec.path} is not a file")
        return
    scheme = spec.url.split(":", 1)[0].split("+", 1)[0].lower()
    drivers = _DRIVERS.get(scheme, ())
    if drivers and not any(_has_module(d) for d in drivers):
        install = ("pip install 'tflms-tuner[postgres]'" if scheme in ("postgresql", "postgres")
                   else f"pip install {drivers[0]}")
        raise StorageError(
            f"storage {spec.display!r} needs a {scheme} driver ({' or '.join(drivers)}); install it with: {install}")
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(engine_url(spec.url), connect_args=_connect_args(scheme), poolclass=sqlalchemy.pool.NullPool)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:  # any driver error means: cannot use it
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        raise StorageError(mask_secrets(f"storage {spec.display!r} is unreachable: {reason}", spec.url)) from None


def writable_folder(folder: Path) -> bool:
    """Whether a file can be created in `folder` (tried, then removed: os.access says yes to root everywhere)."""
    import tempfile

    if not os.access(folder, os.W_OK):
        return False
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".lms-tuner-probe-"):
            return True
    except OSError:
        return False


def engine_url(url: str) -> str:
    """`url` with an installed driver named when it names none (``postgresql://`` -> ``postgresql+psycopg2://``).

    SQLAlchemy's default PostgreSQL driver differs between versions (psycopg2,
    or psycopg 3 from 2.1); use whichever is installed.
    """
    m = re.match(r"^([A-Za-z][A-Za-z0-9.-]*)://", url)
    if not m or m.group(1).lower() not in _DRIVERS:
        return url
    scheme = m.group(1).lower()
    installed = [d for d in _DRIVERS[scheme] if _has_module(d)]
    if not installed:
        return url
    return f"{m.group(1)}+{installed[0].lower()}://" + url[m.end():]


def _connect_args(scheme: str) -> dict[str, Any]:
    if scheme in ("postgresql", "postgres"):
        return {"connect_timeout": _CONNECT_TIMEOUT_S}
    if scheme in ("mysql", "mariadb"):
        return {"connect_timeout": _CONNECT_TIMEOUT_S}
    return {}


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def open_storage(spec: StorageSpec, *, lock: bool = False, read_only: bool = False) -> Any:
    """An Optuna storage object for `spec` (creates the file/tables if missing, unless `read_only`).

    With `lock` (a search, which may start together with others on a new
    file and race them to create its tables), under `storage_lock`. With
    `read_only` (``best``, ``list``, ``report``) nothing is created or changed:
    no folder, no tables, no journal mode; an SQLite file in a folder this
    process cannot write (a read-only mount, another user's folder) is read
    through a private copy, since SQLite's WAL mode needs its side files there.

    Raises:
        StorageError: the file is not a study storage (a corrupt SQLite file or journal), named.
    """
    if spec.path is not None and not read_only:
        spec.path.parent.mkdir(parents=True, exist_ok=True)
    with storage_lock(spec) if lock else contextlib.nullcontext():
        return _open_storage(spec, read_only=read_only)


def _open_storage(spec: StorageSpec, *, read_only: bool = False) -> Any:
    import optuna

    if spec.kind == "journal":
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        assert spec.path is not None
        try:
            return JournalStorage(JournalFileBackend(str(spec.path)))  # reads the whole log (no lock to read)
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as exc:
            raise StorageError(f"storage {spec.display!r}: {spec.path} is not an Optuna journal file "
                               f"({type(exc).__name__}: {_first_line(exc)})") from None
    url = spec.url
    engine_kwargs: dict[str, Any] = {}
    if spec.kind == "sqlite":
        # Several readers (report, dashboard) may open the file while a search writes.
        engine_kwargs["connect_args"] = {"timeout": 30}
        if read_only and spec.path is not None and not _can_write_beside(spec.path):
            url = f"sqlite:///{_private_copy(spec.path)}"
    else:
        scheme = spec.url.split(":", 1)[0].split("+", 1)[0].lower()
        engine_kwargs["connect_args"] = _connect_args(scheme)
        engine_kwargs["pool_pre_ping"] = True
    heartbeat: dict[str, Any] = {}
    if spec.kind == "rdb" and not read_only:
        heartbeat = {"heartbeat_interval": HEARTBEAT_INTERVAL_S, "grace_period": HEARTBEAT_GRACE_S}
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(engine_url(url), engine_kwargs=engine_kwargs,
                                                     skip_table_creation=read_only, **heartbeat)
            break
        except Exception as exc:
            # Several processes starting at once on an empty database race to create Optuna's tables:
            # the losers see "already exists" / a duplicate key; the tables are there on the next try.
            racing = any(w in str(exc).lower() for w in ("already exists", "duplicate", "unique constraint"))
            if racing and attempt + 1 < _CREATE_ATTEMPTS:
                time.sleep(0.2 + random.random() * 0.5)
                continue
            reason = storage_failure(exc) or str(exc)
            if read_only and "version_info" in reason:  # Optuna's first table: there is nothing to read
                raise EmptyStorage(f"storage {spec.display!r} holds no studies (no Optuna tables)") from None
            raise StorageError(mask_secrets(f"cannot open storage {spec.display!r}: {reason}", spec.url)) from None
    if spec.kind == "sqlite" and not read_only:
        _fast_sqlite(storage)
    return storage


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _can_write_beside(path: Path) -> bool:
    """Whether SQLite can make its side files (``-wal``, ``-shm``) beside `path` and write `path` itself."""
    return writable_folder(path.parent) and os.access(path, os.W_OK)


def _private_copy(path: Path) -> Path:
    """A copy of the SQLite file `path` (with its ``-wal``, so no committed trial is missed), removed at exit.

    Nothing can write a file in a read-only folder, so the copy is the study as it is.
    """
    import atexit
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="lms-tuner-readonly-"))
    atexit.register(shutil.rmtree, folder, True)
    copy = folder / path.name
    shutil.copyfile(path, copy)
    wal = path.with_name(path.name + "-wal")
    if wal.is_file():
        shutil.copyfile(wal, folder / wal.name)
    log.info("%s is in a folder this process cannot write: reading a private copy", path)
    return copy


_DB_MODULES = ("sqlalchemy", "psycopg2", "psycopg", "sqlite3", "pymysql", "MySQLdb")


def storage_failure(exc: BaseException) -> str:
    """The one-line cause when `exc` is the storage failing (a database server gone, a full disk), else "".

    Optuna reports any failed commit as ``StorageInternalError: ... invalid data in the
    commit, e.g. exceeding max length``; the cause is the driver's error in its chain
    (SQLAlchemy's ``DBAPIError.orig``), which is what is said.
    """
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and all(cause is not c for c in chain):
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not any(type(c).__name__ == "StorageInternalError" or (type(c).__module__ or "").startswith(_DB_MODULES)
               for c in chain):
        return ""
    driver = [c.orig for c in chain if isinstance(getattr(c, "orig", None), BaseException)]
    named = [c for c in chain if (type(c).__module__ or "").startswith(_DB_MODULES) and str(c).strip()]
    inner = (driver or named or chain)[0]
    text = " ".join(str(inner).split()) or type(inner).__name__
    return f"{type(inner).__name__}: {text.split(' [SQL:')[0].split(' (Background on')[0][:300]}"


@contextlib.contextmanager
def storage_lock(spec: StorageSpec, *, storage: Any = None) -> Iterator[None]:
    """Hold an exclusive lock shared by every process using the storage `spec`.

    Several searches may start together on one SQLite file or journal. SQLite
    does not lock rows, so two of them could create the tables at once (the
    loser fails on ``alembic_version``), queue the warm start twice, or pop the
    same queued trial (both would run it). The few short steps where that
    matters (opening, setting the study up, asking for a trial) run under this
    lock: ``<storage file>.tuner-lock``, an ``flock`` released when the holder
    exits, even by ``kill -9``. Where the lock file cannot be made (a read-only
    folder, no ``fcntl``) the steps run unlocked. On a database server, given the
    opened `storage`, it is the server's advisory lock (PostgreSQL
    ``pg_advisory_lock``, MySQL ``GET_LOCK``), held by one connection and released
    when it closes (the holder's death included); without `storage` (asking for a
    trial, which the server's row locks already make safe) it is a no-op.
    """
    if spec.path is None:
        with _server_lock(spec, storage):
            yield
        return
    try:
        import fcntl

        handle = open(spec.path.with_name(spec.path.name + ".tuner-lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: The key of the server lock every tuner process takes to set a study up (one per database, held for milliseconds).
_SERVER_LOCK_KEY = 0x4C4D5354554E45  # "LMSTUNE"


@contextlib.contextmanager
def _server_lock(spec: StorageSpec, storage: Any) -> Iterator[None]:
    engine = getattr(storage, "engine", None)
    dialect = getattr(getattr(engine, "dialect", None), "name", "")
    if engine is None or dialect not in ("postgresql", "mysql", "mariadb"):
        yield
        return
    from sqlalchemy import text

    with engine.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _SERVER_LOCK_KEY})
        else:
            conn.execute(text("SELECT GET_LOCK(:k, 600)"), {"k": f"lms-tuner-{_SERVER_LOCK_KEY}"})
        conn.commit()
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a server gone has dropped the lock with the connection
                if dialect == "postgresql":
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _SERVER_LOCK_KEY})
                else:
                    conn.execute(text("SELECT RELEASE_LOCK(:k)"), {"k": f"lms-tuner-{_SERVER_LOCK_KEY}"})
                conn.commit()


def _fast_sqlite(storage: Any) -> None:
    """WAL journal + synchronous=NORMAL: a commit costs microseconds instead of an fsync (~20 ms here).

    Optuna commits once per attribute; with the default rollback journal a
    simulated trial spent most of its time in fsync. WAL is safe for several
    processes on one machine; a power cut can lose the last trials, not corrupt the file.
    """
    from sqlalchemy import event

    engine = getattr(storage, "engine", None)
    if engine is None:
        return

    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", _pragmas)
    engine.dispose()  # connections opened before the listener get replaced


def study_names(storage: Any) -> list[str]:
    """Names of the studies in an open storage."""
    import optuna

    return list(optuna.study.get_all_study_names(storage=storage))
