"""A PostgreSQL store URL read strictly the way libpq splits it, and shown only rebuilt without its password.

A URL with a password that libpq misreads puts the password (or part of it) where messages look: libpq
takes `postgresql://u:Sec@ret@host/db` as the password "Sec" on the host "ret@host", and
`postgresql://u:Sec/ret@host/db` as the host "u" with the port "Sec"; its own parse errors quote the
offending text whole ("invalid percent-encoded token", an unclosed IPv6 bracket quotes the URL). So every
part of synapolis that names the store goes through `parse` first (the config check, the store, doctor):
what does not parse strictly is refused with a reason that quotes nothing of the URL, and what parses is
shown by `describe`, rebuilt from the parsed user, hosts, ports and database, never from the text. No
import of the driver: the config check runs on every CLI call.
"""

from __future__ import annotations

import re

SCHEMES = ("postgresql://", "postgres://")
_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")  # a `%` not followed by two hex digits
_HOST = re.compile(r"[A-Za-z0-9._~%-]*")  # a name, an IPv4 address, or a %-escaped socket folder (%2Ftmp)
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%25[A-Za-z0-9._~-]+)?")  # the inside of [...]: an address, %25 and a zone
_PORT = re.compile(r"[0-9]*")
_KEY = re.compile(r"[a-z_]+")


class BadURL(ValueError):
    """A store URL that does not parse; its message never holds any of the URL's text."""


def _decode(text: str) -> str:
    from urllib.parse import unquote

    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise BadURL("a %-escape does not decode as UTF-8") from None


def parse(url: str) -> dict:
    """The parts of a postgresql:// URL (decoded): `user`, `password`, `hosts` (a list of (host, port)),
    `dbname`, `params` (the query's other keys); BadURL when libpq might read it otherwise than as
    written. Stricter than libpq where libpq's reading could move a password into a shown part: the only raw
    `@` allowed ends the user and password, a port is digits, a host is a name, an address or [IPv6]."""
    if not isinstance(url, str) or not url.startswith(SCHEMES):
        raise BadURL("it does not start with postgresql://")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise BadURL("it holds a space or a control character (write a space as %20)")
    if _ESCAPE.search(url) or "%00" in url:
        raise BadURL("it holds a % that is not a %-escape of two hex digits (write a % itself as %25)")
    rest = url.split("://", 1)[1]
    user = password = None
    # libpq's look-ahead: the user (and password) end at the first `@` before any `/`
    head = re.match(r"[^@/]*", rest).group(0)
    if rest[len(head):len(head) + 1] == "@":
        user, colon, secret = head.partition(":")
        password = secret if colon else None
        rest = rest[len(head) + 1:]
    if "@" in rest:
        raise BadURL("it holds an @ after the one that ends the user and password "
                     "(write an @ in a password or user name as %40, a / as %2F)")
    netloc = re.match(r"[^/?]*", rest).group(0)
    rest = rest[len(netloc):]
    hosts = []
    for spec in netloc.split(",") if netloc else []:
        if spec.startswith("["):
            inside, closed, after = spec[1:].partition("]")
            if not closed:
                raise BadURL("an IPv6 address's [ is not closed by ]")
            if not _IPV6.fullmatch(inside):
                raise BadURL("an IPv6 address in [ ] holds something else than hex digits, colons and a %25 zone")
            if after and not after.startswith(":"):
                raise BadURL("something follows an IPv6 address's ] other than :port")
            host, port = inside, after[1:]
        else:
            host, _colon, port = spec.partition(":")
            if "[" in spec or "]" in spec or not _HOST.fullmatch(host):
                raise BadURL("a host holds a character that no host name has (a / in a password must be "
                             "written %2F)")
        if not _PORT.fullmatch(port):
            raise BadURL("a port is not a number (a : or / in a password must be written %3A or %2F)")
        hosts.append((_decode(host), port))
    dbname = None
    if rest.startswith("/"):
        path, _q, query = rest[1:].partition("?")
        if "/" in path or "[" in path or "]" in path:
            raise BadURL("the database name holds a / (write it as %2F)")
        dbname = _decode(path) or None
    else:
        query = rest[1:] if rest.startswith("?") else ""
    params = {}
    for pair in query.split("&") if query else []:
        key, equals, value = pair.partition("=")
        if not equals or "=" in value or not _KEY.fullmatch(key):
            raise BadURL("its query is not key=value pairs joined by &")
        params[key] = _decode(value)
    password = params.pop("password", _decode(password) if password is not None else None)
    return {"user": params.pop("user", _decode(user) if user else None), "password": password,
            "hosts": hosts, "dbname": params.pop("dbname", dbname), "params": params}


def problem(url: str) -> str | None:
    """Why `url` does not parse (a sentence that quotes none of it), or None when it does."""
    try:
        parse(url)
    except BadURL as exc:
        return str(exc)
    return None


def describe(url: str) -> str:
    """`postgresql://user@host:port/dbname` rebuilt from the parsed parts, never the password or the query;
    a URL that does not parse is named as such, with nothing of its text."""
    try:
        parts = parse(url)
    except BadURL:
        return "postgresql://(a URL that does not parse)"
    params = parts["params"]
    hosts = parts["hosts"] or [("", "")]
    if params.get("host") or params.get("hostaddr"):
        named = (params.get("host") or params.get("hostaddr")).split(",")
        hosts = [(host, hosts[0][1]) for host in named]
    if params.get("port"):
        hosts = [(host, params["port"].split(",")[0]) for host, _ in hosts]
    shown = ",".join(("[" + host + "]" if ":" in host else _quote(host) or "localhost") + ":" + (port or "5432")
                     for host, port in hosts)
    user = parts["user"]
    return f"postgresql://{_quote(user) + '@' if user else ''}{shown}/{_quote(parts['dbname'] or '')}"


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")
