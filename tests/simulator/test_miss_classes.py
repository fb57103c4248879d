"""The simulator's ground truth of why prefix-KV blocks missed (``misses`` frame):
classes add up to the missed tokens, each class fires for the reason it names, and
injected faults move the expected class."""

from __future__ import annotations

from warmscope.collectors import EmbeddedStore
from warmscope.simulator import SimConfig, Simulation, parse_fault, simulate
from warmscope.simulator.traffic import TEMPLATES

SMALL = dict(hours=0.5, rps=6.0, tenants=6, replicas=2, seed=5, peak_warmup_at_h=-1)


def _prefix(sim, rep, ten, q, fx=()):
    """One non-dialog ``summarize`` request (system prompt 1536 tokens = 3 blocks of 512)
    of ``q`` query tokens on ``rep``; returns (cached tokens, the classes it recorded)."""
    tpl_idx = 0
    tpl = TEMPLATES[tpl_idx]
    assert tpl.name == "summarize" and tpl.sys_tokens == 1536 and not tpl.dialog
    sim._req_id += 1
    sim._sess = [0, 0, "A", 0]
    before = dict(sim.summary.miss_classes)
    cached = sim._prefix(
        rep, rep.pool, ten, tpl, tpl_idx, 0, 0, q, tpl.sys_tokens + q, 0.0, list(fx), False
    )
    after = sim.summary.miss_classes
    return cached, {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def test_each_class_fires_for_its_reason(tmp_path):
    sim = Simulation(
        SimConfig.load(
            hours=0.1, tenants=3, replicas=2, seed=5, peak_warmup_at_h=-1, block_tokens=512
        ),
        tmp_path / "m.sqlite",
    )
    a0, a1 = sim.pools["A"].replicas
    for r in (a0, a1):
        r.kv_lru.clear()
    acme, globex = sim.tenants[0], sim.tenants[1]
    # q = 700 query tokens: one full query block (512, new content: cold) and a last block of
    # 188 < 512 tokens (partial). Prompt 1536 + 700 = 2236 tokens.
    # 1. Nothing cached anywhere: 3 system blocks cold (1536) + 512 cold = 2048; 188 partial.
    assert _prefix(sim, a0, acme, 700) == (0, {"cold": 2048, "partial": 188})
    # 2. The same prompt on the other replica: a-0 holds the system blocks -> elsewhere 1536.
    assert _prefix(sim, a1, acme, 700) == (0, {"elsewhere": 1536, "cold": 512, "partial": 188})
    # 3. Another tenant, same template: its own keys are new, but acme's copies are held
    #    (same content under another tenant's scope) -> isolated 1536.
    assert _prefix(sim, a0, globex, 700) == (0, {"isolated": 1536, "cold": 512, "partial": 188})
    # 4. Both replicas restart (caches dropped): acme's system blocks were stored, held by none
    #    -> evicted 1536.
    for r in (a0, a1):
        r.kv_lru.clear()
    assert _prefix(sim, a0, acme, 700) == (0, {"evicted": 1536, "cold": 512, "partial": 188})
    # 5. A hit: the system prompt is now held on a-0, 1536 tokens cached; q = 1024 -> two full
    #    query blocks, new content: cold 1024 (no partial block).
    assert _prefix(sim, a0, acme, 1024) == (1536, {"cold": 1024})
    # 6. The key-drift trap: every system block gets a variant key never stored, while the
    #    unchanged keys were -> drifted 1536.
    drift = parse_fault("dynamic_tokenisation:template=summarize")
    assert _prefix(sim, a0, acme, 700, [drift]) == (
        0,
        {"drifted": 1536, "cold": 512, "partial": 188},
    )
    # 7. Chain break: a-0 loses block 0 only (blocks 1 and 2 still held there). Block 0 is
    #    evicted (512); blocks 1-2 are held here, unusable after the break: they take block 0's
    #    class -> evicted 1536 in all.
    del a0.kv_lru._d["kv:summarize:sys:acme.0"]
    assert _prefix(sim, a0, acme, 700) == (0, {"evicted": 1536, "cold": 512, "partial": 188})
    # 8. The fixed-length trap refuses prompts under 4096 tokens: all 2236 tokens partial.
    fixed = parse_fault("kv_fixed_len;min_tokens=4096")
    assert _prefix(sim, a0, acme, 700, [fixed]) == (0, {"partial": 2236})


def _run(tmp_path, name, faults=(), **over):
    cfg = SimConfig.load(**{**SMALL, **over})
    summary = simulate(
        cfg, tmp_path / f"{name}.sqlite", [parse_fault(f) for f in faults], workers=1
    )
    return summary, EmbeddedStore(tmp_path / f"{name}.sqlite", readonly=True).frame("misses")


def test_classes_add_up_and_a_small_cache_shows_as_evicted(tmp_path):
    # Pool B's prefix cache holds 8 blocks (4096 tokens), pool A's 400,000 tokens.
    summary, m = _run(tmp_path, "small", b_kv_capacity_tokens=4096)
    # The store holds exactly what the simulator counted: per class, and in all the missed
    # tokens (prompt - cached) of the requests that walked the prefix cache.
    assert m["tokens"].sum() == summary.kv_missed == sum(summary.miss_classes.values())
    per_class = m.groupby("miss_class")["tokens"].sum().to_dict()
    assert per_class == dict(summary.miss_classes)
    assert per_class.get("drifted", 0) == 0  # no drift trap: no variant key, the class cannot fire
    share = {}
    for pool in ("a", "b"):
        p = m[m["engine"].str.startswith(pool)]
        share[pool] = p.loc[p["miss_class"] == "evicted", "tokens"].sum() / p["tokens"].sum()
    print("evicted share", share)
    # 8 blocks cannot hold one summarize system prompt per tenant (6 tenants x 3 blocks):
    # system prompts are evicted between requests, so evicted is a large share in pool B
    # and a small one in pool A (which evicts only on restarts and after hours of traffic).
    assert share["b"] > 0.2 and share["a"] < 0.05


def test_key_drift_shows_as_drifted_in_its_template_only(tmp_path):
    summary, m = _run(tmp_path, "drift", faults=["dynamic_tokenisation:template=chat"])
    assert m["tokens"].sum() == summary.kv_missed
    drifted = m[m["miss_class"] == "drifted"]
    # The trap changes the system-prompt keys of chat prompts only: every drifted token is
    # in chat's families — its system prompt, and its conversation blocks held on the replica
    # but unusable after the drifted system prompt broke the chain — and there are some (the
    # unchanged keys were stored before the trap's 50 variants each met their first request).
    assert drifted["tokens"].sum() > 0
    assert "kv:chat:sys:*" in set(drifted["family"])
    assert set(drifted["family"]) <= {"kv:chat:sys:*", "kv:chat:hist:*"}
    chat = m[m["family"].str.startswith("kv:chat:")]
    share = drifted["tokens"].sum() / chat["tokens"].sum()
    print("drifted share of chat's missed tokens", share)
    assert share > 0.05
