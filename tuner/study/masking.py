"""Secrets in storage URLs: masked by rule wherever a URL or a message may show them.

A storage URL can carry secrets in two places: the password of its user
(``postgresql://user:secret@host/db``) and its query (``?sslpassword=...``,
``?pass%77ord=...``, which SQLAlchemy decodes into the login password, a
driver's key options). `mask_url` masks both; `mask_secrets` masks them in any
text: every URL in it, and each secret where it stands whole (not inside a
longer word, so a one-letter password does not mask that letter everywhere).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

__all__ = ["mask_url", "mask_secrets", "sqlalchemy_url"]


def mask_url(url: str) -> str:
    """``postgresql://u:secret@h/db?sslpassword=k`` -> ``postgresql://u:***@h/db?sslpassword=***``.

    The password is found the way SQLAlchemy finds it (`sqlalchemy.engine.make_url`,
    shown with ``render_as_string(hide_password=True)``), so a password holding
    ``/``, ``:``, ``#``, ``?``, ``%`` or spaces is masked whole. A raw ``@`` in a
    password (which SQLAlchemy would split at) and strings SQLAlchemy cannot
    parse fall back to masking everything between ``user:`` and the last ``@``.
    Every query value is masked too, whatever its key is called (``sslpassword``,
    ``pass%77ord``, which SQLAlchemy decodes into the login password, a driver's
    ``sslkey``), except the few options known to hold no secret (`_PLAIN_QUERY_KEYS`).
    """
    if _userinfo_password(url) is None:
        return _mask_query(url)
    parsed = sqlalchemy_url(url)
    if parsed is not None and parsed.password is not None and url.count("@") == 1:
        return _mask_query(parsed.render_as_string(hide_password=True))
    return _mask_query(_USERINFO.sub(r"\1:***@", url, count=1))


# scheme://user:password@rest, the password running to the *last* "@" (over-masking is the safe side)
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):(.*)@", re.DOTALL)
#: Query options that name no secret (compared %-decoded, case-insensitively); every other value is masked.
_PLAIN_QUERY_KEYS = frozenset({"sslmode", "connect_timeout", "application_name", "charset", "client_encoding",
                               "target_session_attrs", "gssencmode", "host", "port", "dbname", "user",
                               "username"})
_QUERY_ITEM = re.compile(r"([?&;])([^=&;#?]*)=([^&;#]*)")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _secret_key(key: str) -> bool:
    return unquote(key.replace("+", " ")).strip().lower() not in _PLAIN_QUERY_KEYS


def _mask_query(url: str) -> str:
    if "?" not in url:
        return url
    head, sep, query = url.partition("?")
    return head + _QUERY_ITEM.sub(lambda m: m.group(1) + m.group(2) + "=" + ("***" if _secret_key(m.group(2))
                                                                             else m.group(3)), sep + query)


def _query_secrets(url: str) -> list[str]:
    if "?" not in url:
        return []
    query = "?" + url.partition("?")[2]
    return [m.group(3) for m in _QUERY_ITEM.finditer(query) if _secret_key(m.group(2)) and m.group(3)]


def _userinfo_password(url: str) -> str | None:
    m = _USERINFO.match(url)
    return m.group(2) if m else None


def sqlalchemy_url(url: str) -> Any:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url)
    except Exception:  # not a URL SQLAlchemy reads (journal:, garbage): the regex fallback masks it
        return None


def _secrets(url: str) -> list[str]:
    """Every form in which `url`'s secrets (password, masked query values) may appear (raw, %-decoded, %-encoded)."""
    found: list[str] = []
    raw = _userinfo_password(url)
    candidates = [raw] if raw else []
    parsed = sqlalchemy_url(url)
    if parsed is not None and parsed.password:
        candidates.append(str(parsed.password))
    # the query as written, and as SQLAlchemy read it (it moves a query "password" into the login)
    candidates += _query_secrets(url.split("@", 1)[1] if raw is not None and "@" in url else url)
    if parsed is not None:
        candidates += [str(v) for k, vs in parsed.query.items() if _secret_key(k)
                       for v in ((vs,) if isinstance(vs, str) else vs)]
    if raw and "@" in raw:  # SQLAlchemy would take the part after the first "@" for the host: hide its pieces
        candidates += [piece for piece in raw.split("@") if len(piece) >= 3]
    for secret in candidates:
        if secret and secret != "***":
            found += [secret, unquote(secret), quote(unquote(secret), safe=""), quote(unquote(secret))]
    return sorted({s for s in found if s and s != "***"}, key=len, reverse=True)


def mask_secrets(text: str, url: str | None) -> str:
    """`text` with every secret of the storage URL `url` replaced by ``***``, by rule:

    - the URL itself, and any other URL in the text (a driver's or SQLAlchemy's rendering, which
      hides the password but not the query), go through `mask_url`;
    - a secret elsewhere (raw, %-decoded or %-encoded) is masked where it stands whole, as a value:
      not inside a longer word (``user:secret@``, ``password='secret'``, ``(secret)``), so a
      one-letter password does not mask that letter in every word of the message.
    """
    if not url:
        return text
    text = text.replace(url, mask_url(url))
    if "://" in url:  # the URL with another driver named (SQLAlchemy's engine URL), password spaces and all
        rest = re.escape(url.split("://", 1)[1])
        text = re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://" + rest, lambda m: mask_url(m.group(0)), text)
    text = _URL_IN_TEXT.sub(lambda m: mask_url(m.group(0)), text)
    for secret in _secrets(url):
        text = re.sub(r"(?<![A-Za-z0-9])" + re.escape(secret) + r"(?![A-Za-z0-9])", "***", text)
    return text
