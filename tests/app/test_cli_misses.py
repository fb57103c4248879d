"""`warmscope misses`: the class table, --by, --json and --since on hand-written rows; a bad
--since is one line and exit 2."""

import json
import subprocess
import sys

from warmscope.collectors import EmbeddedStore

T = 1_800_000_000.0


def _store(path):
    st = EmbeddedStore(path)
    st.write(
        {
            "lookups": [(T + 3600, "acme", "prefix_kv", "f", "hit", "", "", "m", "a-0", "1024", 1)],
            "misses": [  # an hour apart: --since 30m keeps only the second pair
                (T, "acme", "a-0", "kv:chat:sys:*", "cold", 900, 3),
                (T, "globex", "a-1", "kv:chat:sys:*", "evicted", 100, 1),
                (T + 3600, "acme", "a-1", "kv:chat:sys:*", "evicted", 300, 1),
                (T + 3600, "acme", "a-1", "kv:chat:sys:*", "partial", 100, 2),
            ],
        }
    )
    st.close()


def _cli(path, *args):
    return subprocess.run(
        [sys.executable, "-m", "warmscope.app.cli", "--store", str(path), "misses", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_class_table_by_engine_json_and_since(tmp_path):
    path = tmp_path / "s.sqlite"
    _store(path)
    out = _cli(path, "--since", "2h")
    assert out.returncode == 0, out.stderr
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines() if ln.strip()}
    # 900 + 100 + 300 + 100 = 1,400 tokens: cold 900 (64.3%), evicted 400 (28.6%),
    # partial 100 (7.1%)
    assert lines["cold"] == ["900", "3", "64.3%"]
    assert lines["evicted"] == ["400", "2", "28.6%"]
    assert lines["drifted"] == ["0", "0", "0.0%"]
    assert "of 1,400 missed tokens" in out.stdout
    by = json.loads(_cli(path, "--since", "2h", "--by", "engine", "--json").stdout)
    rows = {r["engine"]: r for r in by["rows"]}
    assert rows["a-0"]["total"] == 900 and rows["a-1"]["total"] == 500  # 100 + 300 + 100
    assert rows["a-1"]["evicted_share"] == 0.8  # 400 / 500
    recent = json.loads(_cli(path, "--since", "30m", "--json").stdout)
    assert (
        recent["tokens"] == 400
        and {r["miss_class"]: r["tokens"] for r in recent["rows"]}["evicted"] == 300
    )
    assert recent["addressable_share"] == 0  # no warm-up run warmed anything
    # the by-tenant table's last column is cold + evicted of all a tenant's misses (the dashboard's name),
    # not "addressable", which the summary line keeps for the families a warm-up warmed
    table = _cli(path, "--since", "2h", "--by", "engine").stdout
    assert table.splitlines()[0].rstrip().endswith("evicted share  cold+evicted share")
    assert "addressable share" not in table


def test_bad_since_is_one_line(tmp_path):
    path = tmp_path / "s.sqlite"
    _store(path)
    out = _cli(path, "--since", "yesterday")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "--since 'yesterday'" in out.stderr
