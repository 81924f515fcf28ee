"""Measurement conditions: what the host was doing while an engine was timed.

A route's speed on a CPU depends on what else runs there (fewer threads win on a contended
host), so the conditions of every measurement are evidence beside its figures. A
:class:`Watch` is started before a screening trial or a measuring process and stopped after
it; it records the load average, the CPU time other processes took meanwhile (the host's busy
time from ``/proc/stat`` less this process's and its children's), CPU steal and frequency
where Linux exposes them, and, with NVML (the ``gpu`` extra), each GPU's clocks and the
compute processes of others on it. Whatever is not readable here is None, never a guess.

A measurement is *busy* when other processes kept at least ``busy_share`` of the cores busy on
average (:data:`BUSY_SHARE` by default) or another process computed on a GPU. With
``timing.quiet_host`` set to ``wait`` or ``refuse``, :func:`wait_for_quiet` holds each
measurement back until the host is quiet (or refuses to go on).
"""

from __future__ import annotations

import importlib
import os
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

BUSY_SHARE = 0.25
"""Other processes keeping this share of the cores busy, on average, make a measurement busy."""

QUIET_PROBE_S = 1.0
"""How long :func:`wait_for_quiet` watches the host before each decision."""

_T = TypeVar("_T")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuState(_Model):
    """One GPU at the end of a measurement."""

    index: int
    """NVML device index."""
    sm_clock_mhz: int | None
    """SM clock then."""
    mem_clock_mhz: int | None
    """Memory clock then."""
    other_processes: int | None
    """Compute processes of others on it (not this process or its children)."""


class Conditions(_Model):
    """What the host was doing during one measurement (None: not readable here)."""

    wall_s: float
    """How long the measurement was watched."""
    cores: int
    """Logical cores of the host."""
    load_1m: float | None
    """The larger of the 1-minute load averages at its start and end."""
    other_cpu_s: float | None
    """CPU seconds that processes other than dossier's used meanwhile (every core)."""
    steal_s: float | None
    """CPU seconds the hypervisor took from this virtual machine meanwhile."""
    cpu_mhz: float | None
    """Mean current frequency of the cores at its end."""
    gpus: list[GpuState] = []
    """Each GPU at its end (empty without NVML or GPUs)."""
    waited_share: float | None = Field(None, ge=0.0, le=1.0)
    """Of the time the measuring process's threads were ready to run while it timed, the share
    they waited for a core (the scheduler's run-queue delay, Linux ``schedstat``): how far the
    engine was from having its cores to itself, whatever else ran (None: not recorded here, a
    screening trial, an older record)."""

    @property
    def other_cores(self) -> float | None:
        """Cores other processes kept busy on average (None when not readable)."""
        if self.other_cpu_s is None or self.wall_s <= 0:
            return None
        return max(self.other_cpu_s, 0.0) / self.wall_s

    def busy(self, share: float = BUSY_SHARE) -> bool:
        """Other processes kept at least ``share`` of the cores busy, or computed on a GPU."""
        oc = self.other_cores
        return ((oc is not None and oc >= share * max(self.cores, 1))
                or any(g.other_processes for g in self.gpus))

    def text(self) -> str:
        """``load 1.9, others 1.3 of 2 cores, steal 0.0 s, 2.4 GHz`` (what is known)."""
        parts = []
        if self.load_1m is not None:
            parts.append(f"load {self.load_1m:.1f}")
        oc = self.other_cores
        if oc is not None:
            parts.append(f"other processes {oc:.1f} of {self.cores} cores")
        if self.steal_s:
            parts.append(f"steal {self.steal_s:.2f} s")
        if self.cpu_mhz is not None:
            parts.append(f"{self.cpu_mhz / 1000:.2f} GHz")
        if self.waited_share is not None:
            parts.append(f"the engine waited for a core {self.waited_share:.0%} of the time")
        for g in self.gpus:
            parts.append(f"GPU {g.index} SM {g.sm_clock_mhz} MHz, "
                         f"{g.other_processes if g.other_processes is not None else '?'} "
                         "other process(es)")
        return ", ".join(parts) or "not readable on this host"


class Summary(_Model):
    """The conditions of many measurements, in brief (a search, a confirmation)."""

    measurements: int
    """Measurements with conditions recorded."""
    busy: int
    """Of them, those on a busy host."""
    load_1m_max: float | None
    """The largest load average seen."""
    other_cores_max: float | None
    """The most cores other processes kept busy during one measurement."""
    other_cores_median: float | None
    """The median of that over the measurements."""
    cores: int
    """Logical cores of the host."""
    gpu_others: int
    """Measurements during which another process computed on a GPU."""
    waited_share_max: float | None = None
    """The largest :attr:`Conditions.waited_share` among them (None: none recorded)."""

    def text(self) -> str:
        """One line: ``12 measurements, 3 on a busy host; load up to 4.3; ...``."""
        parts = [f"{self.measurements} measurement(s), {self.busy} on a busy host"]
        if self.load_1m_max is not None:
            parts.append(f"load average up to {self.load_1m_max:.1f} on {self.cores} cores")
        if self.other_cores_max is not None and self.other_cores_median is not None:
            parts.append(f"other processes kept {self.other_cores_median:.1f} cores busy "
                         f"(median; at most {self.other_cores_max:.1f})")
        if self.gpu_others:
            parts.append(f"another process on a GPU during {self.gpu_others}")
        if self.waited_share_max is not None:
            parts.append(f"the engine waited for a core up to {self.waited_share_max:.0%} of "
                         "the time")
        return "; ".join(parts)


def summarize(items: Sequence[Conditions | None], share: float = BUSY_SHARE) -> Summary | None:
    """The brief of the recorded conditions among ``items`` (None when none was recorded)."""
    got = [c for c in items if c is not None]
    if not got:
        return None
    loads = [c.load_1m for c in got if c.load_1m is not None]
    others = sorted(x for x in (c.other_cores for c in got) if x is not None)
    waits = [c.waited_share for c in got if c.waited_share is not None]
    return Summary(measurements=len(got), busy=sum(c.busy(share) for c in got),
                   load_1m_max=max(loads) if loads else None,
                   other_cores_max=others[-1] if others else None,
                   other_cores_median=others[len(others) // 2] if others else None,
                   cores=max(c.cores for c in got),
                   gpu_others=sum(1 for c in got if any(g.other_processes for g in c.gpus)),
                   waited_share_max=max(waits) if waits else None)


def thread_times() -> tuple[float, float] | None:
    """(ran, waited) seconds of this process's living threads since they started: on a core,
    and ready to run but waiting for one (Linux ``/proc/self/task/*/schedstat``; None where it
    is not readable). The difference of two readings is what a measurement's threads got."""
    got = [x for f in Path("/proc/self/task").glob("*/schedstat")
           if (x := _schedstat(f)) is not None]
    if not got:
        return None
    return sum(r for r, _ in got), sum(w for _, w in got)


def _schedstat(f: Path) -> tuple[float, float] | None:
    """(ran, waited) seconds of one thread; None when it ended meanwhile."""
    try:
        fields = f.read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def waited_share(before: tuple[float, float] | None,
                 after: tuple[float, float] | None) -> float | None:
    """The share of the ready time between two :func:`thread_times` readings that was spent
    waiting for a core (None when either is missing or nothing ran)."""
    if before is None or after is None:
        return None
    ran, waited = max(after[0] - before[0], 0.0), max(after[1] - before[1], 0.0)
    return min(waited / (ran + waited), 1.0) if ran + waited > 0 else None


# ------------------------------------------------------------------------------------ reading
def _call(fn: Callable[..., _T], *args: Any) -> _T | None:
    try:
        return fn(*args)
    except Exception:  # a host that does not expose it: not readable, never a failure
        return None


def _load() -> float | None:
    got = _call(os.getloadavg)
    return float(got[0]) if got else None


_TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _host_cpu() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the host since boot, every core (Linux ``/proc/stat``)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    v = [float(x) for x in first[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user/nice]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / _TICK, v[7] / _TICK


def _own_cpu() -> float:
    """CPU seconds of this process, its waited-for children, and its living descendants."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + _living_descendants()


def _stat(d: Path) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of the process ``/proc/PID``; None when it is gone."""
    try:
        fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), (float(fields[11]) + float(fields[12])) / _TICK  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def _descendant_table() -> dict[int, float]:
    """pid -> CPU seconds of every living descendant of this process (Linux ``/proc``)."""
    table = {int(d.name): got for d in Path("/proc").glob("[0-9]*")
             if (got := _stat(d)) is not None}
    me, out = os.getpid(), {}
    for pid, (p, cpu) in table.items():
        seen = 0
        while p and p != me and seen < 64:
            p, seen = table.get(p, (0, 0.0))[0], seen + 1
        if p == me:
            out[pid] = cpu
    return out


def _living_descendants() -> float:
    """CPU seconds of the descendants of this process still alive (children of ours that
    end during a watch are counted by RUSAGE_CHILDREN once waited for)."""
    return sum(_descendant_table().values())


def _number(f: Path) -> float | None:
    try:
        return float(f.read_text())
    except (OSError, ValueError):
        return None


def _cpu_mhz() -> float | None:
    freqs = [x / 1000 for f in Path("/sys/devices/system/cpu").glob(
        "cpu[0-9]*/cpufreq/scaling_cur_freq") if (x := _number(f)) is not None]
    if not freqs:
        try:
            freqs = [float(line.split(":")[1]) for line in
                     Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("cpu MHz")]
        except (OSError, IndexError, ValueError):
            return None
    return sum(freqs) / len(freqs) if freqs else None


def gpu_states() -> list[GpuState]:
    """Each GPU NVML sees (empty without NVML, a driver or a GPU)."""
    try:
        nv = importlib.import_module("pynvml")  # nvidia-ml-py; optional, untyped
        nv.nvmlInit()
    except Exception:  # no NVML, no driver, no GPU: nothing to say
        return []
    try:
        mine = {os.getpid(), *_descendants()}
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            procs = _call(nv.nvmlDeviceGetComputeRunningProcesses, h)
            out.append(GpuState(
                index=i, sm_clock_mhz=_call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                mem_clock_mhz=_call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                other_processes=None if procs is None
                else sum(1 for p in procs if p.pid not in mine)))
        return out
    except Exception:
        return []
    finally:
        _call(nv.nvmlShutdown)


def _descendants() -> set[int]:
    return set(_descendant_table())


class Watch:
    """Started before a measurement, stopped after it: :meth:`stop` gives its conditions."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.load0 = _load()
        self.host0 = _host_cpu()
        self.own0 = _own_cpu()

    def stop(self) -> Conditions:
        """The conditions from the start until now."""
        wall = time.perf_counter() - self.t0
        host, own = _host_cpu(), _own_cpu()
        loads = [x for x in (self.load0, _load()) if x is not None]
        other = steal = None
        if host is not None and self.host0 is not None:
            other = max(host[0] - self.host0[0] - (own - self.own0), 0.0)
            steal = max(host[1] - self.host0[1], 0.0)
        return Conditions(wall_s=wall, cores=os.cpu_count() or 1,
                          load_1m=max(loads) if loads else None, other_cpu_s=other,
                          steal_s=steal, cpu_mhz=_cpu_mhz(), gpus=gpu_states())


def start(mode: str, share: float, max_wait_s: float) -> Watch:
    """A :class:`Watch` started once the host is quiet (see :func:`wait_for_quiet`)."""
    wait_for_quiet(mode, share, max_wait_s)
    return Watch()


def wait_for_quiet(mode: str, share: float, max_wait_s: float, *,
                   probe_s: float = QUIET_PROBE_S,
                   sleep: Callable[[float], None] = time.sleep) -> Conditions | None:
    """With ``mode`` ``wait`` or ``refuse``, watch the host for ``probe_s``; while it is busy
    (other processes keep ``share`` of the cores busy), ``wait`` watches again until
    ``max_wait_s`` have passed. Returns the last probe's conditions (None with mode ``off``);
    raises :class:`~dossier.errors.TuneError` when the host stays busy (at once for
    ``refuse``)."""
    if mode == "off":
        return None
    from dossier.errors import TuneError

    start = time.perf_counter()
    while True:
        w = Watch()
        sleep(probe_s)
        seen = w.stop()
        if not seen.busy(share):
            return seen
        waited = time.perf_counter() - start
        if mode == "refuse" or waited >= max_wait_s:
            raise TuneError(
                f"the host is busy ({seen.text()}; quiet means other processes below "
                f"{share:.0%} of the cores)" + (f" after waiting {waited:.0f} s"
                                                 if mode == "wait" else ""),
                hint="measure on a quiet host, or set timing.quiet_host = \"off\" to measure "
                     "anyway (the conditions are recorded in the bundle)")
