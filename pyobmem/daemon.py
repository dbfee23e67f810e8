"""The capture daemon: drains the shared-memory ring into a capture file.

Started by the launcher as ``python -m pyobmem.daemon --ring PATH --out FILE [--force]`` in its
own session (a Ctrl-C at the terminal does not reach it), it talks to the launcher through its
standard streams:

- stdin, line 1: the capture metadata, one JSON object. The daemon opens the ring, creates the
  capture, and answers ``ready`` on stdout, or ``error: <message>`` and exits 1.
- stdin, later: ``end <status>`` (the traced command's exit status; negative: killed by that
  signal; ``end`` alone: unknown). The daemon drains until the ring is empty (with a short grace
  for slots a killed producer reserved and never published), appends CAPTURE_END, and exits 0.
- stdin at end of file without ``end`` (or the launcher's pid gone): the launcher died. The
  daemon drains what is there, closes the capture without CAPTURE_END (it is then incomplete),
  removes the ring file (and, in swap mode, the control file), and exits.

SIGINT is ignored (the launcher decides when the run ends); SIGTERM stops like a dead launcher.
Swap mode (``--control PATH``): a ``SwapAgent`` keeps the records the planner needs in memory
(every ALLOC/FREE/PROCESS/NOTE record, and a bounded window of the most recent ops and accesses),
and at most every TICK_S seconds of draining, when new ops arrived, learns the main process's
iteration on that window and, once it repeats with high confidence, writes a plan into the control
file (pyobmem.control's double-buffer protocol). A dropped plan (a PLAN event with flags 1, or
control.plan_drops going up) makes it forget the ops before the drop and learn again. A budget
given as a fraction of the card is resolved here, from the shim's NOTE device0.total_bytes, and
stored in control.budget_bytes (until then the shim has no budget). Every plan written is also
kept beside the capture, in ``plans_path(out)`` (``train.pyobmem`` -> ``train.plans.json``: each
plan's generation, when it was written, whether the replay chose it, ``Plan.to_json()``, and for
the replay's choice the trial that kept or undid it), rewritten whole at each plan. See docs/swap.md.

If the capture cannot be written (disk full) the daemon says so in one line and keeps draining,
so the traced application never finds the ring full because of it; the capture then ends at its
last whole record and is marked incomplete.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time

import numpy as np

from . import abi
from .capture import CaptureWriter, _texts_sequential, decode_records
from .control import Control
from .errors import PyobmemError
from .ring import Ring
from .units import format_bytes

BATCH = 1 << 16  # records per drain and write (4 MiB)
IDLE_S = 0.003  # sleep when the ring is empty
STUCK_S = 2.0  # a reserved, unpublished slot is skipped after this long (while running)
FINAL_STUCK_S = 0.2  # the same when finishing
FINAL_GRACE_S = 0.5  # when finishing: give up on slots that never get published after this
FINAL_MAX_S = 10.0  # when finishing: stop even if producers keep writing


TICK_S = 1.0  # swap mode: learn/plan at most this often ...
TICK_CPU_SHARE = 0.25  # ... and spend at most this share of the time planning
# The planner's choice among candidate plans by the replay stops starting new trials after this
# (14-18 s in all on GPT medium on a slow core; the drain waits meanwhile, and the 64 MiB ring holds
# ~25 s of its records): the best plan found so far is written, the cost model's cover at least. A
# trial begun before the limit runs on (a cover ~5 s, a replay ~0.3 s there): the whole choice
# stays under ~20 s.
PLAN_LIMIT_S = 12.0
# The replay's choice is a trial: it stays only if the iterations run under it are faster than
# those under the plan it replaced, each measured over this many iterations (the first one under a
# plan left out). On the H200 the choice, made on iterations its cover had already sped up, ran
# GPT medium at 60% of its peak at ~720 ms a step against the cover's ~615 (session 23).
TRIAL_STEPS = 5
TRIAL_LIMIT_S = 30.0  # the least time a trial gets for its verdict before the plan it replaced comes back
WINDOW_RECORDS = 1 << 20  # op and access records kept for learning (64 MiB)
SHIM_WARNING = "swap.warn="  # a NOTE the shim writes for the user (native/swap.c), said on stderr
_STATIC = (abi.Ev.PROCESS, abi.Ev.ALLOC, abi.Ev.FREE, abi.Ev.NOTE, abi.Ev.NCCL)  # NCCL: its blocks stay pinned
# GPU_TIME: the planner times the iteration on the GPU clock when the samples are there
_WINDOWED = (abi.Ev.LAUNCH, abi.Ev.ACCESS, abi.Ev.MEMCPY, abi.Ev.MEMSET, abi.Ev.GRAPH_LAUNCH, abi.Ev.GPU_TIME)


def _same_cycle(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether op-key templates ``a`` and ``b`` (uint64 (P,)) are one iteration started at two ops:
    equal lengths, and b a cyclic rotation of a."""
    if len(a) != len(b):
        return False
    if not len(a):
        return True
    doubled = np.concatenate((a, a))
    for k in np.flatnonzero(a == b[0]):  # the offsets where b could start in a
        if np.array_equal(doubled[k : k + len(b)], b):
            return True
    return False


def plans_path(capture_path: str) -> str:
    """Where a swap run's plans are kept beside its capture: ``train.pyobmem`` ->
    ``train.plans.json``."""
    root, ext = os.path.splitext(capture_path)
    return (root if ext == ".pyobmem" else capture_path) + ".plans.json"


def read_plans(path: str) -> list | None:
    """The entries of a plans file (what ``SwapAgent`` keeps there), or None for a file that
    cannot be read as one."""
    try:
        with open(path) as f:
            kept = json.load(f)["plans"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [k for k in kept if isinstance(k, dict)] if isinstance(kept, list) else None


def remove_plans(path: str) -> bool:
    """Remove a plans file and its temporary (a capture's, written anew or never); False when one
    could not be removed (the error is its caller's to say)."""
    ok = True
    for p in (path, path + ".tmp"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    return ok


class SwapAgent:
    """Learns the iteration from the drained records and writes plans into the control file.

    ``feed(recs)`` takes every drained batch; ``tick(now)`` plans when it is time. ``budget`` is
    a pyobmem.planner.Budget (a fraction resolves from device0.total_bytes). ``plans_written``,
    ``last_plan`` (Plan) and ``last_reason`` (why no plan, one line) say what happened.
    ``plans_file``: where every plan written is kept as JSON (the module's docstring), None for
    nowhere; a write that fails removes the file, is said once, and planning goes on."""

    def __init__(self, control, budget, meta: dict | None = None, tick_s: float = TICK_S,
                 window_records: int = WINDOW_RECORDS, warn=None):
        self.control = control
        self.plans_file = None
        self.kept: list = []  # what plans_file holds
        self.t0 = time.monotonic()
        self.budget = budget
        self.meta = meta or {}
        self.tick_s = tick_s
        self.window_records = window_records
        self.static: list = []
        self.window: list = []
        self.window_len = 0
        self.new_ops = 0
        self.next_tick = 0.0
        self.drops_seen = control.plan_drops
        self.plans_written = 0
        self.last_plan = None
        self.last_reason = "no ops yet"
        self.pending = None  # _write's arguments: a plan waiting for the shim to adopt the one in force
        self.refined = False  # no replay's choice to try for the template in force (tried, or failed)
        self.gen = 0  # generation of the plan last written
        self.adopted_at: dict[int, int] = {}  # generation -> ts_ns of the shim's PLAN record adopting it
        self.trial = None  # the replay's choice on trial: {gen, before_ms, fallback, fallback_gen}
        self.candidate = None  # a new template seen once: it replaces the one in force if seen again
        self.idle_ticks = 0  # ticks in a row that found the template in force: the tick backs off
        self.budget_bytes = budget.resolve(None) if budget is not None else None
        self._warn = warn or _warn
        self._warned = False  # the "no plan fits" line is said once per run

    def feed(self, recs) -> None:
        t = recs["type"]
        st = recs[np.isin(t, [int(x) for x in _STATIC])]
        if len(st):
            self.static.append(st)
            notes = st[st["type"] == abi.Ev.NOTE]
            if self.budget_bytes is None and len(notes):
                self._resolve_budget()
            for _, text in _texts_sequential(notes) if len(notes) else ():
                if text.startswith(SHIM_WARNING):  # the shim's own line for the user, once each
                    self._warn(f"pyobmem: swap: {text[len(SHIM_WARNING):]}")
        win = recs[np.isin(t, [int(x) for x in _WINDOWED])]
        if len(win):
            self.window.append(win)
            self.window_len += len(win)
            self.new_ops += int(np.count_nonzero((win["type"] != abi.Ev.ACCESS) & (win["type"] != abi.Ev.GPU_TIME)))
            while self.window_len - len(self.window[0]) >= self.window_records:
                self.window_len -= len(self.window.pop(0))
        plans = recs[t == abi.Ev.PLAN]
        dropped = plans[(plans["flags"] & 1) != 0]
        adopted = abi.view(plans[(plans["flags"] & 1) == 0], abi.Ev.PLAN)
        for gen, ts in zip(adopted["generation"].tolist(), adopted["ts_ns"].tolist()):
            self.adopted_at.setdefault(gen, ts)
        if len(dropped) or self.control.plan_drops > self.drops_seen:
            self._forget(dropped)

    def _resolve_budget(self) -> None:
        notes = np.concatenate(self.static)
        for _, text in _texts_sequential(notes[notes["type"] == abi.Ev.NOTE]):
            key, _, value = text.partition("=")
            if key == f"{abi.NOTE_DEVICE}0.total_bytes" and value.isdigit():
                self.budget_bytes = self.budget.resolve(int(value))
                self.control.budget_bytes = self.budget_bytes
                return

    def _forget(self, dropped) -> None:
        """The shim left the plan: learn again from the ops after the drop."""
        self.drops_seen = self.control.plan_drops
        if len(dropped):
            t = int(dropped["ts_ns"][-1])
            kept = [w[w["ts_ns"] > t] for w in self.window]
            self.window = [w for w in kept if len(w)]
            self.window_len = sum(len(w) for w in self.window)
        else:
            self.window, self.window_len = [], 0
        self.pending = None
        self.last_plan = None
        self.candidate = None
        self.trial = None
        self.idle_ticks = 0
        self.next_tick = 0.0  # learn again at the next tick, not after a back-off
        self.last_reason = "plan dropped by the shim; learning again"
        self.new_ops = 0

    def tick(self, now: float | None = None) -> bool:
        """Plan if it is time; returns True when a plan was written."""
        now = time.monotonic() if now is None else now
        if now < self.next_tick:
            return False
        if self.pending is not None:
            return self._write(*self.pending)
        if not self.new_ops or self.budget_bytes is None:
            return False
        t0 = time.monotonic()
        # The first plan of a template is the cost model's cover (seconds); once the records hold
        # TRIAL_STEPS iterations under it, a tick refines it by the host-clock replay (make_plan's
        # choice: up to PLAN_LIMIT_S), a trial judged by the iterations run under it (_judge).
        want = self.last_plan is not None and not self.refined
        refine = False
        try:
            learned = self._learn()
            if self.trial is not None:
                restored = self._judge(learned, now)
                if restored is not None:
                    return restored
                if self.trial is not None:
                    return False  # its iterations are still running: nothing to plan meanwhile
            # Only the template in force is refined: a new one gets its cover first, and its own trial.
            refine = (want and learned is not None and _same_cycle(learned.keys, self.last_plan.template_keys)
                      and len(self._steps_under(learned, self.gen)) >= TRIAL_STEPS)
            plan = None if learned is None else self._plan(learned, choose=refine)
        except Exception as e:  # noqa: BLE001
            if not (want or self.trial is not None):
                raise
            # No choice is tried again (the drain waited for it); one on trial gives way to the cover.
            self.refined = True
            if self.trial is not None:
                t, self.trial = self.trial, None
                self.pending = (t["fallback"], True, None, t["fallback_gen"])
                self._warn(f"pyobmem: swap: judging the replay's choice failed ({type(e).__name__}: {e}); "
                           f"plan {t['fallback_gen']} comes back")
            else:
                self._warn(f"pyobmem: swap: refining the plan failed ({type(e).__name__}: {e}); the first plan stays")
            return False
        finally:
            spent = time.monotonic() - t0
            # While the template in force holds, learning again backs off (up to 8 times apart); a
            # trial is judged as soon as its iterations have run.
            backoff = 1 if self.trial is not None else 1 << min(self.idle_ticks, 3)
            self.next_tick = now + max(self.tick_s, spent / TICK_CPU_SHARE) * backoff
            self.new_ops = 0
        if plan is None:
            self.refined |= refine  # a choice that gave no plan is not tried again either
            return False
        # Learning goes on after a plan: what looked like the iteration early on (a model's layers
        # while its weights are set up, or one pass after a drop) gives way to the training step
        # once the records hold two of them. A template that is the one in force started at
        # another op is the same; a new one replaces it once two ticks in a row have found it
        # (an evaluation stretch in the window can show another for a while).
        if self.last_plan is not None:
            if _same_cycle(plan.template_keys, self.last_plan.template_keys):
                self.candidate = None
                if refine:
                    self.refined = True
                    if not np.array_equal(plan.actions, self.last_plan.actions):
                        before = float(np.median(self._steps_under(learned, self.gen)))
                        wait = max(self.tick_s, (TRIAL_STEPS + 2) * before / 1e3)
                        wrote = self._write(plan, refined=True, trial={
                            "before_ms": before, "fallback": self.last_plan, "fallback_gen": self.gen,
                            "deadline": now + max(TRIAL_LIMIT_S, 4 * wait)})
                        # Judged once its iterations have run, not after the choice's own back-off
                        # (4 times its ~15 s on GPT medium, where a slower choice costs each step).
                        self.next_tick = now + wait
                        return wrote
                if refine or not want:  # a refine waiting for iterations under the plan does not back off
                    self.idle_ticks += 1
                return False
            self.idle_ticks = 0
            if self.candidate is None or not _same_cycle(plan.template_keys, self.candidate):
                self.candidate = plan.template_keys
                self.last_reason = "another iteration seen; replacing the plan if it holds"
                return False
        elif not len(plan.actions):
            self.last_reason = "the job fits the budget: nothing to swap"  # no plan to follow yet
            return False
        self.candidate = None
        # Planned on a refining tick, the new template's plan is the replay's choice already.
        return self._write(plan, refined=refine)

    def plan_now(self, choose: bool = False):
        """Learn and plan on the records kept; None (and ``last_reason``) when there is no plan.
        ``choose``: make_plan's choice among candidate plans by the host-clock replay (up to
        PLAN_LIMIT_S), else the cost model's cover alone."""
        learned = self._learn()
        return None if learned is None else self._plan(learned, choose)

    def _learn(self):
        """The LearnedIteration of the records kept, or None (and ``last_reason``)."""
        from . import planner  # deferred: the planner loads the model (scipy), needed in swap mode only

        if not self.window:
            return None
        recs = np.concatenate(self.static + self.window)
        recs = recs[np.argsort(recs["ts_ns"], kind="stable")]
        cap = decode_records(recs, self.meta, "<live>")
        learned = planner.learn_iteration(cap, min_swap_bytes=self.control.min_swap_bytes or planner.DEFAULT_MIN_SWAP_BYTES,
                                           by_site=True)
        if isinstance(learned, planner.NoPlan):
            self.last_reason = learned.reason
            return None
        return learned

    def _steps_under(self, learned, gen: int) -> np.ndarray:
        """Host durations (ms, float64 (n,)) of the learned regime's iterations that began after the
        shim adopted plan ``gen``, the first of them left out (it meets the plan's changes); empty
        before the adoption. The host waits for the GPU at every step's loss read, so in the steady
        state this is the step's time."""
        at = self.adopted_at.get(gen)
        if at is None:
            return np.zeros(0)
        it = learned.it
        rows = it.main_rows()
        t0 = it.t_start[rows].astype(np.int64)
        return ((it.t_end[rows].astype(np.int64) - t0)[t0 >= at] / 1e6)[1:]

    def _judge(self, learned, now: float):
        """Keep the replay's choice on trial when TRIAL_STEPS iterations under it are faster (median)
        than those under the plan it replaced; else, or when no verdict came by the trial's deadline
        (TRIAL_LIMIT_S at least: the record window may not hold its iterations) or the iteration
        learned is no longer the one the choice is for, write that plan again. Returns None while
        the trial goes on or when the choice stays, else ``_write``'s answer for the plan restored."""
        t = self.trial
        if learned is not None and not _same_cycle(learned.keys, self.last_plan.template_keys):
            return self._undo(t, {"kept": False, "why": "another iteration was learned before the verdict"})
        after = self._steps_under(learned, t["gen"]) if learned is not None else np.zeros(0)
        if len(after) < TRIAL_STEPS:
            if now > t["deadline"]:
                return self._undo(t, {"kept": False, "why": f"{len(after)} iterations under it by the deadline"})
            return None
        ms = float(np.median(after))
        verdict = {"iteration_ms": round(ms, 3), "previous_iteration_ms": round(t["before_ms"], 3), "kept": ms < t["before_ms"]}
        if not verdict["kept"]:
            return self._undo(t, verdict)
        self.trial = None
        self._note(t["gen"], verdict)
        self.last_reason = f"plan {t['gen']} (the replay's choice) kept: {ms:.1f} ms an iteration against {t['before_ms']:.1f}"
        return None

    def _undo(self, t: dict, verdict: dict) -> bool:
        """End trial ``t`` by writing the plan it replaced again (``verdict``: into the plans file)."""
        self.trial = None
        self._note(t["gen"], verdict)
        wrote = self._write(t["fallback"], refined=True, restores=t["fallback_gen"])
        self.last_reason = (f"the replay's choice (plan {t['gen']}) undone ({verdict.get('why') or 'not faster'}): "
                            f"plan {t['fallback_gen']}'s actions " + ("are back" if wrote else "wait for the shim"))
        return wrote

    def _note(self, gen: int, verdict: dict) -> None:
        """The trial's verdict on plan ``gen``, in its plans-file entry."""
        for k in self.kept:
            if k["generation"] == gen:
                k["trial"] = verdict
        self._save()

    def _plan(self, learned, choose: bool):
        """make_plan on ``learned`` at the budget (see plan_now); None when there is no plan to write."""
        from . import planner  # deferred: as in _learn (scipy, swap mode only)

        plan = planner.make_plan(learned, self.budget_bytes, choose=choose, limit_s=PLAN_LIMIT_S if choose else None)
        if not plan.feasible:
            self.last_reason = (
                f"no plan fits the budget {format_bytes(self.budget_bytes, digits=2)}: the job needs at least "
                f"{format_bytes(plan.needed_bytes, digits=2)} at one op, and the best plan reaches "
                f"{format_bytes(plan.predicted_peak, digits=2)}"
            )
            if plan.saved_bytes <= 0:
                plan = plan.hints_only()  # its swaps lower nothing and would only slow the job
            if not self._warned:
                self._warned = True
                follow = "the shim follows the best plan and evicts" if plan.swaps else "the shim keeps the budget by evicting"
                self._warn(f"pyobmem: swap: {self.last_reason}; {follow} on its own beyond it (slower)")
            if not len(plan.actions) or len(plan.actions) > abi.PLAN_MAX_ACTIONS:
                return None
        return plan

    def _write(self, plan, refined: bool = False, trial: dict | None = None, restores: int | None = None) -> bool:
        """Write ``plan`` (``refined``: no replay's choice to try after it; ``trial``: it is the
        replay's choice, judged by ``_judge``; ``restores``: the generation it writes again)."""
        gen = self.control.write_plan(plan)
        if gen is None:
            self.pending = (plan, refined, trial, restores)  # the shim has not adopted the plan in force yet
            return False
        self.pending = None
        self.last_plan = plan
        self.refined = refined
        self.gen = gen
        self.trial = None if trial is None else dict(trial, gen=gen)
        self.plans_written += 1
        chosen = refined and restores is None
        if restores is None:
            self.last_reason = f"plan {gen} written" + (" (refined by the host-clock replay)" if chosen else "")
        if self.plans_file is not None:
            entry = {"generation": gen, "written_s": round(time.monotonic() - self.t0, 3), "chosen_by_replay": chosen,
                     "plan": plan.to_json()}
            if restores is not None:
                entry["restores"] = restores
            self.kept.append(entry)
            self._save()
        return True

    def _save(self) -> None:
        """Rewrite plans_file with the plans kept (a temporary file renamed over it: a reader never
        sees half of one)."""
        if self.plans_file is None:
            return
        tmp = self.plans_file + ".tmp"
        try:
            text = json.dumps({"plans": self.kept}, indent=1)
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, self.plans_file)
        except Exception as e:  # noqa: BLE001 (a full disk, or a bug of ours: never the planning's end)
            remove_plans(self.plans_file)  # not a file that holds some of the plans only
            why = e.strerror if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
            self._warn(f"pyobmem: swap: cannot write {self.plans_file} ({why}); the plans are not kept there")
            self.plans_file = None


class Daemon:
    """Drains ``ring`` into ``writer`` until told to finish. ``control_fd`` carries the launcher's
    lines (see the module docstring); ``parent_pid`` is watched so the daemon never outlives it."""

    def __init__(
        self, ring: Ring, writer: CaptureWriter, control_fd: int, parent_pid: int | None = None, pending: bytes = b"",
        swap: SwapAgent | None = None,
    ):
        self.swap = swap
        self.ring = ring
        self.writer: CaptureWriter | None = writer
        self.control_fd = control_fd
        self.parent_pid = parent_pid
        self.lost_to_io = 0  # records drained but not written (capture write failed)
        self._buf = pending  # control bytes already read
        self._stop = False

    def run(self) -> bool:
        """Drain until the launcher says ``end`` (then finish: returns True) or goes away (False)."""
        signal.signal(signal.SIGTERM, self._on_term)
        if b"\n" in self._buf:
            status = self._parse_control()
            if status is not None:
                self.finish(status[0])
                return True
        while not self._stop:
            n = self._drain_once(STUCK_S)
            if n >= BATCH:
                ready = select.select([self.control_fd], [], [], 0)[0]
            else:
                ready = select.select([self.control_fd], [], [], IDLE_S)[0]
            if ready:
                status = self._read_control()
                if status is not None:
                    self.finish(status[0])
                    return True
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                break
        self._final_drain()
        self._close(end=None)
        return False

    def _on_term(self, signum, frame) -> None:
        self._stop = True

    def _read_control(self) -> tuple[int | None] | None:
        """Read what the launcher sent. Returns (status,) on ``end``; stops the loop on EOF."""
        try:
            chunk = os.read(self.control_fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            self._stop = True
            return None
        self._buf += chunk
        return self._parse_control()

    def _parse_control(self) -> tuple[int | None] | None:
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            words = line.split()
            if words and words[0] == b"end":
                try:
                    return (int(words[1]) if len(words) > 1 else None,)
                except ValueError:
                    return (None,)
        return None

    def _drain_once(self, stuck_s: float) -> int:
        recs = self.ring.drain(max_records=BATCH, stuck_timeout_s=stuck_s)
        if len(recs):
            self._write(recs)
        if self.swap is not None:
            try:
                if len(recs):
                    self.swap.feed(recs)
                self.swap.tick()
            except Exception as e:  # the planner must never stop the drain
                _warn(f"pyobmem: swap planner failed ({type(e).__name__}: {e}); no new plans")
                self.swap = None
        return len(recs)

    def _write(self, recs) -> None:
        if self.writer is None:
            self.lost_to_io += len(recs)
            return
        before = self.writer.records_written
        try:
            self.writer.write(recs)
        except OSError as e:
            # One line, then keep draining so producers never block on us.
            _warn(
                f"pyobmem: error: cannot write the capture ({e.strerror}); it ends here, "
                "events are drained and discarded until the run ends"
            )
            self.lost_to_io += len(recs) - (self.writer.records_written - before)
            self._abandon_writer()

    def _abandon_writer(self) -> None:
        writer, self.writer = self.writer, None
        try:
            writer.close()
        except OSError:
            pass

    def _final_drain(self) -> int:
        """Drain until the ring is empty; returns slots given up (reserved, never published)."""
        start = last_progress = time.monotonic()
        while True:
            if self._drain_once(FINAL_STUCK_S):
                last_progress = time.monotonic()
                if last_progress - start < FINAL_MAX_S:
                    continue
            head, tail = int(self.ring.header["head"][0]), int(self.ring.header["tail"][0])
            now = time.monotonic()
            if head <= tail:
                return 0
            if now - last_progress >= FINAL_GRACE_S or now - start >= FINAL_MAX_S:
                return head - tail
            time.sleep(IDLE_S)

    def finish(self, exit_status: int | None) -> None:
        """Drain everything, append CAPTURE_END (events dropped in total, exit status), close."""
        left = self._final_drain()
        dropped = self.ring.dropped + self.ring.skipped + left
        self._close(end=(dropped, exit_status))

    def _close(self, end: tuple[int, int | None] | None) -> None:
        if self.writer is None:
            return
        try:
            if end is not None:
                self.writer.finish(end[0], end[1], time.monotonic_ns())
            self.writer.close()
        except OSError as e:
            _warn(f"pyobmem: error: cannot write the end of the capture ({e.strerror})")
        self.writer = None


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m pyobmem.daemon", description=__doc__.split("\n\n")[0])
    p.add_argument("--ring", required=True, help="path of the event ring (created by the launcher)")
    p.add_argument("--out", required=True, help="capture file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing capture file")
    p.add_argument("--control", help="swap mode: the control file (created by the launcher)")
    p.add_argument("--budget", help="swap mode: the budget as given to the launcher (size or fraction of the card)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    parent = os.getppid()
    control = sys.stdin.fileno()
    line, pending = _read_line(control)
    if line is None:
        return 1  # the launcher went away before the run started
    try:
        meta = json.loads(line)
        ring = Ring.open(args.ring)
        swap = None
        if args.control:
            from .planner import parse_budget  # deferred: see plan_now

            swap = SwapAgent(Control.open(args.control), parse_budget(args.budget) if args.budget else None, meta)
        writer = CaptureWriter(args.out, meta, force=args.force)
    except FileExistsError:
        return _fail(f"{args.out} exists (use -f/--force to overwrite)")
    except OSError as e:
        return _fail(f"{e.filename or args.out}: {e.strerror}")
    except (ValueError, PyobmemError) as e:
        return _fail(str(e).splitlines()[0])
    # The capture is new (or overwritten with -f): a plans file beside it is an earlier run's.
    cleared = remove_plans(plans_path(args.out))
    if swap is not None:
        if cleared:
            swap.plans_file = plans_path(args.out)
        else:
            _warn(f"pyobmem: swap: cannot replace {plans_path(args.out)}; the plans are not kept there")
    print("ready", flush=True)
    daemon = Daemon(ring, writer, control, parent_pid=parent, pending=pending, swap=swap)
    if not daemon.run():
        ring.close(unlink=True)  # the launcher is gone: nobody else removes the ring
        if swap is not None:
            swap.control.close(unlink=True)  # nor the control file next to it (<ring>.ctl)
    else:
        ring.close(unlink=False)  # the launcher removes it
    return 0


def _read_line(fd: int) -> tuple[bytes | None, bytes]:
    """The first line from ``fd`` (unbuffered: later bytes are returned, not lost), and the rest."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, b""
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    return line, rest


def _warn(line: str) -> None:
    """One line on stderr; a closed stderr (`pyobmem-run cmd 2>&1 | head`) must not stop the drain."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _fail(message: str) -> int:
    print(f"error: {message}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
