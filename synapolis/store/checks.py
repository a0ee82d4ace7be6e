"""`synapolis doctor`'s store check (contract §12): reachable, schema version, the server's clock."""

from __future__ import annotations


def check_store(ws, env=None) -> list[dict]:
    """Findings (check, status ok|warn|fail, message, fix) about the store of the opened state directory `ws`
    (None: its config does not load, which is the config check's finding)."""
    import time

    from ..config import STORE_RULE
    from ..errors import SynapolisError
    from ..timeutil import utcnow
    from . import ENV_STORE_URL, store_for, store_url

    def finding(status, message, fix=None, **extra):
        return {"check": "store", "status": status, "message": message, "fix": fix, **extra}

    if ws is None:
        return []  # a broken config is the config check's finding
    try:
        store_url(ws, env)
    except SynapolisError as exc:  # SYNAPOLIS_STORE_URL names no store we know: a finding, not a failed doctor
        return [finding("fail", exc.message, f"set {ENV_STORE_URL} to {STORE_RULE}, or unset it")]
    try:
        store = store_for(ws)
    except SynapolisError as exc:  # a PostgreSQL URL without the driver
        return [finding("fail", exc.message, 'pip install "synapolis[postgres]"')]
    if store.kind == "sqlite":
        return [finding("ok", "store: SQLite in the state directory (one machine); set `store` to a "
                              "postgresql:// URL to share a swarm between machines")]
    try:
        began = time.time()
        version = store.schema_version()
        server = store.now()
        local = utcnow()
        elapsed = time.time() - began
    except SynapolisError as exc:
        return [finding("fail", exc.message, f"check that the server is up and the URL is right ({store.where}); "
                                             "the password comes from the URL, PGPASSWORD or ~/.pgpass")]
    from .postgres import SCHEMA_VERSION

    findings = [finding("ok" if version == SCHEMA_VERSION else "warn",
                        f"store {store.where} is reachable; schema version {version}"
                        + ("" if version == SCHEMA_VERSION else f" (this synapolis writes {SCHEMA_VERSION})"),
                        None if version == SCHEMA_VERSION else "upgrade synapolis on every machine sharing it",
                        schema_version=version, url=store.where)]
    skew = abs((server - local).total_seconds())
    limit = float(ws.config.clock_skew_s)
    if skew > limit:
        findings.append(finding("warn", f"this machine's clock is {skew:.1f} s off the database server's "
                                        f"(clock_skew_s={limit:g}); decisions use the server's, but local "
                                        "heartbeat times will look skewed", "sync the clock (NTP)",
                                skew_s=round(skew, 3)))
    else:
        findings.append(finding("ok", f"this machine's clock is within {max(skew, elapsed):.3f} s of the "
                                      "database server's", skew_s=round(skew, 3)))
    return findings
