"""What the run reads besides its own counters: CPU per component from ``/proc``, the
database's size and stored rows, and the job's incidents over REST.

    cpu = CpuProbe({"api": "1234,1240", "postgres": "re:^postgres", "redis": "re:redis-server"})
    cpu.seconds()          # {"api": 12.3, "postgres": 4.5, "redis": 0.8, "loadgen": 3.1}

**CPU.** A component is a set of processes: pids given (``1234,1240``), or every process
whose command line matches a regular expression (``re:PATTERN``), each *with its
descendants*, found again at every sample (a Celery pool's children, PostgreSQL's backends
come and go). Its CPU time is the sum over those processes of user + system time plus the
time of their children that exited (``cutime + cstime``): exact while the roots live, since
a child that exits moves its time into its parent's. A matched process whose parent is not
in the set takes its last interval with it when it exits (the figure dips; dips are
clamped at 0). The generator itself is always ``loadgen``; it never matches a pattern.
Linux only (``/proc``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import httpx

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds incl. reaped children) of ``pid``, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / _TICK


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


class CpuProbe:
    """Cumulative CPU seconds per component (see the module's docstring)."""

    def __init__(self, components: dict[str, str]) -> None:
        self.specs: dict[str, tuple[set[int], re.Pattern[str] | None]] = {}
        for name, spec in components.items():
            if spec.startswith("re:"):
                self.specs[name] = (set(), re.compile(spec[3:]))
            else:
                try:
                    pids = {int(p) for p in spec.split(",") if p.strip()}
                except ValueError:
                    raise ValueError(
                        f"--cpu {name}={spec}: give pids (1234,1240) or re:PATTERN"
                    ) from None
                self.specs[name] = (pids, None)
        self._last: dict[str, float] = {}
        self.total: dict[str, float] = {}  # sum of the intervals (dips clamped)

    def seconds(self) -> dict[str, float]:
        """Cumulative CPU seconds per component now (``loadgen`` = this process)."""
        table: dict[int, tuple[int, float]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
                table[int(entry.name)] = st
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        me = os.getpid()
        mine = self._tree({me}, children)
        out: dict[str, float] = {}
        for name, (pids, pattern) in self.specs.items():
            roots = set(pids)
            if pattern is not None:
                roots |= {p for p in table if p not in mine and pattern.search(_cmdline(p))}
            members = self._tree(roots, children) - (mine if pattern is not None else set())
            out[name] = sum(table[p][1] for p in members if p in table)
        out["loadgen"] = table[me][1] if me in table else 0.0
        return out

    @staticmethod
    def _tree(roots: set[int], children: dict[int, list[int]]) -> set[int]:
        seen, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.add(pid)
                todo.extend(children.get(pid, ()))
        return seen

    def interval(self, now: dict[str, float]) -> dict[str, float]:
        """CPU seconds per component since the previous call (0 the first time)."""
        out = {k: max(0.0, v - self._last.get(k, v)) for k, v in now.items()}
        self._last = now
        for k, v in out.items():
            self.total[k] = self.total.get(k, 0.0) + v
        return out


def psycopg_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (``postgresql+psycopg://``) as psycopg takes it."""
    return re.sub(r"^postgres(?:ql)?(?:\+\w+)?://", "postgresql://", url)


class DbProbe:
    """The database's size and each job's stored telemetry rows (PostgreSQL)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(psycopg_url(url), autocommit=True)

    def size(self) -> int:
        row = self.conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0

    def stored(self, job: str, *, duplicates: bool = False) -> dict[str, int]:
        """Rows in ``steps`` and ``collectives`` for ``job``; with ``duplicates``, also the
        step rows beyond one per (attempt, rank, step) — there must be none."""
        job_id = self.conn.execute("SELECT id FROM jobs WHERE name = %s", (job,)).fetchone()
        if job_id is None:
            return {"steps": 0, "collectives": 0}
        out = {}
        for table in ("steps", "collectives"):
            row = self.conn.execute(
                f"SELECT count(*) FROM {table} WHERE job_id = %s", (job_id[0],)
            ).fetchone()
            out[table] = int(row[0]) if row else 0
        if duplicates:
            row = self.conn.execute(
                "SELECT count(*) - count(DISTINCT (attempt, rank, step)) FROM steps "
                "WHERE job_id = %s",
                (job_id[0],),
            ).fetchone()
            out["duplicate_steps"] = int(row[0]) if row else 0
        return out

    def close(self) -> None:
        self.conn.close()


class RestProbe:
    """The server's view over REST (a token with the ``read`` scope)."""

    def __init__(self, base: str, token: str, *, timeout_s: float = 10.0) -> None:
        self.client = httpx.AsyncClient(
            base_url=base.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    async def incidents(self, job: str) -> list[dict[str, Any]] | None:
        """The job's incidents (None when the job is not there yet or the call failed)."""
        try:
            reply = await self.client.get(f"/api/v1/jobs/{job}/incidents", params={"limit": 1000})
        except httpx.HTTPError:
            return None
        return reply.json() if reply.status_code == 200 else None

    async def steps_stored(self, job: str) -> int | None:
        try:
            reply = await self.client.get(f"/api/v1/jobs/{job}")
        except httpx.HTTPError:
            return None
        return int(reply.json()["steps_stored"]) if reply.status_code == 200 else None

    async def close(self) -> None:
        await self.client.aclose()
