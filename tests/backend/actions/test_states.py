"""The action state machine: the table, the one function that moves along it, and guards
that keep every state change going through it."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from backend.actions.models import ACTION_STATES, Action
from backend.actions.service import (
    CANCELLABLE,
    cancel,
    create_action,
    dispatch_for_rank,
    record_report,
)
from backend.actions.states import (
    INITIAL_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    can_move,
    transition,
)
from backend.audit.models import AuditEntry
from backend.db import utcnow
from backend.errors import Conflict
from backend.jobs.models import Job

ROOT = Path(__file__).resolve().parents[3]
BACKEND = ROOT / "backend"
STATES_PY = BACKEND / "actions" / "states.py"

PAIRS = list(itertools.product(ACTION_STATES, repeat=2))
LEGAL = [(a, b) for a, b in PAIRS if can_move(a, b)]
ILLEGAL = [(a, b) for a, b in PAIRS if not can_move(a, b)]


def make_action(session, state: str) -> Action:  # type: ignore[no-untyped-def]
    """An action already in ``state`` (tests may build one directly; backend/ may not)."""
    job = Job(name=f"job-{state}-{utcnow().timestamp()}", world_size=2)
    session.add(job)
    session.flush()
    earlier = utcnow() - timedelta(minutes=5)
    action = Action(
        job_id=job.id,
        kind="dump_stacks",
        state=state,
        idempotency_key=f"test-{job.id}",
        requested_by="test",
        params={},
        deliveries={},
        created_at=earlier,
        updated_at=earlier,
    )
    session.add(action)
    session.flush()
    return action


def audit_rows(session, action: Action) -> list[AuditEntry]:  # type: ignore[no-untyped-def]
    query = select(AuditEntry).where(AuditEntry.action_id == action.id).order_by(AuditEntry.id)
    return list(session.scalars(query))


def test_the_table_covers_every_state():
    assert set(TRANSITIONS) == set(ACTION_STATES)
    assert all(targets <= set(ACTION_STATES) for targets in TRANSITIONS.values())
    assert TERMINAL_STATES == ("succeeded", "failed", "cancelled", "expired")
    assert set(INITIAL_STATES) == {"pending", "proposed"}
    reached, frontier = set(INITIAL_STATES), list(INITIAL_STATES)
    while frontier:
        for after in TRANSITIONS[frontier.pop()] - reached:
            reached.add(after)
            frontier.append(after)
    assert reached == set(ACTION_STATES)


def test_the_table_is_what_the_code_does():
    table = {before: set(after) for before, after in TRANSITIONS.items()}
    assert table == {
        "proposed": {"pending", "cancelled", "expired"},
        "pending": {"dispatched", "acked", "succeeded", "failed", "cancelled", "expired"},
        "dispatched": {"acked", "succeeded", "failed", "cancelled", "expired"},
        "acked": {"succeeded", "failed", "cancelled", "expired"},
        "succeeded": set(),
        "failed": set(),
        "cancelled": set(),
        "expired": set(),
    }
    assert CANCELLABLE == ("proposed", "pending", "dispatched", "acked")


@pytest.mark.parametrize(("before", "after"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
def test_every_legal_move_is_made_and_audited(session, before, after):
    action = make_action(session, before)
    now = utcnow()
    entry = transition(
        session=session, action=action, to=after, actor="api:oncall", now=now, note="n"
    )
    assert (action.state, action.updated_at) == (after, now)
    [row] = audit_rows(session, action)
    assert row is entry
    expected = "approved" if (before, after) == ("proposed", "pending") else after
    assert (row.event, row.actor, row.at) == (expected, "api:oncall", now)
    assert (row.job_id, row.action_id, row.incident_id) == (action.job_id, action.id, None)
    assert row.detail == {"kind": "dump_stacks", "from": before, "note": "n"}


@pytest.mark.parametrize(("before", "after"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_every_illegal_move_raises_and_writes_nothing(session, before, after):
    action = make_action(session, before)
    updated = action.updated_at
    with pytest.raises(IllegalTransition, match=f"is {before}: it cannot become {after}"):
        transition(session=session, action=action, to=after, actor="x", now=utcnow())
    assert (action.state, action.updated_at) == (before, updated)
    assert audit_rows(session, action) == []


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("succeeded", "pending"),
        ("expired", "dispatched"),
        ("cancelled", "acked"),
        ("failed", "succeeded"),
        ("proposed", "dispatched"),  # a proposal reaches no rank before it is approved
        ("acked", "pending"),
        ("pending", "proposed"),
        ("pending", "pending"),
        ("pending", "bogus"),
    ],
)
def test_named_illegal_moves(session, before, after):
    assert not can_move(before, after)
    action = make_action(session, before)
    with pytest.raises(IllegalTransition) as err:
        transition(session=session, action=action, to=after, actor="x", now=utcnow())
    assert isinstance(err.value, Conflict) and err.value.status == 409
    assert err.value.extra == {"state": before, "to": after}
    assert action.state == before and audit_rows(session, action) == []


def test_an_unaudited_move_still_checks_and_moves(session):
    action = make_action(session, "pending")
    now = utcnow()
    entry = transition(
        session=session, action=action, to="dispatched", actor="rank:0", now=now, audited=False
    )
    assert entry is None
    assert (action.state, action.updated_at) == ("dispatched", now)
    assert audit_rows(session, action) == []
    with pytest.raises(IllegalTransition):
        transition(session=session, action=action, to="pending", actor="x", now=now, audited=False)


def test_dispatch_moves_to_dispatched_without_an_audit_row(session):
    job = Job(name="dispatch", world_size=2)
    session.add(job)
    session.flush()
    action, _ = create_action(session=session, job_id=job.id, kind="dump_stacks", requested_by="t")
    assert [a["id"] for a in dispatch_for_rank(session=session, job_id=job.id, rank=0)] == [
        action.id
    ]
    assert action.state == "dispatched"
    assert [r.event for r in audit_rows(session, action)] == ["created"]


def test_a_report_on_a_proposal_is_kept_but_does_not_move_it(session):
    job = Job(name="proposal", world_size=1)
    session.add(job)
    session.flush()
    action, _ = create_action(
        session=session, job_id=job.id, kind="restart", requested_by="policy", state="proposed"
    )
    assert record_report(
        session=session, job_id=job.id, rank=0, world_size=1, action_id=action.id,
        state="succeeded", result=None,
    )  # fmt: skip
    assert action.state == "proposed"
    assert action.deliveries["0"]["state"] == "succeeded"
    assert [r.event for r in audit_rows(session, action)] == ["proposed"]


def test_cancel_refuses_a_finished_action_with_a_conflict(session):
    action = make_action(session, "succeeded")
    with pytest.raises(IllegalTransition, match="cannot be cancelled"):
        cancel(session=session, action_id=action.id, actor="api:oncall")
    assert audit_rows(session, action) == []


def test_a_new_action_starts_pending_or_proposed(session):
    with pytest.raises(ValueError, match="pending or proposed"):
        create_action(session=session, job_id=1, kind="restart", requested_by="t", state="acked")


# -- guards on the code itself ----------------------------------------------------------------


def state_writes(source: str) -> list[int]:
    """Lines of ``source`` that set a ``.state`` attribute by hand: ``x.state = …`` (also in
    tuple targets and augmented/annotated assignments), ``setattr(x, "state", …)``, or a
    bulk ``update(Action)``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets.extend(target.elts)
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            elif isinstance(target, ast.Attribute) and target.attr == "state":
                lines.append(target.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            if (
                node.func.id == "setattr"
                and len(args) > 1
                and isinstance(args[1], ast.Constant)
                and args[1].value == "state"
            ):
                lines.append(node.lineno)
            if node.func.id == "update" and args and ast.unparse(args[0]) == "Action":
                lines.append(node.lineno)
    return lines


def handles_actions(path: Path, source: str) -> bool:
    """Modules that can hold an Action: the action, recovery and audit domains and every
    module importing from them. (Webhook deliveries have a ``state`` of their own.)"""
    domain = path.relative_to(BACKEND).parts[0]
    if domain in ("actions", "recovery", "audit"):
        return True
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(n.startswith(("backend.actions", "backend.recovery")) for n in names):
            return True
    return False


def test_the_guard_sees_hand_written_state_changes():
    source = """
action.state = "pending"
action.state, action.updated_at = "pending", now
[a, (b.state, c)] = x
setattr(action, "state", "acked")
session.execute(update(Action).values(state="failed"))
action.status = "open"
action.state == "pending"
"""
    assert state_writes(source) == [2, 3, 4, 5, 6]


def test_only_the_state_machine_sets_an_action_state():
    offenders = []
    for path in sorted(BACKEND.rglob("*.py")):
        if path == STATES_PY:
            continue
        source = path.read_text()
        if handles_actions(path, source):
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n in state_writes(source)]
    assert offenders == [], "use backend.actions.states.transition"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("domain", ["actions", "audit"])
def test_actions_and_audit_do_not_import_recovery(domain):
    for path in sorted((BACKEND / domain).glob("*.py")):
        recovery = sorted(m for m in imported_modules(path) if m.startswith("backend.recovery"))
        assert recovery == [], f"{path.relative_to(ROOT)} imports {recovery}"
    for path in sorted((BACKEND / "audit").glob("*.py")):
        actions = sorted(m for m in imported_modules(path) if m.startswith("backend.actions"))
        assert actions == [], f"{path.relative_to(ROOT)} imports {actions}"


def test_the_action_core_loads_without_recovery():
    code = (
        "import sys, backend.actions.states, backend.actions.service, backend.audit.service;"
        "print(sorted(m for m in sys.modules if m.startswith('backend.recovery')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
