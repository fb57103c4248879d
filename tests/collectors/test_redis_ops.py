"""The Redis moment script's operations: each named _Part method writes a code the script
knows."""

import inspect
import re

from warmscope.collectors import redis_sink as rs


def test_every_named_operation_writes_a_code_the_script_applies():
    script_codes = set(re.findall(r"op == '(\w\w)'", rs._APPLY))
    assert set(rs.OPS) == script_codes
    args = {"name": "k", "field": "f", "n": 3, "x": 1.5, "value": "v", "member": "m", "seconds": 60,
            "fields_and_values": ["a", "1.0"], "members": ["m"], "version": 1, "zeros": False, "row": 0,
            "extra": ["a:lookups", 2]}
    for code, (method, _) in rs.OPS.items():
        if method is None:  # the script keeps it; nothing writes it now
            continue
        p = rs._Part("t")
        fn = getattr(p, method)
        fn(**{a: args[a] for a in inspect.signature(fn).parameters})
        assert p.ops[0][:2] == [code, 2], method  # key index 2: KEYS[1] is the marker
    p = rs._Part("t")
    p.hash_keep_min("k", "first_ts", 3)
    p.hash_add_int("k", "lookups", 2.0)
    assert p.ops == [["mn", 2, "first_ts", "3.0"], ["hi", 2, "lookups", "2"]]
