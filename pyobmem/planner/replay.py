"""The swap executor replayed on the host's clock: the iteration time of a plan as the shim runs it.

The cost model (``simulation``) counts memory at the GPU's positions; the shim (native/swap*.c)
keeps its budget when the host issues an op, up to the whole launch queue ahead of the GPU.
This walk follows the learned iteration's ops in host issue order, three iterations unrolled
(figures of the middle one), with the shim's rules (docs/swap.md "Cost model", the replay):

- Clocks (ns): each op's host time H (its unperturbed issue time, moved by the host's waits;
  where the unperturbed host was held by the GPU, at a sync or with the launch queue full, it
  keeps at least the delay of the op the GPU ran then) and GPU time G = max(previous G + its
  unperturbed duration, H, the copies it waits for): delays propagate.
- Memory as the shim counts it at host time: every live device block of the process (the
  shim's blocks at what they have mapped), freed stream-ordered blocks cached by size class
  (mapped, reused at once by an allocation of their class, the oldest first; given back only
  once the GPU has passed the free, the newest first), less the swap-outs still copying
  (``leaving``). A swap-out's memory goes when its copy ends on the GPU clock (the release
  thread), or at once when handed over.
- Actions: the plan's SWAP_OUT when the host ends op s (the copy queues on the device-to-host
  engine, first come first served in issue order, after the block's last use on the GPU), its
  PREFETCH when the host begins op q (a map, the copy on the host-to-device engine); a block an
  op names while out comes back on demand (the op waits for the copy on the GPU), one still
  copying out stays (the swap-out is cancelled; the copy runs on).
- An op that may touch any block (``LearnedIteration.op_all``: opaque, or naming more blocks than
  its records hold, as PyTorch's foreach optimizer kernels do) makes every block usable as an
  op's own (``swap_op_begin``'s ``how``): every swap-out in flight is cancelled, every block out
  comes back on demand, none goes out for it; later copies out wait for its end on the GPU (the
  stream's fence).
- The budget (``hold_budget``, ``evict_keeping``, ``drain_until``): before a map, while the
  count would pass the budget, cached memory the GPU is done with goes first, then swap-outs
  beyond the plan (the block whose next use is farthest by the plan's IDLE hints, one of the
  mapping's size when it is idle at least half as long; else the least recently used); then,
  while the memory still mapped (swap-outs in flight included) would pass it, a swap-out of
  the same size hands its memory over (``_handoff``: the oldest not needed within 64 ops or P/4; the new
  block's first use waits for that copy on the GPU), or else cached memory the GPU is done with
  goes back and then the host waits for the oldest swap-outs' copies, one by one (the trim first
  since session 13: GPT medium at 75% on the H200 went from 1.106x to 1.033x with it).
- Host costs: each map, VMM create + map + access (``MAP_NS + MAP_NS_PER_GIB``), each cached
  block given back, unmap + release (DESIGN.md's measured VMM costs).

Not modelled: spare handles (released memory kept for a map of its size: fewer creates and
handoffs, the same count), the release thread's unmaps holding the executor's lock, the shim's own
time per op (event records, release polls), copies of the application on the copy engines, the
100 us release poll, more than one stream, shim blocks that are no candidates going out (only
candidates are evicted), a cuMemAlloc block never taking a handoff, the limit on swap-outs in
flight on the copy engine (``PYOBMEM_OUT_AHEAD_MIB``). A swap-in on demand makes the op's stream
wait for its copy, not the host (``finish_in``), as the shim does outside a capture.
Its inputs are the unswapped capture's timing (the GPU clock samples every 32 ops).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .learning import NEVER_FREED, LearnedIteration

GRANULE = 2 << 20  # the shim maps whole 2 MiB granules (its vsize)
MAP_NS, MAP_NS_PER_GIB = 39e3, 176e3  # cuMemCreate + cuMemMap + cuMemSetAccess: 39 us at 2 MiB, 215 us at 1 GiB
UNMAP_NS, UNMAP_NS_PER_GIB = 30e3, 515e3  # cuMemUnmap + cuMemRelease: 30 us at 2 MiB, 545 us at 1 GiB
COUPLED_QUEUE = 0.95  # the launch queue counts as full from this share of its deepest measured fill
ITERATIONS = 3  # unrolled; figures of the middle one

RES, OUT_PENDING, OUT, IN_PENDING = range(4)
INF = float("inf")


@dataclass(frozen=True)
class Replay:
    """The replay's figures for the middle iteration. ``iteration_ns``: its GPU time start to start;
    ``time_ratio``: that over the unswapped iteration; ``host_wait_ns``: the host's waits for
    swap-outs (drains); counts as ``NOTE swap.waits`` has them: ``drains`` (waits for a swap-out's
    copy), ``evictions`` (swap-outs beyond the plan), ``planned_outs``, ``handoffs``, ``maps`` and
    ``creates`` (maps that made new memory), ``demand_ins`` (swap-ins an op waited for),
    ``prefetches`` (planned swap-ins) and of them ``prefetch_hits`` / ``late_ins`` (the copy had
    ended / had not when the host began the op that uses it: ``Capture.swaps``' causes),
    ``cancels`` (swap-outs a use or a free cancelled)."""

    iteration_ns: float
    time_ratio: float
    host_wait_ns: float
    drains: int
    evictions: int
    planned_outs: int
    handoffs: int
    maps: int
    creates: int
    demand_ins: int
    prefetches: int
    prefetch_hits: int
    late_ins: int
    cancels: int
    gpu_ns: np.ndarray = field(default=None, repr=False)  # (P,) when the GPU starts each op of the middle iteration
    host_ns: np.ndarray = field(default=None, repr=False)  # (P,) when the host issues it

    def to_json(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()
                if k not in ("gpu_ns", "host_ns")}


def map_ns(vsize: int) -> float:
    """Host time of one map of ``vsize`` bytes (create, map, access grant), ns."""
    return MAP_NS + MAP_NS_PER_GIB * vsize / (1 << 30)


def unmap_ns(vsize: int) -> float:
    """Host time of giving ``vsize`` bytes back (unmap, release), ns."""
    return UNMAP_NS + UNMAP_NS_PER_GIB * vsize / (1 << 30)


SOON_OPS = 64  # swap_plan.c needed_soon: a swap-out an op needs within min(this, P / 4) ops keeps its memory


def _handoff(st: "_State", vsize: int) -> int:
    """The swap-out whose memory a map of ``vsize`` bytes takes (``leaving_of``, swap_vmm.c): one
    still copying out, its memory its own, exactly that size, not named by the op being begun,
    not needed again within min(SOON_OPS, P / 4) ops by the IDLE hints (its memory given, it
    could come back only after its copy, the host waiting); the oldest. -1 for none."""
    soon = st.op + 1 + st.soon
    for u in st.pending:
        if not st.given[u] and st.vsize[u] == vsize and st.stamp[u] != st.op and not (st.hints and st.next[u] < soon):
            return u
    return -1


class _State:
    """The shim's state during the walk (units: block instances; see ``replay``)."""

    def __init__(self, units: dict, budget: int, bandwidth: float, hints: bool = True):
        for k, v in units.items():
            setattr(self, k, v)
        n = len(self.size)
        self.budget, self.bw, self.hints = budget, bandwidth, hints
        self.soon = 0  # ops: _handoff's needed-soon horizon (replay sets it from the period)
        self.state = np.full(n, RES, np.int8)
        self.live = np.zeros(n, bool)
        self.given = np.zeros(n, bool)
        self.stamp = np.full(n, -1, np.int64)  # the op being begun names it: never evicted nor handed over for it
        self.out_end = np.zeros(n)
        self.in_end = np.zeros(n)
        self.use_end = np.zeros(n)  # GPU end of its last use so far
        self.slot = np.zeros(n, bool)  # it has a host slot (from its first swap-out)
        self.lru = np.where(self.last > -INF, self.last, -1.0)  # the op that last touched it or allocated it
        self.pending: list[int] = []  # swap-outs still copying, in issue order
        self.cache: dict[int, list] = {}  # vsize -> [GPU time its free completes] of cached mapped blocks
        self.others = 0  # device bytes of blocks the shim does not serve
        self.mapped = 0  # bytes mapped for the shim's blocks (cached ones too)
        self.leaving = 0
        self.d2h = self.h2d = 0.0  # when each copy engine is free
        self.H = 0.0
        self.op = -1
        self.barrier = 0.0  # a handoff made the stream wait for that copy
        self.fence = 0.0  # GPU end of the last op that may touch any block: later copies out wait for it
        self.trace: list | None = None
        self.count = {k: 0 for k in ("drains", "evictions", "planned_outs", "handoffs", "maps", "creates",
                                     "demand_ins", "prefetches", "prefetch_hits", "late_ins", "cancels")}
        self.host_wait = 0.0
        self.counting = False

    def add(self, key: str, u: int = -1):
        if self.counting:
            self.count[key] += 1
            if self.trace is not None:
                self.trace.append((self.op, key, u))

    def resident(self) -> int:
        return self.others + self.mapped - self.leaving

    # -- swap-outs, releases ------------------------------------------------------------
    def poll(self):
        """The release thread: swap-outs whose copy ended by now lose their memory."""
        keep = []
        for u in self.pending:
            if self.out_end[u] <= self.H:
                if not self.given[u]:
                    self.mapped -= self.vsize[u]
                    self.leaving -= self.vsize[u]
                self.given[u] = False
                self.state[u] = OUT
            else:
                keep.append(u)
        self.pending = keep

    def swap_out(self, u: int) -> None:
        # After its last use; a host slot is written only after the last copy that reads it: the
        # block's own swap-in for its kept slot, the latest swap-in of all for a slot new to it.
        ready = max(self.use_end[u], self.in_end[u] if self.slot[u] else self.h2d, self.H, self.fence)
        self.slot[u] = True
        self.d2h = self.out_end[u] = max(self.d2h, ready) + self.size[u] / self.bw * 1e9
        self.state[u] = OUT_PENDING
        self.leaving += self.vsize[u]
        self.pending.append(u)

    def cancel(self, u: int) -> None:
        self.state[u] = RES
        self.leaving -= self.vsize[u]
        self.pending.remove(u)
        self.add("cancels", u)

    def wait_for(self, u: int) -> None:
        """The host waits for u's copy out (drain_until's or settle_out's cuEventSynchronize)."""
        if self.out_end[u] > self.H:
            self.host_wait += (self.out_end[u] - self.H) if self.counting else 0.0
            self.H = self.out_end[u]
        self.add("drains", u)
        self.poll()

    # -- the budget ---------------------------------------------------------------------
    def trim(self, want: float) -> None:
        """Cached memory the GPU is done with goes back (``trim``, swap_cache.c): largest size
        classes first, the newest of a class first (the shim's cache order)."""
        got = 0
        for vs in sorted(self.cache, reverse=True):
            ends = self.cache[vs]
            for i in range(len(ends) - 1, -1, -1):
                if got >= want:
                    break
                if ends[i] <= self.H:
                    del ends[i]
                    self.mapped -= vs
                    got += vs
                    self.H += unmap_ns(vs)
            if got >= want:
                break

    def victim(self, vsize: int) -> int:
        """pick_victim: Belady's choice by the IDLE hints at the next op, else the least recently used."""
        p = self.op + 1
        ok = self.live & self.cand & (self.state == RES) & (self.stamp != self.op)
        hinted = self.hints & ok & (self.last < p) & (self.next > p) & (self.next - self.last >= 2) & (self.next < INF)
        if np.any(hinted):
            idle = np.where(hinted, self.next - p, -1.0)
            v = int(np.argmax(idle))
            same = np.where(self.vsize == vsize, idle, -1.0)
            s = int(np.argmax(same))
            return s if same[s] > 0 and 2 * same[s] >= idle[v] else v
        if not np.any(ok):
            return -1
        idle_first = np.where(ok, self.lru + np.where(self.use_end <= self.H, 0.0, 1e12), INF)
        return int(np.argmin(idle_first))

    def evict(self, need: int) -> None:
        """evict_keeping: the count plus ``need`` under the budget, cached memory first."""
        if self.resident() + need <= self.budget:
            return
        self.trim(self.resident() + need - self.budget)
        while self.resident() + need > self.budget:
            v = self.victim(need)
            if v < 0:
                break
            self.swap_out(v)
            self.add("evictions", v)

    def hold(self, vsize: int) -> None:
        """hold_budget before mapping ``vsize`` bytes."""
        self.evict(vsize)
        over = self.resident() + self.leaving + vsize - self.budget
        if self.pending and over > 0 and _handoff(self, vsize) < 0:
            self.trim(over)  # cached memory the GPU is done with goes back before the host waits
        while self.pending and self.resident() + self.leaving + vsize > self.budget and _handoff(self, vsize) < 0:
            oldest = next((u for u in self.pending if not self.given[u]), -1)
            if oldest < 0:
                break
            self.wait_for(oldest)
        over = self.resident() + vsize - self.budget
        if over > 0:
            self.trim(over)

    def map(self, u: int) -> float:
        """map_block for unit u: the memory of a swap-out still copying (returns when its copy
        ends: what u's first use waits for), else new memory (0)."""
        self.add("maps")
        o = _handoff(self, self.vsize[u])
        if o >= 0:
            self.given[o] = True
            self.leaving -= self.vsize[o]
            self.add("handoffs", o)
            self.H += MAP_NS  # map + access, no create
            return float(self.out_end[o])
        self.add("creates")
        self.mapped += self.vsize[u]
        self.H += map_ns(self.vsize[u])
        return 0.0

    def make_usable(self, u: int) -> float:
        """make_usable for the op being begun: u resident, or on its way in (a demand swap-in when
        it was out). Returns the GPU time the op waits for (its copy in, 0 for none)."""
        if self.state[u] == IN_PENDING:  # prefetched: a hit when its copy has ended by now
            self.add("prefetch_hits" if self.in_end[u] <= self.H else "late_ins", u)
        elif self.swap_in(u):
            self.add("demand_ins", u)
        if self.state[u] != IN_PENDING:
            return 0.0
        self.state[u] = RES
        return float(self.in_end[u])

    def swap_in(self, u: int) -> bool:
        """u back (a copy in: True); one still copying out with its own memory just stays."""
        if self.state[u] == OUT_PENDING and self.given[u]:
            self.wait_for(u)  # settle_out: its memory is another block's
        if self.state[u] == OUT_PENDING:
            self.cancel(u)
            return False
        if self.state[u] != OUT:
            return False
        self.hold(int(self.vsize[u]))
        after = self.map(u)
        self.h2d = self.in_end[u] = max(self.h2d, self.H, after) + self.size[u] / self.bw * 1e9
        self.state[u] = IN_PENDING
        return True


def _units(L: LearnedIteration, iterations: int) -> tuple[dict, list, list]:
    """Block instances of the walk: each block live over the iteration once, each block allocated
    in it once per iteration (from the one before the first: live at the start when it crosses
    into it). Returns (arrays by unit, per position the (unit, next access) pairs of its op,
    per position the allocations and frees after it as (host ns, +1 alloc / -1 free, unit))."""
    P = L.period
    a, f = L.blk_alloc, L.blk_free
    whole = (a < 0) & (f >= P)
    inside = (a >= 0) & (a < P)
    rows, shift = [np.flatnonzero(whole)], [np.zeros(int(whole.sum()), np.int64)]
    for k in range(-1, iterations):
        r = np.flatnonzero(inside & ((f + k * P >= 0) | (k >= 0)))
        rows.append(r)
        shift.append(np.full(len(r), k, np.int64))
    rows, shift = np.concatenate(rows), np.concatenate(shift)
    size = L.blk_size[rows]
    cand = L.blk_cand[rows]
    units = dict(size=size.astype(np.float64), vsize=-(-size // GRANULE) * GRANULE, served=L.blk_served[rows],
                 cand=cand >= 0, cand_row=cand, alloc=np.where(whole[rows], -1, a[rows] + shift * P),
                 free=np.where(whole[rows] | (f[rows] >= NEVER_FREED), NEVER_FREED, f[rows] + shift * P),
                 t_alloc=L.blk_t_alloc[rows] + shift * L.iteration_ns, t_free=L.blk_t_free[rows] + shift * L.iteration_ns)
    n = len(rows)
    last, nxt = np.full(n, -INF), np.full(n, INF)
    uses: list[list] = [[] for _ in range(iterations * P)]
    for u in np.flatnonzero(cand >= 0):
        pos = L.cand_pos[cand[u]].astype(np.int64)
        if whole[rows[u]]:
            acc = np.concatenate([pos + k * P for k in range(-1, iterations + 1)])
        else:
            acc = pos + shift[u] * P
        before = acc[acc < 0]
        last[u] = before[-1] if len(before) else -INF
        later = acc[acc >= 0]
        nxt[u] = later[0] if len(later) else INF
        for j, p in enumerate(later):
            if p < iterations * P:
                uses[p].append((int(u), float(later[j + 1]) if j + 1 < len(later) else INF))
    units.update(last=last, next=nxt)
    events: list[list] = [[] for _ in range(iterations * P)]
    for u in range(n):
        for pos, t, kind in ((units["alloc"][u], units["t_alloc"][u], 1), (units["free"][u], units["t_free"][u], -1)):
            if 0 <= pos < iterations * P:
                events[int(pos)].append((float(t), kind, u))
    for e in events:
        e.sort()
    return units, uses, events


def _host_coupling(L: LearnedIteration, ext: np.ndarray, hx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(j, c) per unrolled position: ``j`` the op the GPU ran when the unperturbed host issued it,
    where the host was held by the GPU then (a sync: every earlier op had started; the launch
    queue within COUPLED_QUEUE of its deepest fill), else -1; ``c`` the host's own time since the
    previous op (the unperturbed gap, at most the median free gap where it was held)."""
    n = len(hx)
    started = np.searchsorted(ext, hx, side="right")
    fill = np.arange(n) - started
    j = np.minimum(started - 1, np.arange(n) - 1)
    held = (fill <= 0) | (fill >= COUPLED_QUEUE * max(int(fill.max()), 1))
    gap = np.diff(hx, prepend=hx[0])
    free = gap[~held]
    c = np.where(held, np.minimum(gap, float(np.median(free)) if len(free) else 0.0), gap)
    return np.where(held & (j >= 0), j, -1), c


def replay(L: LearnedIteration, windows: np.ndarray, q_offset: np.ndarray, budget_bytes: int, *,
           hints: bool = True, bandwidth: float | None = None, trace: list | None = None) -> Replay:
    """Replay the shim under ``budget_bytes`` (bytes) following the plan's windows ``windows``
    (rows of L's windows) with their PREFETCH ``q_offset`` ops after their SWAP_OUT position, on
    the host's clock (the module's docstring). ``hints``: the plan carries the IDLE hints of every
    candidate window (eviction beyond it by Belady's choice; else the least recently used).
    ``bandwidth``: B/s of each copy engine with both at work (default L's, the one-way figure).
    ``trace``: a list the middle iteration's events are appended to, as (unrolled position, a
    counter's name of Replay, unit): which block each eviction, drain, handoff... was for.
    Returns the middle iteration's figures (Replay)."""
    P, T, K = L.period, L.iteration_ns, ITERATIONS
    ext = np.concatenate([L.times + k * T for k in range(K + 1)])
    hx = np.concatenate([L.issue + k * T for k in range(K + 1)])
    dur = np.diff(ext)
    coupled, cost = _host_coupling(L, ext, hx)
    units, uses, events = _units(L, K)
    st = _State(units, int(budget_bytes), float(bandwidth or L.bandwidth), hints)
    st.soon = max(1, min(SOON_OPS, P // 4))
    st.trace = trace
    every = L.op_all if len(L.op_all) == P else np.zeros(P, bool)
    # The plan's actions by position, on the unit of their iteration.
    unit_of = _unit_cands(L, st)
    outs: list[list] = [[] for _ in range(K * P)]
    ins: list[list] = [[] for _ in range(K * P)]
    for w, dq in zip(np.asarray(windows, np.int64), np.asarray(q_offset, np.int64)):
        c = int(L.win_cand[w])
        for k in range(K):
            s = int(L.win_s[w]) + k * P
            u = unit_of.get((c, k), unit_of.get((c, None)))
            if u is None or s >= K * P:
                continue
            outs[s].append(u)
            if s + dq < K * P:
                ins[s + dq].append(u)
    # Live at the start: blocks live over the iteration, those allocated before it and not freed.
    start = st.alloc < 0
    st.live[start] = True
    st.mapped = int(st.vsize[start & st.served].sum())
    st.others = int(st.size[start & ~st.served].sum())
    G = np.zeros(K * P + 1)
    Hs = np.zeros(K * P)
    g_prev_end = 0.0
    for k in range(K * P):
        st.op = k
        st.counting = P <= k < 2 * P
        j = coupled[k]
        h = st.H + cost[k]
        if j >= 0:
            h = max(h, hx[k] + (G[j] - ext[j]))
        st.H = max(st.H, h)
        st.poll()
        op_units = [u for u, _ in uses[k]]
        for u in op_units:
            st.stamp[u] = k
        for u in ins[k]:  # prefetches before the op
            if st.live[u] and st.swap_in(u):
                st.add("prefetches", u)
        wait = st.barrier
        for u in op_units:
            wait = max(wait, st.make_usable(u))
        if every[k % P]:  # it may touch anything: every block comes back, none goes out for it
            mine = st.live & st.served
            st.stamp[mine] = k
            for u in np.flatnonzero(mine & (st.state != RES)):
                wait = max(wait, st.make_usable(int(u)))
        st.evict(0)
        G[k] = max(g_prev_end, st.H, wait)
        Hs[k] = st.H
        g_prev_end = G[k] + dur[k]
        for u, nxt in uses[k]:
            st.use_end[u] = g_prev_end
            st.last[u], st.next[u] = k, nxt
            st.lru[u] = k
        for u in outs[k]:  # the plan's swap-outs at the op's end
            if st.live[u] and st.state[u] in (RES, IN_PENDING):
                st.state[u] = RES
                st.swap_out(u)
                st.add("planned_outs", u)
        st.stamp[st.stamp == k] = -1  # swap_op_end: its blocks may go out for the allocations after it
        if every[k % P]:
            st.fence = g_prev_end  # its stream's fence: a later copy out waits for it on the GPU
        for _, kind, u in events[k]:
            if kind > 0:
                _alloc(st, u)
            else:
                _free(st, u, g_prev_end)
    G[K * P] = g_prev_end
    it_ns = float(G[2 * P] - G[P])
    c = st.count
    return Replay(iteration_ns=it_ns, time_ratio=it_ns / T if T else 1.0, host_wait_ns=float(st.host_wait), **c,
                  gpu_ns=G[P : 2 * P] - G[P], host_ns=Hs[P : 2 * P] - G[P])


def _unit_cands(L: LearnedIteration, st: _State) -> dict:
    """(candidate row, iteration k) -> unit, for tensors of the iteration; (candidate, None) ->
    unit for blocks live over it."""
    out = {}
    P = L.period
    cand_of_unit = st.cand_row
    for u in np.flatnonzero(cand_of_unit >= 0):
        c = int(cand_of_unit[u])
        if st.alloc[u] < 0 and st.free[u] >= NEVER_FREED:
            out[(c, None)] = int(u)
        else:
            out[(c, int(st.alloc[u] // P))] = int(u)
    return out


def _alloc(st: _State, u: int) -> None:
    """An allocation after the op: cached memory of its class, else the budget held and a map."""
    st.live[u] = True
    st.state[u] = RES
    st.lru[u] = st.op + 0.5  # revive: stamped now, after the op it follows
    if not st.served[u]:
        st.others += int(st.size[u])
        return
    vs = int(st.vsize[u])
    if st.cache.get(vs):
        st.cache[vs].pop(0)  # cache_take: the oldest of its class (the newest are put last)
        return
    st.hold(vs)
    after = st.map(u)
    st.barrier = max(st.barrier, after)


def _free(st: _State, u: int, gpu_at: float) -> None:
    """A free after the op: its memory cached (mapped) until the GPU passes the free, when it had any."""
    if not st.live[u]:
        return
    st.live[u] = False
    if not st.served[u]:
        st.others -= int(st.size[u])
        return
    if st.state[u] == OUT_PENDING and not st.given[u]:
        st.cancel(u)
    if st.state[u] in (RES, IN_PENDING):
        st.cache.setdefault(int(st.vsize[u]), []).append(gpu_at)
    st.state[u] = OUT
