"""Receivers, and the outbox of deliveries written when incidents change.

Called in the transaction that changed the incidents, so a notification is stored with the
change it reports (``backend.alerts.sender`` posts it afterwards, outside any transaction):

    changes = apply_findings(session=session, job_id=job_id, findings=found, covered_kinds=kinds)
    deliveries = notify_changes(session=session, opened=changes.opened,
                                resolved=changes.resolved, public_url=settings.public_url)
    # commit, then: for d in deliveries: send_one(factory, settings=settings, delivery_id=d.id)

and periodically, for incidents that stay open (Alertmanager's ``repeat_interval``):

    remind_open(session=session, public_url=settings.public_url)

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

from backend.alerts import formats, sealing
from backend.alerts.models import WebhookDelivery, WebhookReceiver
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
    "enabled",
)
RECEIVER_DEFAULTS: dict[str, Any] = {
    "format": "alertmanager",
    "headers": {},
    "send_resolved": True,
    "repeat_interval_s": 4 * 3600,
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


def _for_incident(
    receiver: WebhookReceiver,
    incident: Incident,
    job: str,
    status: str,
    *,
    now: datetime,
    public_url: str,
) -> WebhookDelivery:
    payload = formats.build(
        receiver.format,
        incident=incident,
        job=job,
        status=status,
        receiver=receiver.name,
        public_url=public_url,
        now=now,
    )
    # Plain JSON only (no NaN, no datetimes): what is stored is exactly what is sent.
    return _delivery(receiver, incident, status, formats.jsonable(payload), now)


def _notified(session: Session, incident_ids: list[int]) -> set[tuple[int, int]]:
    """(receiver id, incident id) pairs that were sent a firing notification."""
    if not incident_ids:
        return set()
    query = select(WebhookDelivery.receiver_id, WebhookDelivery.incident_id).where(
        WebhookDelivery.status == "firing", WebhookDelivery.incident_id.in_(incident_ids)
    )
    return {(r, i) for r, i in session.execute(query) if i is not None}


def notify_changes(
    *,
    session: Session,
    opened: list[Incident],
    resolved: list[Incident],
    now: datetime | None = None,
    public_url: str,
) -> list[WebhookDelivery]:
    """One pending delivery per incident state change and receiver.

    - opened: a ``firing`` delivery to every enabled receiver whose filters match;
    - resolved: a ``resolved`` delivery to every enabled ``send_resolved`` receiver that was
      told it fired (even if its filters no longer match, e.g. the severity changed, so no
      receiver is left with an alert that never ends). An incident that opened already
      resolved (a transient episode) gets both, firing first.
    """
    now = now or utcnow()
    receivers = _enabled_receivers(session)
    if not receivers or not (opened or resolved):
        return []
    jobs = _job_names(session, [*opened, *resolved])
    created: list[WebhookDelivery] = []
    done: set[int] = set()
    for incident in opened:
        if incident.id in done:
            continue
        done.add(incident.id)
        job = jobs.get(incident.job_id, "")
        for receiver in receivers:
            if matches(receiver, incident, job):
                delivery = _for_incident(
                    receiver, incident, job, "firing", now=now, public_url=public_url
                )
                created.append(delivery)
    session.add_all(created)
    session.flush()

    ending = {i.id: i for i in [*opened, *resolved] if i.status == "resolved"}
    notified = _notified(session, list(ending))
    later: list[WebhookDelivery] = []
    for incident in ending.values():
        job = jobs.get(incident.job_id, "")
        for receiver in receivers:
            if receiver.send_resolved and (receiver.id, incident.id) in notified:
                delivery = _for_incident(
                    receiver, incident, job, "resolved", now=now, public_url=public_url
                )
                later.append(delivery)
    session.add_all(later)
    session.flush()
    return created + later


def remind_open(
    *, session: Session, now: datetime | None = None, public_url: str
) -> list[WebhookDelivery]:
    """A new ``firing`` delivery for each open incident whose last firing delivery to a
    matching receiver is older than that receiver's ``repeat_interval_s`` (0 = never).

    Incidents never notified get nothing here: ``notify_changes`` sends the first one.
    """
    now = now or utcnow()
    last = (
        select(
            WebhookDelivery.receiver_id,
            WebhookDelivery.incident_id,
            func.max(WebhookDelivery.created_at).label("last_at"),
        )
        .join(Incident, Incident.id == WebhookDelivery.incident_id)
        .where(WebhookDelivery.status == "firing", Incident.status == "open")
        .group_by(WebhookDelivery.receiver_id, WebhookDelivery.incident_id)
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
    created: list[WebhookDelivery] = []
    for receiver_id, incident_id, last_at in rows:
        receiver = receivers.get(receiver_id)
        incident = incidents.get(incident_id) if incident_id is not None else None
        if receiver is None or incident is None or receiver.repeat_interval_s <= 0:
            continue
        if last_at > now - timedelta(seconds=receiver.repeat_interval_s):
            continue
        job = jobs.get(incident.job_id, "")
        if matches(receiver, incident, job):
            created.append(
                _for_incident(receiver, incident, job, "firing", now=now, public_url=public_url)
            )
    session.add_all(created)
    session.flush()
    return created


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
