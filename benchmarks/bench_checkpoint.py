#!/usr/bin/env python3
"""What skipping SQLite's close-time checkpoint buys a whole store-writing CLI call (`synapolis note`).

Each side runs the same CLI in a fresh interpreter with `_skip_checkpoint_on_close` set to one way of
doing it, interleaved, against `python -c pass` measured in the same run:
  default    SQLite's own close: checkpoint, fsyncs, delete the WAL
  shipped    what synapolis does: `Connection.setconfig(SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE)` on Python
             3.12+, nothing (the default) on 3.10/3.11, which have no public way to ask
  _ctypes    sqlite3_db_config(NO_CKPT_ON_CLOSE) through the private `_ctypes` and CPython's object
             layout (what synapolis did before; defined here only, to keep the comparison)
  ctypes     the same call through the public `ctypes` (still CPython's private object layout)
Run it under 3.11 and 3.12 to see both sides of the shipped choice.

    python benchmarks/bench_checkpoint.py [--runs 40] [--no-write]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import HERE, bench_env, bench_parser, interpreter, machine, publish, ratio_table, timed

# one section per side of the shipped choice: 3.10/3.11 (no setconfig) and 3.12+
SECTION = "bench_checkpoint" if sys.version_info < (3, 12) else "bench_checkpoint_py312"

_PUBLIC_CTYPES = """
def skip(conn):
    import ctypes, _sqlite3
    lib = ctypes.CDLL(_sqlite3.__file__)
    handle = ctypes.c_void_p.from_address(id(conn) + object.__basicsize__).value
    lib.sqlite3_db_config(ctypes.c_void_p(handle), ctypes.c_int(1006), ctypes.c_int(1), ctypes.c_void_p(None))
"""
_PRIVATE_CTYPES = """
def skip(conn):
    import _ctypes, _sqlite3

    class VoidP(_ctypes._SimpleCData):
        _type_ = "P"

    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    address = _ctypes.dlsym(_ctypes.dlopen(_sqlite3.__file__, _ctypes.RTLD_LOCAL), "sqlite3_db_config")
    handle = VoidP.from_address(id(conn) + object.__basicsize__).value
    _ctypes.call_function(address, (VoidP(handle), Int(1006), Int(1), VoidP(None)))
"""
_DRIVER = """import sys
sys.path.insert(0, {root!r})
from synapolis.store.local import connection as s
{define}
s._skip_checkpoint_on_close = {name}
from synapolis.cli import main
sys.argv[0] = "synapolis"
main()
"""
VARIANTS = {
    "default (SQLite checkpoints on close)": ("", "lambda conn: None"),
    "shipped (`setconfig` on 3.12+, nothing on 3.10/3.11)": ("", "s._skip_checkpoint_on_close"),
    "_ctypes (private, the code before)": (_PRIVATE_CTYPES, "skip"),
    "ctypes (public module)": (_PUBLIC_CTYPES, "skip"),
}


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    env = bench_env(tmp)
    root = str(HERE.parent)
    sides = {'python -c pass (baseline)': lambda d: [sys.executable, "-c", "pass"]}
    for label, (define, name) in VARIANTS.items():
        code = _DRIVER.format(root=root, define=define, name=name)
        sides[f"synapolis note, {label}"] = (lambda code: lambda d: [sys.executable, "-c", code, "--state-dir", str(d),
                                                                  "note", "bench", "--agent-id", "alice"])(code)
    times: dict[str, list[float]] = {name: [] for name in sides}
    try:
        dirs = {}
        for name, make in sides.items():  # each side its own state dir, alice started, warmed up
            dirs[name] = tmp / f"s{len(dirs)}"
            if name != next(iter(sides)):
                timed(make(dirs[name])[:5] + ["start", "--agent-id", "alice"], env)
            timed(make(dirs[name]), env)
        for _ in range(args.runs):
            for name, make in sides.items():
                times[name].append(timed(make(dirs[name]), env))
        load = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    names = list(sides)
    base = statistics.median(times[names[0]])
    rows = [(name, statistics.median(times[name]), statistics.median(times[name]) / base) for name in names]
    lines = ["## Close-time checkpoint: what skipping it buys (bench_checkpoint.py)", "",
             f"Machine: {machine()} · load average {load:.1f} when measured  ",
             f"Command: `{Path(sys.executable).name} benchmarks/bench_checkpoint.py --runs {args.runs}` ({args.runs} "
             "interleaved runs each, median wall time of a subprocess)  ", interpreter(), "", *ratio_table(rows)]
    default, shipped, private, public = (median for _name, median, _ratio in rows[1:])
    how = ("`Connection.setconfig`" if sys.version_info >= (3, 12)
           else "nothing on this Python (no `setconfig` before 3.12): the row measures the default again")
    lines += ["", f"Skipping the checkpoint saves {1000 * (default - private):.1f} ms a call through `_ctypes`; "
              f"through the public `ctypes` the call costs {1000 * (public - default):+.1f} ms against not skipping; "
              f"what synapolis ships ({how}) {1000 * (shipped - default):+.1f} ms."]
    publish(SECTION, "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
