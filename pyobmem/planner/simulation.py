"""The planner's cost model: chosen idle windows simulated on the two clocks and the copy engines.

Cost model (docs/swap.md has the formulas):

- Each window: SWAP_OUT after its last access (position s): the copy runs once the GPU has run s
  (first come first served on one device-to-host engine), and the shim's release thread frees the
  memory when the copy ends. PREFETCH before position q: the latest op the host
  issues early enough for the remap (150 us per 64 MiB) and the copy (size/B) to end before the
  GPU reaches the next access n, the prefetches of all windows scheduled as late as possible on
  one host-to-device engine. The memory is mapped again when the host issues q, while the GPU is
  still at an earlier position: the block is out, at the GPU's positions, from its release to
  that one; a window where that leaves no position is not used.
- Predictions: peak = max over positions of (live bytes - absent bytes); stall = how late each
  prefetch finishes after its consumer's time, summed; time ratio = max(1 + stalls / T, copy time
  per direction / T). The saving (peak without swapping - predicted peak) never exceeds the
  model's bound at that ratio (tests/test_planner.py checks it on the real captures).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .learning import LearnedIteration

REMAP_NS = 150_000.0  # unmap+release+create+map+set-access of 64 MiB on the H200 (DESIGN.md)
REMAP_BYTES = 64 << 20


@dataclass
class _Sim:
    peak: int
    peak_at: int
    stall: np.ndarray  # per window (ns)
    useless: np.ndarray  # per window: the block would never be out
    q: np.ndarray  # prefetch position per window (unrolled, in iteration 1)
    mark: np.ndarray  # the prefetch's MARK position per window (unrolled, in iteration 1)
    absent: np.ndarray  # positions out per window
    ratio: float
    resident: np.ndarray
    wait_ns: float = 0.0  # per iteration: the GPU held at the budget for swap-outs to end


def _clocks(L: LearnedIteration, iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """(GPU execution times, host issue times) of positions 0 .. iterations*P - 1 (ns)."""
    T = L.iteration_ns
    ext = np.concatenate([L.times + k * T for k in range(iterations)])
    hx = np.concatenate([L.issue + k * T for k in range(iterations)])
    return ext, hx


def _released(ext: np.ndarray, hx: np.ndarray, s: np.ndarray, out_done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(host position h, GPU position p_out) of a block whose copy out ends at ``out_done``: the
    shim's release thread frees the memory then (within its 100 us poll), so the block is out
    from the GPU op running at that time; h is the first op the host issues after that, where a
    prefetch finds the block out whatever its mark."""
    h = np.minimum(np.maximum(np.searchsorted(hx, out_done, side="left"), s + 1), len(hx) - 1)
    p_out = np.maximum(np.searchsorted(ext, out_done, side="left"), s + 1)
    return h, p_out


def _simulate(L: LearnedIteration, w: np.ndarray, budget_bytes: int | None = None, *,
              lead: np.ndarray | None = None) -> _Sim:
    """The cost model on windows ``w`` (rows of L's windows), three iterations unrolled; figures
    of the middle one (the steady state). Two clocks: the shim acts when the host issues an op
    (``L.issue``), copies run and memory is used when the GPU executes it (``L.times``); the
    host runs ahead, so a prefetch issued at position q maps its memory while the GPU is still
    at an earlier position. Resident bytes are counted at the GPU's positions.

    With ``budget_bytes``, where the resident bytes would exceed the budget while swap-outs are
    still copying, the shim holds the op until enough of them end (``_hold``): the block is out
    from there, and the wait adds to the iteration's time (``wait_ns``).

    ``lead`` (float64 (P,), ns): the host's lead over the GPU at each position that prefetches
    are timed against (default the capture's, ``L.times - L.issue``). The host waits of the
    swapping spend the lead (on GPT medium at 75% the replay's host ran ~40 ms ahead in the
    backward pass, 295 ms unswapped), and a prefetch timed on the capture's lead then starts its
    copy too late; 0 times each prefetch as if the host ran in step with the GPU (its copy in time
    whatever the lead, its memory mapped that much earlier). Stalls and the ratio are the GPU
    clock's either way."""
    P, T = L.period, L.iteration_ns
    ext, hx = _clocks(L, 4)  # positions 0 .. 4P-1
    size = L.cand_size[L.win_cand[w]].astype(np.float64)
    d = size / L.bandwidth * 1e9
    r = REMAP_NS * size / REMAP_BYTES
    K = 3
    s = np.concatenate([L.win_s[w] + k * P for k in range(K)])
    n = np.minimum(np.concatenate([L.win_n[w] + k * P for k in range(K)]), len(ext) - 1)
    dd, rr, sz = np.tile(d, K), np.tile(r, K), np.tile(size, K)
    # Swap-outs: after the GPU ran op s, first come first served on the device-to-host engine.
    o = np.argsort(ext[s], kind="stable")
    out_done = np.empty(len(s))
    out_done[o] = _fifo(ext[s][o], dd[o])
    h, p_out = _released(ext, hx, s, out_done)
    # Prefetches: as late as possible on the host-to-device engine (latest deadline first),
    # issued by the host at q: the last position it issues early enough for the remap and copy.
    deadline = ext[n]
    o = np.argsort(-deadline, kind="stable")
    start_in = np.empty(len(s))
    start_in[o] = -_fifo(-deadline[o], dd[o])  # time reversed: the same queue backwards
    q = np.searchsorted(hx if lead is None else _lead_clock(L, lead, 4), start_in - rr, side="right") - 1
    # After the last access, never after the next use. A host running ahead issues q before the
    # GPU has even copied the block out; the model counts the memory back from the GPU's position
    # at its mark (t_map), the latest the remap can start. (The shim maps it when the host issues
    # q, earlier: the model's peak is the GPU's view; docs/swap.md "Cost model".)
    q = np.minimum(np.maximum(q, s + 1), n)
    mark, t_map = _marks(ext, hx, s, q, start_in - rr)
    back = np.searchsorted(ext, t_map, side="left")  # the GPU position when the memory is mapped again
    # A window too short for both copies: mapped again before its release, the prefetch would
    # cancel the swap-out. It goes after the release instead (the block is out for a position or
    # so, and its consumer stalls).
    late = back <= p_out
    if np.any(late):
        q[late] = np.minimum(np.maximum(q[late], h[late] + 1), n[late])
        m2, t2 = _marks(ext, hx, s[late], q[late], start_in[late] - rr[late])
        mark[late], t_map[late] = m2, t2
        back[late] = np.searchsorted(ext, t2, side="left")
    # Forward: when each prefetch really finishes (mapped at t_map, remap, then the engine); a
    # host that waited for the mark starves the GPU if the ops queued behind it take less than
    # the remap.
    o = np.argsort(t_map, kind="stable")
    done = np.empty(len(s))
    done[o] = _fifo(t_map[o] + rr[o], dd[o])
    starve = np.where(hx[q] < t_map, np.maximum(t_map + rr - ext[q], 0.0), 0.0)
    stall = np.maximum(done - deadline, 0.0) + starve
    useless = (back <= p_out) | (late & (h >= n))  # the block would never be out
    # Resident bytes over the middle iteration [P, 2P).
    okw = ~useless
    wait = 0.0
    if budget_bytes is not None and len(s):
        p_out, wait = _hold(L, ext, s, p_out, back, out_done, sz, okw, budget_bytes)
    diff = np.zeros(4 * P + 1)
    np.add.at(diff, p_out[okw], -sz[okw])
    np.add.at(diff, back[okw], sz[okw])
    out = np.cumsum(diff)[P : 2 * P]
    resident = L.live + out.astype(np.int64)
    k = int(np.argmax(resident)) if P else 0
    m = len(w)
    mid = slice(m, 2 * m)  # the windows of iteration 1: actions are taken from them
    in_iter = (n >= P) & (n < 2 * P)
    stalls = float(stall[in_iter].sum()) + wait
    copy = float(d.sum() + r.sum()) if m else 0.0
    ratio = max(1.0 + stalls / T, float(d.sum()) / T, copy / T) if m else 1.0
    useless_w = useless[mid] | useless[: m] | useless[2 * m :]
    return _Sim(peak=int(resident[k]) if P else 0, peak_at=k, stall=stall[mid], useless=useless_w, q=q[mid],
                mark=mark[mid], absent=np.maximum(back[mid] - p_out[mid], 0), ratio=ratio, resident=resident,
                wait_ns=wait)


def _lead_clock(L: LearnedIteration, lead: np.ndarray, iterations: int) -> np.ndarray:
    """Host issue times (ns) of positions 0 .. iterations*P - 1 with the host ``lead`` (ns, (P,))
    ahead of the GPU clock: non-decreasing, never after the GPU's time nor before 0."""
    ext = _clocks(L, iterations)[0]
    return np.minimum(np.maximum.accumulate(np.maximum(ext - np.tile(lead, iterations), 0.0)), ext)


def _hold(L: LearnedIteration, ext: np.ndarray, s: np.ndarray, p_out: np.ndarray, back: np.ndarray,
          out_done: np.ndarray, sz: np.ndarray, ok: np.ndarray, budget_bytes: int) -> tuple[np.ndarray, float]:
    """The shim's budget hold on the middle iteration: at each GPU position p (in order) whose
    resident bytes exceed the budget, the op waits for the swap-outs already issued there (last
    access before p) and still copying, earliest copy end first, until enough have ended; those
    blocks are out from p. Returns (p_out with the held blocks out from their position, the
    waiting in ns). Later positions run later by the waits so far (the copies do not: the
    engine keeps going while the GPU waits). A position where every issued swap-out is not
    enough waits for them all (the plan then does not fit there)."""
    P = L.period
    p_out = p_out.copy()
    delay = 0.0
    for _ in range(P):
        diff = np.zeros(4 * P + 1)
        np.add.at(diff, p_out[ok], -sz[ok])
        np.add.at(diff, back[ok], sz[ok])
        resident = L.live + np.cumsum(diff)[P : 2 * P].astype(np.int64)
        over = np.flatnonzero(resident > budget_bytes)
        # The first position over the budget that pending swap-outs can help: some issued swap-out
        # (s < pp) still copying and not yet back there (pp < p_out, pp < back), i.e. pp in
        # [s + 1, min(p_out, back)): a count of those intervals, not a scan per position.
        lo, hi = s[ok] + 1, np.minimum(p_out[ok], back[ok])
        keep = hi > lo
        cover = np.zeros(4 * P + 2, np.int64)
        np.add.at(cover, lo[keep], 1)
        np.add.at(cover, hi[keep], -1)
        helped = over[np.cumsum(cover)[P + over] > 0]
        if not len(helped):
            break
        p = P + int(helped[0])
        pend = np.flatnonzero(ok & (s < p) & (p_out > p) & (back > p))
        pend = pend[np.argsort(out_done[pend], kind="stable")]
        need = int(resident[p - P]) - budget_bytes
        k = min(int(np.searchsorted(np.cumsum(sz[pend]), need, side="left")), len(pend) - 1)
        take = pend[: k + 1]
        delay += max(0.0, float(out_done[take].max()) - (float(ext[p]) + delay))
        p_out[take] = p
    return p_out, delay


def _marks(ext: np.ndarray, hx: np.ndarray, s: np.ndarray, q: np.ndarray, latest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mark position, map time) of prefetches issued by the host at q that should start their
    remap by ``latest``: the MARK is the last GPU position whose end (the next op's start) is
    not after ``latest`` (never before the window's last access s, always before q); the shim
    waits at q until the GPU has run it, so the memory is mapped at max(issue of q, that end)."""
    mark = np.minimum(np.maximum(np.searchsorted(ext, latest, side="right") - 2, s), q - 1)
    return mark, np.maximum(hx[q], ext[np.minimum(mark + 1, len(ext) - 1)])


def _fifo(ready: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Finish times of jobs on one engine, in the given order: f_j = max(ready_j, f_(j-1)) + dur_j
    (vectorised: f_j = C_j + max_(k<=j)(ready_k - C_(k-1)), C the running sum of durations)."""
    if not len(ready):
        return np.zeros(0)
    C = np.cumsum(dur)
    return C + np.maximum.accumulate(ready - (C - dur))


def _needed(L: LearnedIteration, skip: np.ndarray | None = None) -> tuple[int, int]:
    """(bytes, position): the least resident at one position with every candidate window out
    (``skip``: bool per window, those left in)."""
    P = L.period
    if not P:
        return 0, 0
    diff = np.zeros(3 * P + 1)
    size = L.cand_size[L.win_cand].astype(np.float64)
    if skip is not None:
        size = np.where(skip, 0.0, size)
    for k in range(2):
        np.add.at(diff, L.win_s + 1 + k * P, -size)
        np.add.at(diff, L.win_n + k * P, size)
    need = L.live + np.cumsum(diff)[P : 2 * P].astype(np.int64)
    j = int(np.argmax(need))
    return int(need[j]), j


def _nominal_absence(L: LearnedIteration, held: bool = False) -> np.ndarray:
    """bool (windows, P): the GPU positions (mod P) at which each window alone keeps its block
    out under the cost model with idle copy engines (``_simulate``'s clocks and release rule):
    from its release after the copy out to the remap of the latest prefetch the host can issue
    with the remap and copy done before the next access. ``held``: from the position after its
    last access, where the budget hold (``_hold``) can keep the GPU until the copy ends."""
    P = L.period
    W = len(L.win_s)
    cov = np.zeros((W, P), bool)
    if not W or not P:
        return cov
    ext, hx = _clocks(L, 3)
    size = L.cand_size[L.win_cand].astype(np.float64)
    d = size / L.bandwidth * 1e9
    r = REMAP_NS * size / REMAP_BYTES
    s, n = L.win_s, np.minimum(L.win_n, 3 * P - 1)
    p_out = _released(ext, hx, s, ext[s] + d)[1]
    q = np.minimum(np.maximum(np.searchsorted(hx, ext[n] - d - r, side="right") - 1, s + 1), n)
    back = np.searchsorted(ext, _marks(ext, hx, s, q, ext[n] - d - r)[1], side="left")
    if held:
        p_out = s + 1
    length = np.clip(back - p_out, 0, P)
    for w in np.flatnonzero(length > 0):
        cov[w, np.arange(p_out[w], p_out[w] + length[w]) % P] = True
    return cov



def _reach(L: LearnedIteration, cov: np.ndarray) -> tuple[int, int]:
    """(position, bytes): the highest resident bytes with every window out as long as it can be
    alone (``_nominal_absence(L, held=True)``: out from the position after its last access, the
    budget hold waiting for its copy): no plan's peak is lower under the cost model."""
    if not L.period:
        return 0, 0
    size = L.cand_size[L.win_cand].astype(np.int64)
    res = L.live - (cov * size[:, None]).sum(axis=0).astype(np.int64) if len(size) else L.live
    k = int(np.argmax(res))
    return k, int(res[k])

