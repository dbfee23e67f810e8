"""Ranks of a distributed job: which traced process is which rank, one capture per rank, and the
per-rank figures ``summary`` and ``report`` show.

Every process of a traced job tree writes to one ring, so one run gives one capture holding all
ranks (the merged capture). A process's rank is what its launcher put in its environment (the
shim reads it into the PROCESS record: torchrun's RANK / LOCAL_RANK / WORLD_SIZE, Open MPI's
OMPI_COMM_WORLD_*, PMI_RANK / PMI_SIZE, Slurm's SLURM_PROCID / SLURM_NTASKS), else the rank of its
largest NCCL communicator (NOTE ``nccl.comm<i>``). A process without a rank of its own belongs to
the rank of its nearest traced ancestor that has one (a DataLoader worker, a compile worker);
processes with neither (the torchrun agent) belong to no rank. A Slurm rank of a one-task job is
no rank: every ``srun`` job step has SLURM_PROCID=0.

``split(path)`` writes ``<stem>.rank<R>.pyobmem`` next to the merged capture, one per rank whose
processes used CUDA: the records of the rank's processes, in the merged capture's order, with its
metadata and end record. The merged capture stays as it is, so a rank that died is in both, up to
its last record, and ``pyobmem split`` can redo it any time (the launcher does it at the end of the
run).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from . import abi
from .capture import Capture, CaptureWriter, decode_records, read_header
from .errors import PyobmemError
from .model.iterations import detect_iterations
from .model.queries import live_bytes_peak
from .units import format_bytes, format_duration

SPLIT_CHUNK = 1 << 20  # records read at a time (64 MiB)
_SOURCE_NAMES = {abi.RankSource.TORCH: "RANK", abi.RankSource.OMPI: "OMPI", abi.RankSource.PMI: "PMI",
                 abi.RankSource.SLURM: "SLURM"}
_ACTIVITY = (abi.Ev.ALLOC, abi.Ev.LAUNCH, abi.Ev.MEMCPY, abi.Ev.MEMSET, abi.Ev.GRAPH_LAUNCH)


@dataclass(frozen=True)
class Rank:
    """One rank of a job and the traced processes that belong to it."""

    rank: int
    local_rank: int | None
    world_size: int | None
    source: str  # "RANK", "OMPI", "PMI", "SLURM" (environment) or "NCCL" (its communicator)
    pids: tuple[int, ...]  # the rank's processes, in order of appearance; the first has the rank itself
    active: bool = True  # any of them allocated device memory or launched work

    @property
    def label(self) -> str:
        return f"rank {self.rank}"


def _nccl_rank(notes: dict) -> tuple[int, int] | None:
    """(rank, nranks) of the largest communicator noted by a process (``nccl.comm<i>`` notes)."""
    best = None
    for key, value in notes.items():
        if not key.startswith(abi.NOTE_NCCL_COMM):
            continue
        fields = dict(f.split("=", 1) for f in value.split() if "=" in f)
        try:
            rank, nranks = int(fields["rank"]), int(fields["nranks"])
        except (KeyError, ValueError):
            continue
        if rank >= 0 and nranks > 0 and (best is None or nranks > best[1]):
            best = (rank, nranks)
    return best


def own_ranks(processes: np.ndarray, notes: dict) -> dict[int, tuple[int, int | None, int | None, str]]:
    """pid -> (rank, local rank, world size, source) of the processes given a rank themselves."""
    out = {}
    for p in processes:
        pid, source = int(p["pid"]), int(p["rank_source"])
        world = int(p["world_size"]) or None
        if source != abi.RankSource.NONE and int(p["rank"]) >= 0 and not (
                source == abi.RankSource.SLURM and (world or 0) <= 1):
            local = int(p["local_rank"])
            out[pid] = (int(p["rank"]), local if local >= 0 else None, world,
                        _SOURCE_NAMES.get(source, str(source)))
            continue
        nccl = _nccl_rank(notes.get(pid, {}))
        if nccl is not None:
            out[pid] = (nccl[0], None, nccl[1], "NCCL")
    return out


def assign(processes: np.ndarray, notes: dict, active_pids=None) -> list[Rank]:
    """The ranks of a job from its processes (``Capture.processes``) and notes, sorted by rank.
    ``active_pids``: the pids that used CUDA (None: all)."""
    own = own_ranks(processes, notes)
    parent = {int(p["pid"]): int(p["ppid"]) for p in processes}
    groups: dict[int, list[int]] = {}
    for p in processes:
        pid = int(p["pid"])
        at, seen = pid, set()
        while at not in own and at in parent and at not in seen:  # nearest traced ancestor with a rank
            seen.add(at)
            at = parent[at]
        if at in own:
            groups.setdefault(own[at][0], []).append(pid)
    out = []
    for rank, pids in sorted(groups.items()):
        first = next(pid for pid in pids if pid in own and own[pid][0] == rank)
        _, local, world, source = own[first]
        pids = [first] + [p for p in pids if p != first]
        active = active_pids is None or any(p in active_pids for p in pids)
        out.append(Rank(rank, local, world, source, tuple(pids), active))
    return out


def active_pids(cap: Capture) -> set[int]:
    """The processes of ``cap`` that allocated device memory or issued work."""
    return set(np.unique(cap.blocks["pid"]).tolist()) | set(np.unique(cap.ops["pid"]).tolist())


def ranks(cap: Capture) -> list[Rank]:
    """The ranks in ``cap`` (a merged capture or one rank's), sorted by rank."""
    return assign(cap.processes, cap.notes, active_pids(cap))


def subset(cap: Capture, pids) -> Capture:
    """The part of ``cap`` written by ``pids``: the same Capture with every row of other processes
    left out and the row indices (accesses, swaps, NCCL calls, GPU time samples) renumbered."""
    pids = np.asarray(sorted(set(int(p) for p in pids)), np.uint32)

    def mine(a: np.ndarray) -> np.ndarray:
        return np.isin(a["pid"], pids)

    bm, om = mine(cap.blocks), mine(cap.ops)
    new_block = np.cumsum(bm) - 1
    new_op = np.cumsum(om) - 1

    def remap(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        ok = rows >= 0
        return np.where(ok, new_block[np.where(ok, rows, 0)] if len(new_block) else -1, -1)

    acc = cap.accesses
    if len(acc):
        acc = acc[om[acc["op"]] & bm[acc["block"]]].copy()
        acc["op"], acc["block"] = new_op[acc["op"]], new_block[acc["block"]]
    swaps = cap.swaps[mine(cap.swaps)].copy()
    swaps["block"] = remap(swaps["block"])
    nccl = cap.nccl[mine(cap.nccl)].copy()
    nccl["send_block"], nccl["recv_block"] = remap(nccl["send_block"]), remap(nccl["recv_block"])
    gpu = cap.gpu_times[mine(cap.gpu_times)].copy()
    gpu["op"] = np.where(gpu["op"] >= 0, new_op[np.maximum(gpu["op"], 0)] if len(new_op) else -1, -1)
    keep = set(pids.tolist())
    drops = cap.drops[mine(cap.drops)]
    return dataclasses.replace(
        cap, blocks=cap.blocks[bm], ops=cap.ops[om], accesses=acc, swaps=swaps, nccl=nccl,
        processes=cap.processes[mine(cap.processes)], drops=drops, untracked=cap.untracked[mine(cap.untracked)],
        plans=cap.plans[mine(cap.plans)], notes={p: n for p, n in cap.notes.items() if p in keep},
        kernel_names={k: v for k, v in cap.kernel_names.items() if k[0] in keep}, gpu_times=gpu,
    )


# ---- one capture per rank ---------------------------------------------------------------------


def rank_path(merged: str, rank: int) -> str:
    """``train.pyobmem`` -> ``train.rank3.pyobmem`` (next to it)."""
    stem = merged[: -len(".pyobmem")] if merged.endswith(".pyobmem") else merged
    return f"{stem}.rank{rank}.pyobmem"


def _records(path: str, offset: int):
    size = os.path.getsize(path)
    count = (size - offset) // abi.RECORD_SIZE
    if count <= 0:
        return np.zeros(0, abi.RECORD_DTYPE)
    return np.memmap(path, dtype=abi.RECORD_DTYPE, mode="r", offset=offset, shape=(count,))


def split(path: str, force: bool = False) -> list[tuple[Rank, str]]:
    """Write one capture per active rank of the merged capture ``path`` (see the module docstring);
    returns (rank, path) pairs, none when the capture has no rank. Raises PyobmemError when an
    output exists and not ``force`` (nothing is written then) and CaptureError for a bad capture."""
    meta, offset = read_header(path)
    if isinstance(meta.get("rank"), dict):
        raise PyobmemError(f"{path} is already the capture of rank {meta['rank'].get('rank')}: nothing to split")
    recs = _records(path, offset)
    # pass 1: processes, notes and which pids used CUDA
    keep_types = [int(abi.Ev.PROCESS), int(abi.Ev.NOTE)]
    small, active = [], set()
    for i in range(0, len(recs), SPLIT_CHUNK):
        chunk = recs[i: i + SPLIT_CHUNK]
        small.append(np.array(chunk[np.isin(chunk["type"], keep_types)]))
        active.update(np.unique(chunk["pid"][np.isin(chunk["type"], [int(t) for t in _ACTIVITY])]).tolist())
    info = decode_records(np.concatenate(small) if small else np.zeros(0, abi.RECORD_DTYPE), meta, path)
    found = [r for r in assign(info.processes, info.notes, active) if r.active]
    if not found:
        return []
    outs = [(r, rank_path(path, r.rank)) for r in found]
    for _, out in outs:
        if os.path.lexists(out) and not force:
            raise PyobmemError(f"{out} exists; use -f/--force to overwrite the per-rank captures")
        if os.path.exists(out) and os.path.samefile(out, path):
            raise PyobmemError(f"{out} is the capture being split")
    # pass 2: each rank's records, in order; the end record to every one
    writers = []
    try:
        for r, out in outs:
            m = dict(meta)
            m["rank"] = {"rank": r.rank, "local_rank": r.local_rank, "world_size": r.world_size, "source": r.source,
                         "pids": list(r.pids), "merged": os.path.abspath(path)}
            writers.append(CaptureWriter(out + ".tmp", m, force=True))
        pid_sets = [np.asarray(r.pids, np.uint32) for r, _ in outs]
        for i in range(0, len(recs), SPLIT_CHUNK):
            chunk = np.array(recs[i: i + SPLIT_CHUNK])
            end = chunk["type"] == abi.Ev.CAPTURE_END
            for w, pids in zip(writers, pid_sets):
                w.write(chunk[np.isin(chunk["pid"], pids) | end])
        for w in writers:
            w.close()
        for _, out in outs:
            os.replace(out + ".tmp", out)
    except OSError as e:
        for _, out in outs:
            try:
                os.unlink(out + ".tmp")
            except OSError:
                pass
        raise PyobmemError(f"cannot write the per-rank captures: {e.strerror}") from None
    return outs


# ---- per-rank figures ---------------------------------------------------------------------------


def _device_text(cap: Capture, pids) -> str:
    """The GPU the rank's blocks were mostly on: ordinal and name (from the notes)."""
    b = cap.blocks[np.isin(cap.blocks["pid"], np.asarray(list(pids), np.uint32))]
    if not len(b):
        return "-"
    dev = np.bincount(b["device"].astype(np.int64)).argmax()
    for pid in pids:
        name = cap.notes.get(pid, {}).get(f"device{dev}.name")
        if name:
            return f"{dev}: {name}"
    return str(int(dev))


def rank_figures(cap: Capture, rank: Rank | None, file: str | None = None, iteration: bool = True) -> dict:
    """The per-rank row of summary and report: ``cap`` is the rank's part of a capture (``subset``)
    or a whole capture without ranks (``rank`` None). Sizes in bytes, times in ns."""
    ops = cap.ops
    launches = ops[ops["type"] == abi.Ev.LAUNCH]
    peak, _ = live_bytes_peak(cap.blocks)
    n = cap.nccl
    named = np.unique(np.r_[n["send_block"], n["recv_block"]])
    row = {
        "file": file or cap.path,
        "rank": None if rank is None else rank.rank,
        "local_rank": None if rank is None else rank.local_rank,
        "world_size": None if rank is None else rank.world_size,
        "source": None if rank is None else rank.source,
        "pids": [int(p) for p in (rank.pids if rank is not None else cap.processes["pid"])],
        "device": _device_text(cap, rank.pids if rank is not None else cap.processes["pid"].tolist()),
        "peak_live_bytes": int(peak),
        "blocks": int(len(cap.blocks)),
        "launches": int(len(launches)),
        "attributed_fraction": round(float(np.count_nonzero(launches["n_touched"] > 0)) / len(launches), 6)
        if len(launches) else None,
        "opaque_fraction": round(float(np.count_nonzero(launches["flags"] & abi.LaunchFlag.OPAQUE)) / len(launches), 6)
        if len(launches) else None,
        "copies": int(np.count_nonzero(ops["type"] == abi.Ev.MEMCPY)),
        "nccl_calls": int(len(n)),
        "nccl_bytes": int(n["bytes"].sum()),
        "nccl_blocks": int(np.count_nonzero(named >= 0)),
        "dropped": int(cap.drops["count"].sum()),
        "swapped_out_bytes": int(cap.swaps["bytes"][cap.swaps["direction"] == 0].sum()),
        "iteration_ns": None,
    }
    if iteration and len(launches):
        it = detect_iterations(cap)
        if it.main_regime is not None:
            row["iteration_ns"] = int(round(it.iteration_ns))
    return row


def rank_views(captures: list[Capture]) -> list[tuple[Rank | None, Capture]]:
    """Each active rank of each capture with its part of the capture (``subset``); a capture without
    ranks: (None, the capture)."""
    out = []
    for cap in captures:
        found = [r for r in ranks(cap) if r.active]
        if not found:
            out.append((None, cap))
        out += [(r, subset(cap, r.pids)) for r in found]
    return out


def rank_rows(captures: list[Capture], iteration: bool = True) -> list[dict]:
    """One row of ``rank_figures`` per rank of each capture (a capture without ranks: one row)."""
    return [rank_figures(view, r, file=view.path, iteration=iteration) for r, view in rank_views(captures)]


def pick(captures: list[Capture], rank: int | None = None) -> tuple[Capture, Rank | None]:
    """The part of ``captures`` to analyse on its own: rank ``rank`` (PyobmemError if no capture has
    it), by default the lowest rank, and the first capture when none has ranks."""
    views = [(r, v) for r, v in rank_views(captures) if r is not None]
    if rank is None:
        if not views:
            return captures[0], None
        r, v = min(views, key=lambda rv: rv[0].rank)
        return v, r
    for r, v in views:
        if r.rank == rank:
            return v, r
    have = ", ".join(str(r.rank) for r, _ in views) or "none"
    raise PyobmemError(f"no rank {rank} in the captures (ranks: {have})", 2)


def has_ranks(captures: list[Capture]) -> bool:
    return any(r.active for cap in captures for r in ranks(cap))


def table_rows(rows: list[dict], with_file: bool = False) -> tuple[list[str], list[list[str]]]:
    """(headers, cells) of the rank table, sizes and times as text."""
    def pct(v):
        return "-" if v is None else f"{100 * v:.1f}%"

    headers = ["rank", "local", "pids", "GPU", "peak live", "blocks", "launches", "attributed", "opaque",
               "iteration", "NCCL calls", "NCCL bytes", "NCCL blocks"]
    if with_file:
        headers.append("capture")
    cells = []
    for r in rows:
        c = ["-" if r["rank"] is None else str(r["rank"]), "-" if r["local_rank"] is None else str(r["local_rank"]),
             ",".join(str(p) for p in r["pids"][:3]) + ("…" if len(r["pids"]) > 3 else ""), r["device"],
             format_bytes(r["peak_live_bytes"]), f"{r['blocks']:,}", f"{r['launches']:,}",
             pct(r["attributed_fraction"]), pct(r["opaque_fraction"]),
             "-" if r["iteration_ns"] is None else format_duration(r["iteration_ns"]),
             f"{r['nccl_calls']:,}", format_bytes(r["nccl_bytes"]), f"{r['nccl_blocks']:,}"]
        if with_file:
            c.append(os.path.basename(r["file"]))
        cells.append(c)
    return headers, cells
