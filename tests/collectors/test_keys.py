from warmscope.collectors.keys import FamilyNormaliser, KeyHasher, TenantBucketer, default_family
from warmscope.model import schema


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


# Personal-data-like segments: names, email parts, phone-like, free text in any case, joined with
# the separators a key builder would use. None of them may survive into a family.
_NAMES = ["alice", "Smith", "JohnDoe", "maria", "garcia", "oluwaseun", "zhang", "Wei", "fatima", "oconnor"]
_WORDS = ["tell", "me", "about", "my", "diagnosis", "salary", "divorce", "pregnant", "password", "debt"]


def _pii():
    from hypothesis import strategies as st

    name = st.sampled_from(_NAMES)
    letters = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=2, max_size=20)
    joined = st.lists(st.one_of(name, st.sampled_from(_WORDS), letters), min_size=1, max_size=5).flatmap(
        lambda parts: st.sampled_from(["", ".", "_", "-", " "]).map(lambda sep: sep.join(parts)))
    email = st.tuples(name, name, st.sampled_from(["example.com", "mail.org"])).map(
        lambda t: f"{t[0]}.{t[1]}@{t[2]}")
    return st.one_of(joined, email)


def test_property_no_personal_data_reaches_a_family():
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from warmscope.collectors.keys import DEFAULT_VOCABULARY

    struct = st.sampled_from(["user", "session", "resp", "chat", "emb", "prompt", "profile", "kv", "email"])

    @settings(max_examples=400, deadline=None)
    @given(parts=st.lists(st.one_of(struct, _pii()), min_size=1, max_size=6),
           sep=st.sampled_from([":", "/", "|"]))
    def check(parts, sep):
        key = sep.join(parts)
        fam = FamilyNormaliser().family(key)
        import re

        for seg in re.split(r"[:/|]", fam):
            # every kept segment is structure: a known word, words of it joined, or a placeholder
            assert seg in ("", "*") or all(w in DEFAULT_VOCABULARY for w in re.split(r"[_\-.]", seg)), (key, fam)
        for p in parts:
            for token in re.split(r"[ .@_\-]", p):
                if len(token) > 1 and token not in DEFAULT_VOCABULARY:
                    assert token not in re.split(r"[:/|_\-.]", fam), (key, fam, token)

    check()
