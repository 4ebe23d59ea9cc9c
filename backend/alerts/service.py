"""Receivers, and the outbox of deliveries written when incidents change.

Called in the transaction that changed the incidents, so a notification is stored with the
change it reports (``backend.alerts.sender`` posts it afterwards, outside any transaction):

    changes = apply_findings(session=session, job_id=job_id, findings=found, covered_kinds=kinds)
    deliveries = notify_changes(session=session, opened=changes.opened,
                                resolved=changes.resolved, public_url=settings.public_url)
    # commit, then: for d in deliveries: send_one(factory, settings=settings, delivery_id=d.id)

and periodically, for incidents that stay open (Alertmanager's ``repeat_interval``), and for
open incidents a receiver never heard of (added later, a silence ended):

    remind_open(session=session, public_url=settings.public_url)
    catch_up(session=session, public_url=settings.public_url)

Notifications are grouped per receiver (``backend.alerts.grouping``: ``group_by`` labels,
``group_wait_s``); silenced incidents are not notified (``backend.alerts.silences``);
acknowledged ones get no reminders.

Signing secrets and extra header values are stored sealed (``backend.alerts.sealing``);
``receiver.secret`` and ``receiver.headers`` give them in clear.

Services take keyword-only arguments and only ``flush()``; the caller commits. A name that
another receiver has is refused with ``ReceiverNameTaken`` (409), a generic receiver
without a signing secret with ``Invalid`` (422).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.alerts import formats, grouping, sealing, silences
from backend.alerts.models import (
    DEFAULT_GROUP_WAIT_S,
    DeliveryIncident,
    WebhookDelivery,
    WebhookReceiver,
)
from backend.db import utcnow
from backend.errors import Conflict, Invalid
from backend.incidents.models import Incident
from backend.jobs.models import Job

# Fields a caller may set on a receiver (create and update).
RECEIVER_FIELDS = (
    "name",
    "url",
    "format",
    "secret",
    "headers",
    "jobs",
    "kinds",
    "severities",
    "send_resolved",
    "repeat_interval_s",
    "group_by",
    "group_wait_s",
    "enabled",
)
RECEIVER_DEFAULTS: dict[str, Any] = {
    "format": "alertmanager",
    "headers": {},
    "send_resolved": True,
    "repeat_interval_s": 4 * 3600,
    "group_by": None,
    "group_wait_s": DEFAULT_GROUP_WAIT_S,
    "enabled": True,
}


# --- receivers ---------------------------------------------------------------------------


class ReceiverNameTaken(Conflict):
    """Another webhook receiver already has the name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"a webhook receiver named {name!r} already exists")


def _claim_name(session: Session, name: str, receiver_id: int | None = None) -> None:
    existing = get_receiver_by_name(session=session, name=name)
    if existing is not None and existing.id != receiver_id:
        raise ReceiverNameTaken(name)


def _flush_receiver(session: Session, name: str) -> None:
    try:
        session.flush()
    except IntegrityError:  # a concurrent request took the name after the check
        raise ReceiverNameTaken(name) from None


def list_receivers(*, session: Session) -> list[WebhookReceiver]:
    return list(session.scalars(select(WebhookReceiver).order_by(WebhookReceiver.id)))


def get_receiver(*, session: Session, receiver_id: int) -> WebhookReceiver | None:
    return session.get(WebhookReceiver, receiver_id)


def get_receiver_by_name(*, session: Session, name: str) -> WebhookReceiver | None:
    return session.scalar(select(WebhookReceiver).where(WebhookReceiver.name == name))


def create_receiver(*, session: Session, name: str, url: str, **fields: Any) -> WebhookReceiver:
    """Add a receiver; a ``generic`` one without a secret gets a new ``whsec_`` secret.

    ``create_receiver(session=s, name="oncall", url="https://hooks.example.com/vigil")``
    """
    unknown = set(fields) - set(RECEIVER_FIELDS)
    if unknown:
        raise TypeError(f"unknown receiver fields: {sorted(unknown)}")
    _claim_name(session, name)
    now = utcnow()
    values = {**RECEIVER_DEFAULTS, **fields}
    receiver = WebhookReceiver(name=name, url=url, created_at=now, updated_at=now, **values)
    if receiver.format == "generic" and not receiver.secret_stored:
        receiver.secret = formats.new_secret()
    session.add(receiver)
    _flush_receiver(session, name)
    return receiver


def update_receiver(
    *, session: Session, receiver: WebhookReceiver, changes: dict[str, Any]
) -> WebhookReceiver:
    """Apply ``changes`` (a subset of ``RECEIVER_FIELDS``) to the receiver."""
    unknown = set(changes) - set(RECEIVER_FIELDS)
    if unknown:
        raise TypeError(f"unknown receiver fields: {sorted(unknown)}")
    fmt = changes.get("format", receiver.format)
    if fmt == "generic" and not changes.get("secret", receiver.secret_stored):
        raise Invalid("secret: the generic format needs a signing secret (whsec_…)")
    if "name" in changes:
        _claim_name(session, changes["name"], receiver.id)
    _reseal(receiver)
    for key, value in changes.items():
        setattr(receiver, key, value)
    receiver.updated_at = utcnow()
    _flush_receiver(session, receiver.name)
    return receiver


def _reseal(receiver: WebhookReceiver) -> None:
    """Seal the credentials again with the current key: values stored in clear by an older
    version, or sealed with a previous key (``VIGIL_SECRET_KEY_PREVIOUS``). Ones no key
    opens stay as they are (setting a new secret replaces them)."""
    try:
        secret, headers = receiver.secret, receiver.headers
    except sealing.SecretUnreadable:
        return
    receiver.secret, receiver.headers = secret, headers


def delete_receiver(*, session: Session, receiver: WebhookReceiver) -> None:
    """Delete the receiver and (by cascade) its delivery log."""
    session.delete(receiver)
    session.flush()


def list_deliveries(
    *, session: Session, receiver_id: int, limit: int = 100
) -> list[WebhookDelivery]:
    """The receiver's delivery log, newest first."""
    query = (
        select(WebhookDelivery)
        .where(WebhookDelivery.receiver_id == receiver_id)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit)
    )
    return list(session.scalars(query))


def get_delivery(*, session: Session, delivery_id: int) -> WebhookDelivery | None:
    return session.get(WebhookDelivery, delivery_id)


# --- matching and creating deliveries ------------------------------------------------------


def matches(receiver: WebhookReceiver, incident: Incident, job: str) -> bool:
    """Whether the receiver's filters (null = any) let the incident through."""
    return (
        (receiver.jobs is None or job in receiver.jobs)
        and (receiver.kinds is None or incident.kind in receiver.kinds)
        and (receiver.severities is None or incident.severity in receiver.severities)
    )


def _enabled_receivers(session: Session) -> list[WebhookReceiver]:
    query = select(WebhookReceiver).where(WebhookReceiver.enabled.is_(True))
    return list(session.scalars(query.order_by(WebhookReceiver.id)))


def _job_names(session: Session, incidents: Iterable[Incident]) -> dict[int, str]:
    ids = {i.job_id for i in incidents}
    if not ids:
        return {}
    return dict(session.execute(select(Job.id, Job.name).where(Job.id.in_(ids))).all())


def _delivery(
    receiver: WebhookReceiver,
    incident: Incident | None,
    status: str,
    payload: dict[str, Any],
    now: datetime,
) -> WebhookDelivery:
    return WebhookDelivery(
        receiver_id=receiver.id,
        incident_id=incident.id if incident is not None else None,
        status=status,
        state="pending",
        webhook_id=f"msg_{uuid.uuid4().hex}",
        payload=payload,
        attempts=0,
        next_attempt_at=now,
        created_at=now,
    )


def _notified(session: Session, incident_ids: list[int]) -> set[tuple[int, int]]:
    """(receiver id, incident id) pairs that were sent a firing notification."""
    if not incident_ids:
        return set()
    query = (
        select(WebhookDelivery.receiver_id, DeliveryIncident.incident_id)
        .join(DeliveryIncident, DeliveryIncident.delivery_id == WebhookDelivery.id)
        .where(WebhookDelivery.status == "firing", DeliveryIncident.incident_id.in_(incident_ids))
    )
    return {(r, i) for r, i in session.execute(query)}


def notify_changes(
    *,
    session: Session,
    opened: list[Incident],
    resolved: list[Incident],
    now: datetime | None = None,
    public_url: str,
) -> list[WebhookDelivery]:
    """Pending deliveries for incident state changes, grouped per receiver
    (``backend.alerts.grouping``); returns the deliveries made or joined.

    - opened: ``firing`` to every enabled receiver whose filters match, unless an active
      silence matches the incident (it stays open, unannounced);
    - resolved: ``resolved`` to every enabled ``send_resolved`` receiver that was told it
      fired (even if its filters no longer match, e.g. the severity changed, so no
      receiver is left with an alert that never ends). An incident that opened already
      resolved (a transient episode) gets both, firing first.
    """
    now = now or utcnow()
    receivers = _enabled_receivers(session)
    if not receivers or not (opened or resolved):
        return []
    jobs = _job_names(session, [*opened, *resolved])
    active = silences.active_silences(session=session, now=now)
    items: list[grouping.Item] = []
    for incident in {i.id: i for i in opened}.values():
        job = jobs.get(incident.job_id, "")
        if silences.silencing(active, incident, job):
            continue
        items.extend(
            (receiver, incident, job, "firing")
            for receiver in receivers
            if matches(receiver, incident, job)
        )
    created = grouping.enqueue(session, items, now=now, public_url=public_url)

    ending = {i.id: i for i in [*opened, *resolved] if i.status == "resolved"}
    notified = _notified(session, list(ending))
    items = [
        (receiver, incident, jobs.get(incident.job_id, ""), "resolved")
        for incident in ending.values()
        for receiver in receivers
        if receiver.send_resolved and (receiver.id, incident.id) in notified
    ]
    return created + grouping.enqueue(session, items, now=now, public_url=public_url)


def remind_open(
    *, session: Session, now: datetime | None = None, public_url: str
) -> list[WebhookDelivery]:
    """A new ``firing`` notification for each open incident whose last firing one to a
    matching receiver is older than that receiver's ``repeat_interval_s`` (0 = never).

    Incidents never notified get nothing here (``notify_changes`` and ``catch_up`` send
    the first one); acknowledged and silenced incidents get no reminders.
    """
    now = now or utcnow()
    last = (
        select(
            WebhookDelivery.receiver_id,
            DeliveryIncident.incident_id,
            func.max(WebhookDelivery.created_at).label("last_at"),
        )
        .join(DeliveryIncident, DeliveryIncident.delivery_id == WebhookDelivery.id)
        .join(Incident, Incident.id == DeliveryIncident.incident_id)
        .where(
            WebhookDelivery.status == "firing",
            Incident.status == "open",
            Incident.acked_at.is_(None),
        )
        .group_by(WebhookDelivery.receiver_id, DeliveryIncident.incident_id)
    )
    rows = session.execute(last).all()
    if not rows:
        return []
    receivers = {r.id: r for r in _enabled_receivers(session)}
    incidents = {
        i.id: i
        for i in session.scalars(select(Incident).where(Incident.id.in_({r[1] for r in rows})))
    }
    jobs = _job_names(session, incidents.values())
    active = silences.active_silences(session=session, now=now)
    items: list[grouping.Item] = []
    for receiver_id, incident_id, last_at in rows:
        receiver = receivers.get(receiver_id)
        incident = incidents.get(incident_id)
        if receiver is None or incident is None or receiver.repeat_interval_s <= 0:
            continue
        if last_at > now - timedelta(seconds=receiver.repeat_interval_s):
            continue
        job = jobs.get(incident.job_id, "")
        if matches(receiver, incident, job) and not silences.silencing(active, incident, job):
            items.append((receiver, incident, job, "firing"))
    return grouping.enqueue(session, items, now=now, public_url=public_url)


def send_open(
    *,
    session: Session,
    receiver: WebhookReceiver,
    public_url: str,
    again: bool = False,
    wait_s: int | None = None,
    now: datetime | None = None,
) -> list[WebhookDelivery]:
    """``firing`` notifications to ``receiver`` for the incidents open now that its
    filters match and no silence mutes (grouped as usual). Without ``again``, only those
    it was never told of (a new receiver, a widened filter, a silence that ended); with
    it, all of them (the "send open incidents" button). Slowdowns linked as another
    incident's consequence are left out, as when they opened. ``wait_s``: as in
    ``grouping.enqueue`` (0: due now). ``Conflict`` for a disabled receiver."""
    if not receiver.enabled:
        raise Conflict(f"webhook receiver {receiver.name!r} is disabled: enable it first")
    now = now or utcnow()
    rows = session.execute(
        select(Incident, Job.name)
        .join(Job, Job.id == Incident.job_id)
        .where(Incident.status == "open")
        .order_by(Incident.id)
    ).all()
    told = (
        set()
        if again
        else {i for r, i in _notified(session, [r.id for r, _ in rows]) if r == receiver.id}
    )
    active = silences.active_silences(session=session, now=now)
    items: list[grouping.Item] = [
        (receiver, row, job, "firing")
        for row, job in rows
        if row.id not in told
        and not (row.evidence or {}).get("consequence_of")
        and matches(receiver, row, job)
        and not silences.silencing(active, row, job)
    ]
    return grouping.enqueue(session, items, now=now, public_url=public_url, wait_s=wait_s)


def catch_up(
    *, session: Session, public_url: str, now: datetime | None = None
) -> list[WebhookDelivery]:
    """``send_open`` for every enabled receiver: the periodic pass that tells receivers of
    open incidents they never heard of (added later, filter widened, silence ended)."""
    now = now or utcnow()
    out: list[WebhookDelivery] = []
    for receiver in _enabled_receivers(session):
        out.extend(send_open(session=session, receiver=receiver, public_url=public_url, now=now))
    return out


def create_test_delivery(
    *, session: Session, receiver: WebhookReceiver, public_url: str, now: datetime | None = None
) -> WebhookDelivery:
    """A ``test`` delivery in the receiver's format, not tied to an incident. It is tried
    once (``sender`` does not retry tests): the person who asked sees the outcome."""
    now = now or utcnow()
    payload = formats.build_test_payload(
        receiver.format, receiver=receiver.name, public_url=public_url, now=now
    )
    delivery = _delivery(receiver, None, "test", payload, now)
    session.add(delivery)
    session.flush()
    return delivery
