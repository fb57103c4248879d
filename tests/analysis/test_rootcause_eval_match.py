"""The simulator benchmark's scorer (bench/eval_rca.py ``match``) on hand-built leaf tables."""

import pandas as pd

from bench.eval_rca import match


def _leaves() -> pd.DataFrame:
    # Two models; globex and umbrella are all of qwen's tenants, acme is llama's only tenant.
    rows = [
        ("globex", "qwen", "response"),
        ("globex", "qwen", "prefix_kv"),
        ("umbrella", "qwen", "response"),
        ("umbrella", "qwen", "prefix_kv"),
        ("acme", "llama", "response"),
        ("acme", "llama", "prefix_kv"),
        ("initech", "llama", "prefix_kv"),
    ]
    return pd.DataFrame(rows, columns=["tenant", "model", "layer"])


def _e(**kv: str) -> frozenset:
    return frozenset(kv.items())


def test_an_element_selecting_the_leaves_of_two_expected_elements_recalls_both() -> None:
    exp = {_e(tenant="globex", layer="response"), _e(tenant="umbrella", layer="response")}
    # {model=qwen, layer=response} selects rows 0 and 2: exactly the two expected elements.
    assert match({_e(model="qwen", layer="response")}, exp, _leaves()) == (2, 1)


def test_an_element_selecting_more_than_the_expected_leaves_matches_nothing() -> None:
    exp = {_e(tenant="globex", layer="response"), _e(tenant="umbrella", layer="response")}
    # {layer=response} also holds acme's row 4, which no expected element has.
    assert match({_e(layer="response")}, exp, _leaves()) == (0, 0)
    # {model=qwen} also holds the two prefix_kv rows 1 and 3.
    assert match({_e(model="qwen")}, exp, _leaves()) == (0, 0)


def test_an_element_selecting_one_expected_element_of_two_recalls_that_one() -> None:
    exp = {_e(tenant="acme", layer="response"), _e(tenant="globex", layer="response")}
    # {model=llama, layer=response} is row 4 only: acme × response, and not globex.
    pred = {_e(model="llama", layer="response"), _e(tenant="initech")}
    assert match(pred, exp, _leaves()) == (1, 1)
