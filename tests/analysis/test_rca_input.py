"""`warmscope rca` on bad and edge-case input: one clear message naming the row or
column, exit status 2, no traceback, and stdout that is always valid JSON."""

import gzip
import itertools
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.rootcause import Measure, contributions, localize
from warmscope.app.cli import rca as cli_rca

HEADER = "a,b,v,f\n"


def run(capsys, *argv):
    code = cli_rca.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("body, needle", [
    ("", "is empty"),
    (HEADER, "header but no rows"),
    (HEADER + "x,y,1,2\nx,z,abc,2\n", "row 3, column 'v': 'abc' is not a number"),
    (HEADER + "x,y,1,2\nx,z,,2\n", "row 3, column 'v': is empty"),
    (HEADER + "x,y,1,2\nx,z,3\n", "row 3: 3 fields, the header has 4"),
    (HEADER + "x,y,1,2\nx,z,1,2,9\n", "row 3: 5 fields"),
    (HEADER + "x,y,nan,2\n", "column 'v', row 2: value is empty, NaN or infinite"),
    (HEADER + "x,y,1,inf\n", "column 'f', row 2: value is empty, NaN or infinite"),
    ("a,v\nx,1\n", "no column(s) b, f"),
])
def test_bad_additive_tables_name_the_row_or_column(tmp_path, capsys, body, needle):
    p = tmp_path / "t.csv"
    p.write_text(body)
    code, out, err = run(capsys, str(p), "--dims", "a", "b", "--v", "v", "--f", "f")
    assert code == 2 and out == ""
    assert needle in err and err.startswith("warmscope rca: ") and "Traceback" not in err


def test_numerator_above_denominator_and_missing_file(tmp_path, capsys):
    p = tmp_path / "r.csv"
    p.write_text("a,n,d,fn,fd\nx,1,10,1,10\ny,12,10,1,10\n")
    code, out, err = run(capsys, str(p), "--dims", "a", "--v-num", "n", "--v-den", "d", "--f-num", "fn",
                         "--f-den", "fd")
    assert code == 2 and "row 3: numerator n=12 is above denominator d=10" in err
    p.write_text("a,n,d,fn,fd\nx,1,10,1,10\ny,-2,10,1,10\n")
    code, out, err = run(capsys, str(p), "--dims", "a", "--v-num", "n", "--v-den", "d", "--f-num", "fn",
                         "--f-den", "fd")
    assert code == 2 and "column 'n', row 3: negative count -2" in err
    code, _, err = run(capsys, str(tmp_path / "none.csv"), "--dims", "a", "--v", "v", "--f", "f")
    assert code == 2 and "no such file" in err
    code, _, err = run(capsys, str(p), "--dims", "a", "--v-num", "n")
    assert code == 2 and "either --v and --f" in err


def test_no_change_prints_an_empty_list_and_says_why(tmp_path, capsys):
    rows = "".join(f"x{i},y{j},10,10\n" for i in range(5) for j in range(5))
    p = tmp_path / "flat.csv"
    p.write_text(HEADER + rows)
    code, out, err = run(capsys, str(p), "--dims", "a", "b", "--v", "v", "--f", "f")
    assert code == 0 and json.loads(out) == [] and "nothing to explain" in err


def test_gzip_table_and_json_that_is_always_valid(tmp_path, capsys):
    # 4 leaves: (x,z) fell 10 -> 0, (w,z) rose 10 -> 11. Total change -9 = cause -10 + rest +1;
    # explanatory power = 10 / (10 + 1) = 0.909091, positive as it moved with the total.
    p = tmp_path / "t.csv.gz"
    with gzip.open(p, "wt") as fh:
        fh.write(HEADER + "x,y,10,10\nx,z,0,10\nw,y,10,10\nw,z,11,10\n")
    code, out, err = run(capsys, str(p), "--dims", "a", "b", "--v", "v", "--f", "f", "--compact")
    res = json.loads(out)
    assert code == 0 and res[0]["element"] == {"a": "x", "b": "z"} and res[0]["direction"] == "down"
    assert res[0]["explanatory_power"] == pytest.approx(10 / 11, abs=1e-6)
    assert "NaN" not in out and "Infinity" not in out


def test_quoted_values_crlf_lines_and_blank_lines_read_as_written(tmp_path, capsys):
    # A 4-leaf table whose fallen leaf has an a-value of its own, quoted with a comma and a quote
    # in it; Windows line ends and a blank line. The element found keeps the value exactly.
    p = tmp_path / "q.csv"
    p.write_bytes(
        b'a,b,v,f\r\nx,y,10,10\r\n"x, ""q""",z,0,10\r\n\r\nw,y,10,10\r\nw,z,11,10\r\n'
    )
    code, out, err = run(capsys, str(p), "--dims", "a", "b", "--v", "v", "--f", "f", "--compact")
    res = json.loads(out)
    assert code == 0 and res[0]["element"] == {"a": 'x, "q"'}, (out, err)


def test_ratio_contributions_add_up_to_the_change():
    # Two leaves. Expected rates 10/100 = 0.1 and 30/100 = 0.3 (overall 40/200 = 0.2);
    # observed 20/100 and 30/100 (overall 50/200 = 0.25; change +0.05).
    # Leaf shares at observed traffic: (20 - 100*0.1)/200 = 0.05, (30 - 100*0.3)/200 = 0;
    # mix: (100*0.1 + 100*0.3)/200 - 0.2 = 0. They add up to 0.05.
    df = pd.DataFrame({"a": ["x", "y"], "n": [20, 30], "d": [100, 100], "fn": [10, 30], "fd": [100, 100]})
    c, mix = contributions(df, Measure(v_num="n", v_den="d", f_num="fn", f_den="fd"))
    assert c.tolist() == pytest.approx([0.05, 0.0]) and mix == pytest.approx(0.0)
    # Traffic shifts to the low-rate leaf with no rate changing: all of the change is mix.
    # Expected 0.2 overall; observed (15 + 15)/(150 + 50) = 0.15; mix = (150*0.1 + 50*0.3)/200 - 0.2 = -0.05.
    df2 = pd.DataFrame({"a": ["x", "y"], "n": [15, 15], "d": [150, 50], "fn": [10, 30], "fd": [100, 100]})
    c, mix = contributions(df2, Measure(v_num="n", v_den="d", f_num="fn", f_den="fd"))
    assert c.tolist() == pytest.approx([0.0, 0.0]) and mix == pytest.approx(-0.05)


def test_upward_element_is_found_when_the_total_fell():
    rng = np.random.default_rng(4)
    g = pd.DataFrame(list(itertools.product(*[[f"{k}{i}" for i in range(6)] for k in "abc"])), columns=list("abc"))
    f = rng.lognormal(4, 0.5, len(g))
    v = f * np.exp(rng.normal(0, 0.03, len(g)))
    down, up = (g.a == "a1").to_numpy(), ((g.b == "b2") & (g.c == "c3")).to_numpy()
    v = np.where(down, v * 0.2, np.where(up, v * 1.8, v))
    loc = localize(g.assign(v=v, f=f), list("abc"), v="v", f="f")
    got = {frozenset(c.element.items()): c.direction for c in loc.causes}
    assert got == {frozenset({("a", "a1")}): -1, frozenset({("b", "b2"), ("c", "c3")}): 1}
    assert loc.change < 0
    # Shares of the gross change: the upward element opposes the total, so its power is negative.
    ep = {frozenset(c.element.items()): c.explanatory_power for c in loc.causes}
    assert ep[frozenset({("b", "b2"), ("c", "c3")})] < 0 < ep[frozenset({("a", "a1")})]
    assert sum(abs(x) for x in ep.values()) <= 1 + 1e-9


def test_many_dimensions_warn_and_stay_bounded(tmp_path, capsys):
    rng = np.random.default_rng(1)
    n = 3000
    dims = [f"d{i}" for i in range(12)]
    df = pd.DataFrame({d: rng.integers(0, 3, n).astype(str) for d in dims})
    f = rng.lognormal(3, 0.5, n)
    df["f"] = f
    df["v"] = np.where(df.d3 == "1", f * 0.3, f * np.exp(rng.normal(0, 0.02, n)))
    p = tmp_path / "wide.csv"
    df.to_csv(p, index=False)
    code, out, err = run(capsys, str(p), "--dims", *dims, "--v", "v", "--f", "f")
    assert code == 0 and json.loads(out)[0]["element"] == {"d3": "1"}
    assert "12 dimensions: the search is bounded" in err


def test_cli_entry_point_does_not_load_pandas_or_the_collectors(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(HEADER + "x,y,10,10\nx,z,0,10\nw,y,10,10\nw,z,11,10\n")
    code = (f"import sys; from warmscope.app.cli.main import main; rc = main(['rca', {str(p)!r}, '--dims', 'a', 'b', "
            "'--v', 'v', '--f', 'f', '--compact']); print(sorted(m for m in ('pandas', 'scipy', 'warmscope.collectors',"
            " 'warmscope.simulator') if m in sys.modules), file=sys.stderr); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["element"] == {"a": "x", "b": "z"}
    assert r.stderr.strip().splitlines()[-1] == "[]"


def test_negative_additive_values_are_kept_and_noted(tmp_path, capsys):
    rows = "".join(f"x{i},y{j},{0 if (i, j) == (1, 2) else 100},100\n" for i in range(5) for j in range(5))
    p = tmp_path / "neg.csv"
    p.write_text(HEADER + rows + "x9,y9,-0.5,0.2\n")
    code, out, err = run(capsys, str(p), "--dims", "a", "b", "--v", "v", "--f", "f", "--compact")
    assert code == 0 and json.loads(out)[0]["element"] == {"a": "x1", "b": "y2"}
    assert "1 leaves with negative values" in err
