"""Session 24's CPU experiments on the committed GPT medium trace at 50% (18,286,116,864 B to the
shim): variants of the chosen plan scored by the planner's host-clock replay (pyobmem.planner.replay),
which predicted the H200's 50% runs within 0.05. Run from the repository root; ~2 min.
Printed figures are in README.md ("On the CPU")."""
import sys
import numpy as np
sys.path.insert(0, ".")
from pyobmem.capture import read_capture  # noqa: E402
from pyobmem.planner import frontier as fr, policy, replay as R  # noqa: E402
from pyobmem.planner.learning import learn_iteration  # noqa: E402

L = learn_iteration(read_capture("tests/data/gpt_medium_tensors.pyobmem"), by_site=True)
B, P = 18286116864, L.period
skip = policy._crosses_all(L)
cov = tuple(c & ~skip[:, None] for c in (policy._nominal_absence(L), policy._nominal_absence(L, held=True)))
w, sim, rep = policy._choose(L, B, 2.0, cov)
wa = np.array(w, np.int64)
q = sim.q[: len(wa)] - (L.win_s[wa] + P)
span = L.win_n[wa] - L.win_s[wa]
print("chosen plan", round(R.replay(L, wa, q, B).time_ratio, 4))
due = L.win_n[wa] % P
for shift in (50, 100, 200, 400):  # the optimizer's windows prefetched earlier
    q2 = q.copy()
    q2[due >= 1300] = np.maximum(q2[due >= 1300] - shift, 1)
    print("optimizer's prefetches", shift, "ops earlier", round(R.replay(L, wa, q2, B).time_ratio, 4))
for shift in (-20, -10, -5, 5, 10, 20, 40):  # every prefetch moved
    print("every prefetch moved by", shift, round(R.replay(L, wa, np.clip(q + shift, 1, span - 1), B).time_ratio, 4))
# the frontier's shape: at each position over the budget, the windows released earliest
ws, keep, excess, chosen = fr._windows(L, skip), np.flatnonzero(~skip), L.live.astype(float) - B, set()
for p in np.flatnonzero(excess > 0):
    inside, wrapped = (ws["s"] < p) & (p < ws["n"]), ws["wraps"] & (p < ws["n"] - P)
    m = np.flatnonzero(inside | wrapped)
    o = m[np.argsort(np.where(inside, ws["rel_in"], ws["rel_wrap"])[m], kind="stable")]
    got = sum(ws["size"][i] for i in o if keep[i] in chosen)
    for i in o:
        if got >= excess[p]:
            break
        if keep[i] not in chosen:
            chosen.add(int(keep[i]))
            got += ws["size"][i]
for lead in (None, np.zeros(P)):
    print("frontier-shaped plan", "lead none" if lead is None else "no lead",
          round(policy._trial(L, sorted(chosen), B, lead).rep.time_ratio, 4))


def victim_passed(self, vsize):
    """The shim's pick_victim, but a block whose last use the GPU has not passed gives way to the
    longest-idle one it has passed (its copy out then waits for nothing)."""
    p = self.op + 1
    ok = self.live & self.cand & (self.state == R.RES) & (self.stamp != self.op)
    hinted = self.hints & ok & (self.last < p) & (self.next > p) & (self.next - self.last >= 2) & (self.next < R.INF)
    if not np.any(hinted):
        return orig(self, vsize)
    idle = np.where(hinted, self.next - p, -1.0)
    pick = orig(self, vsize)
    done = np.where(self.use_end <= self.H, idle, -1.0)
    d = int(np.argmax(done))
    return d if self.use_end[pick] > self.H and done[d] > 0 else pick


orig, R._State.victim = R._State.victim, victim_passed
print("evictions preferring a passed last use", round(R.replay(L, wa, q, B).time_ratio, 4),
      "; the plan chosen again under it", round(policy._choose(L, B, 2.0, cov)[2].time_ratio, 4))
R._State.victim = orig
