"""A seeded multi-tenant chat workload for the what-if proofs on real engines.

Tenants: ``acme`` (a support desk's system prompt), ``bolt`` and ``cora`` (the same system prompt
under their own ``cache_salt``: the pair whose salt the what-if drops), ``clock`` (a system prompt
that starts with a changing timestamp: drift), ``dana`` and ``emil`` (multi-turn chats that grow),
``gulf`` (one of a few shared documents followed by a question: a RAG-like head) and ``flood``
(long unique prompts that push older blocks out). Every request asks for a fixed number of output
tokens (``ignore_eos``), so the blocks its output fills are known.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SYS_DESK = ("You are the support desk of a parcel courier. Answer briefly and politely; quote the "
            "ledger entry, the invoice number and the refund policy where they apply. ") * 3
SYS_CLOCK = ("You are a turbine maintenance assistant. Check the valve, gasket, nozzle, piston and "
             "rotor logs before you answer; list the spindle readings first. ") * 3
SYS_TRIP = "You help plan a trip by train. Prefer cheap fares and short changes. " * 4
DOCS = [
    ("Section {k}: the warehouse in Lyon opens at six; parcels over twenty kilograms go to dock "
     "{k}, fragile goods to the north gate, returns to the counter by the car park. ") * 5,
    ("Policy {k}: refunds are paid within ten days to the card used; vouchers never expire; "
     "claims for damage need a photo and the waybill number within {k} days. ") * 5,
    ("Route {k}: the night train leaves at ten, changes at Chambery and reaches Turin at seven; "
     "bikes travel free in coach {k} if booked a day ahead. ") * 5,
]
QUESTIONS = ["Where is my parcel {n}?", "Can I get a refund for invoice {n} please?",
             "My voucher code {n} does not work, what now?", "When does dock {n} open?",
             "Is coach {n} on the night train?"]


@dataclass
class Request:
    tenant: str
    messages: list[dict[str, str]]
    max_tokens: int
    salt: str | None = None
    extra: dict = field(default_factory=dict)

    def body(self, model: str, session_id: str | None = None) -> dict:
        b: dict = {"model": model, "messages": self.messages, "max_tokens": self.max_tokens,
                   "temperature": 0, "ignore_eos": True}
        if self.salt:
            b["cache_salt"] = self.salt
        if session_id:
            b["session_id"] = session_id
        return b


def workload(n: int = 175, seed: int = 37) -> list[Request]:
    rnd = random.Random(seed)
    chats = {"dana": [{"role": "system", "content": SYS_TRIP}],
             "emil": [{"role": "system", "content": SYS_TRIP.replace("train", "coach")}]}
    out: list[Request] = []
    tick = 0

    def question() -> str:
        return rnd.choice(QUESTIONS).format(n=rnd.randint(100, 999))

    def out_tokens() -> int:
        return rnd.choice((1, 1, 2, 5, 9, 17, 31, 40))

    weights = {"acme": 5, "bolt": 3, "cora": 3, "clock": 3, "dana": 2, "emil": 2, "gulf": 4,
               "flood": 1}
    names = list(weights)
    for _ in range(n):
        who = rnd.choices(names, [weights[k] for k in names])[0]
        if who in ("acme", "bolt", "cora"):
            msgs = [{"role": "system", "content": SYS_DESK}, {"role": "user", "content": question()}]
            out.append(Request(who, msgs, out_tokens(), salt=None if who == "acme" else who))
        elif who == "clock":
            tick += rnd.choice((0, 1, 1, 2))
            # a fixed-width stamp: block 0 changes, the blocks after it keep their tokens
            stamp = f"Time: 2026-12-01 2{tick % 4}:{10 + 7 * tick % 49:02d}:{13 + 11 * tick % 46:02d}. "
            msgs = [{"role": "system", "content": stamp + SYS_CLOCK},
                    {"role": "user", "content": f"Status of rotor {rnd.randint(1, 9)}?"}]
            out.append(Request(who, msgs, out_tokens()))
        elif who in chats:
            hist = chats[who]
            if sum(len(m["content"]) for m in hist) > 3500:  # start over before it outgrows a cache
                del hist[1:]
            hist.append({"role": "user", "content": question()})
            out.append(Request(who, [dict(m) for m in hist], out_tokens()))
            hist.append({"role": "assistant", "content": f"Noted: reference {rnd.randint(1000, 9999)}."})
        elif who == "gulf":
            d = rnd.randrange(len(DOCS))
            doc = DOCS[d].format(k=d + 1)
            msgs = [{"role": "system", "content": "Answer from the document only."},
                    {"role": "user", "content": doc + "\n\nQuestion: " + question()}]
            out.append(Request(who, msgs, out_tokens()))
        else:
            words = " ".join(f"{rnd.getrandbits(36):x}" for _ in range(rnd.randint(120, 330)))
            out.append(Request(who, [{"role": "user", "content": words}], out_tokens()))
    return out
