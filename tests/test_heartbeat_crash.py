"""Crash safety: a beating writer SIGKILLed at random moments, twenty times, while another process reads.

Zero failed parses, and no leftover temp file is ever reported as a heartbeat.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

from synapolis.atomic import is_temp_name, sweep_temp_files
from synapolis.heartbeat import write_heartbeat
from synapolis.monitor import run_monitor

KILLS = 20

WRITER = """
import sys
from pathlib import Path
from synapolis.paths import StatePaths
from synapolis.heartbeat import write_heartbeat
paths = StatePaths(Path(sys.argv[1]))
n = 0
while True:
    write_heartbeat(paths, "crash", task="beating " + "x" * 2000)
    n += 1
    if n == 3:
        print("beating", flush=True)
"""

READER = """
import json, os, sys
from pathlib import Path
from synapolis.heartbeat import iter_heartbeat_paths, quick_check
folder, stop = Path(sys.argv[1]), Path(sys.argv[2])
stats = {"parses": 0, "failures": [], "missing": 0, "listed_other": [], "last_seq": 0, "seq_went_back": 0}
print("reading", flush=True)
while not stop.exists():
    listed = [p.name for p in iter_heartbeat_paths(folder)]
    if listed != ["crash.json"]:
        stats["listed_other"].append(listed)
    try:
        raw = (folder / "crash.json").read_bytes()
    except FileNotFoundError:
        stats["missing"] += 1
        continue
    try:
        doc = json.loads(raw)
        assert quick_check(doc), "schema"
    except Exception as exc:
        stats["failures"].append(f"{type(exc).__name__}: {exc} ({len(raw)} bytes)")
        continue
    stats["parses"] += 1
    if doc["seq"] < stats["last_seq"]:
        stats["seq_went_back"] += 1
    stats["last_seq"] = doc["seq"]
print(json.dumps(stats), flush=True)
"""


def test_sigkilled_writer_never_leaves_a_torn_heartbeat(ws, tmp_path):
    rng = random.Random(int(os.environ.get("CRASH_SEED", "4242")))
    write_heartbeat(ws.paths, "crash")  # the file exists before the reader starts
    folder = ws.paths.heartbeats
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(folder), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "reading"
        seqs = []
        for _ in range(KILLS):
            writer = subprocess.Popen([sys.executable, "-c", WRITER, str(ws.root)], stdout=subprocess.PIPE, text=True)
            try:
                assert writer.stdout.readline().strip() == "beating"
                time.sleep(rng.uniform(0.0, 0.08))  # where the kill lands: a random moment mid-write, not a wait
            finally:
                writer.send_signal(signal.SIGKILL)
                writer.wait(timeout=30)
            assert writer.returncode == -signal.SIGKILL
            seqs.append(json.loads((folder / "crash.json").read_text())["seq"])
        stop.write_text("")
        out, _ = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["failures"] == []
    assert stats["missing"] == 0
    assert stats["listed_other"] == []
    assert stats["seq_went_back"] == 0
    assert stats["parses"] > 100
    assert seqs == sorted(seqs) and seqs[-1] >= 1 + 3 * KILLS  # every writer beat at least 3 times

    # leftovers of killed writers (if a kill landed mid-write) are never heartbeats
    leftovers = [name for name in os.listdir(folder) if is_temp_name(name)]
    print(f"{len(leftovers)} leftover temp file(s), {stats['parses']} parses")
    doc = run_monitor(ws)
    assert [a["agent_id"] for a in doc["agents"]] == ["crash"]
    assert doc["agents"][0]["effective_status"] == "active"
    result = subprocess.run([sys.executable, "-c",
                             "import sys; from synapolis.cli import validate_heartbeat_main as m; m(sys.argv[1:])",
                             "--state-dir", str(ws.root), "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    assert [os.path.basename(f["path"]) for f in json.loads(result.stdout)["files"]] == ["crash.json"]
    # once old, the watchdog's sweep removes them
    hour_ago = time.time() - 3601
    for name in leftovers:
        os.utime(folder / name, (hour_ago, hour_ago))
    assert sorted(p.name for p in sweep_temp_files(ws.root)) == sorted(leftovers)
    assert os.listdir(folder) == ["crash.json"]


def test_a_temp_file_with_a_heartbeat_like_name_is_still_ignored(ws):
    write_heartbeat(ws.paths, "real")
    # what a writer killed between open() and os.replace() leaves behind, complete or torn
    (ws.paths.heartbeats / ".tmp-ghost.json.999.abcd1234.tmp").write_text(
        json.dumps({"schema_version": 1, "agent_id": "ghost", "harness": "h", "status": "active",
                    "beat_at": "2030-01-01T00:00:00Z", "seq": 1}))
    (ws.paths.heartbeats / ".tmp-real.json.998.abcd1234.tmp").write_text('{"schema_version": 1, "agen')
    doc = run_monitor(ws)
    assert [a["agent_id"] for a in doc["agents"]] == ["real"]
