from warmscope.collectors import schema
from warmscope.collectors.keys import FamilyNormaliser, KeyHasher, TenantBucketer, default_family


def test_default_family_replaces_variable_segments():
    assert default_family("summarize:doc:8812") == "summarize:doc:*"
    assert default_family("emb/3f2a9c0e4b1d/chunk") == "emb/*/chunk"
    assert default_family("s:123e4567-e89b-12d3-a456-426614174000") == "s:*"
    assert default_family("resp:What is the capital of France?") == "resp:*"
    assert default_family("a:b:c:d:e:f") == "a:b:c:d:*"


def test_default_family_keeps_only_known_words():
    # names, email parts and free text made of letters only are not kept
    assert default_family("user:alicesmith:chat") == "user:*:chat"
    assert default_family("email/john.doe/example.com") == "*/*/*"
    assert default_family("session:JohnDoe:passport") == "session:*:*"
    assert default_family("prompt:Tell-me-about-my-diagnosis:y") == "*:*:y"
    assert default_family("prefix_kv:chat-sys:1") == "prefix_kv:chat-sys:*"  # known words joined
    assert FamilyNormaliser(vocabulary=["invoice"]).family("invoice:acme:7") == "invoice:*:*"


def test_rules_take_only_the_expanded_template():
    n = FamilyNormaliser(rules=[(r"^(summarize|chat):", r"\1:*")])
    assert n.family("summarize:tenant7:my secret prompt") == "summarize:*"
    assert n.family("other:1") == "*:*"  # no rule matched, "other" is not a known word


def test_family_count_is_capped_per_normaliser():
    n = FamilyNormaliser(max_families=3, vocabulary=[f"fam{chr(97 + i)}" for i in range(10)])
    fams = {n.family(f"fam{chr(97 + i)}:x") for i in range(10)}
    assert len(fams - {schema.OTHER}) == 3 and schema.OTHER in fams


def test_keyed_hash_depends_on_secret_and_hides_key():
    a, b = KeyHasher(b"one"), KeyHasher(b"two")
    assert a.hash("k:1") == a.hash("k:1") == a.hash(b"k:1")
    assert a.hash("k:1") != b.hash("k:1")
    assert "k:1" not in a.hash("k:1") and len(a.hash("k:1")) == 16


def test_tenants_allow_list_and_first_seen_cap():
    allow = TenantBucketer(allow=["t1"])
    assert allow.label("t1") == "t1" and allow.label("t9") == schema.OTHER
    seen = TenantBucketer(max_tenants=2)
    assert [seen.label(t) for t in ("a", "b", "c", "a")] == ["a", "b", schema.OTHER, "a"]
    assert seen.label(None) == schema.UNKNOWN
