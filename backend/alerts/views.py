"""Webhook receivers over REST: configure (admin token), test, and read the delivery log.

    curl -X POST $VIGIL/api/v1/webhooks -H "Authorization: Bearer $ADMIN" \\
         -d '{"name": "oncall", "url": "https://oncall.example.com/hook", "kinds": ["hang"]}'
    curl -X POST $VIGIL/api/v1/webhooks/1/test -H "Authorization: Bearer $ADMIN"
    curl $VIGIL/api/v1/webhooks/1/deliveries -H "Authorization: Bearer $READ"
    curl -X POST $VIGIL/api/v1/webhooks/1/send-open -H "Authorization: Bearer $ADMIN"

A new receiver is sent the incidents open when it is made (grouped, due at once); the
silences' routes (``backend.alerts.silence_views``) are mounted on this router too.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Depends, Query, Request, Response
from sqlalchemy.orm import Session

from backend.alerts import grouping, sender, service, silence_views
from backend.alerts.models import WebhookDelivery, WebhookReceiver
from backend.alerts.schemas import (
    DeliveryOut,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
    WebhookUpdate,
)
from backend.alerts.tasks import queue_deliveries
from backend.auth.deps import require_scope
from backend.db import session_scope
from backend.deps import RowId, SessionDep
from backend.errors import Invalid, NotFound, errors

router = APIRouter(prefix="/api/v1", tags=["webhooks"])
READ = [Depends(require_scope("read"))]
ADMIN = [Depends(require_scope("admin"))]
router.include_router(silence_views.router)


def _receiver(session: Session, receiver_id: int) -> WebhookReceiver:
    receiver = service.get_receiver(session=session, receiver_id=receiver_id)
    if receiver is None:
        raise NotFound(f"webhook receiver {receiver_id} not found")
    return receiver


@router.get("/webhooks", response_model=list[WebhookOut], dependencies=READ)
def list_webhooks(session: SessionDep) -> Any:
    """Every receiver, oldest first. Secrets and header values are never shown."""
    return [WebhookOut.of(r) for r in service.list_receivers(session=session)]


@router.post(
    "/webhooks",
    response_model=WebhookCreated,
    status_code=201,
    dependencies=ADMIN,
    responses=errors(409),
)
def create_webhook(
    body: WebhookCreate, request: Request, session: SessionDep, background: BackgroundTasks
) -> Any:
    """Add a receiver. For the `generic` format a signing secret is generated when none is
    given; it is returned here, once, and never again. An enabled receiver is sent the
    incidents open now (that its filters match and no silence mutes). 409 if the name is
    taken."""
    fields = body.model_dump(exclude={"name", "url"})
    generated = body.format == "generic" and body.secret is None
    receiver = service.create_receiver(session=session, name=body.name, url=body.url, **fields)
    if receiver.enabled:
        public_url = request.app.state.settings.public_url
        sent = service.send_open(
            session=session, receiver=receiver, public_url=public_url, wait_s=0
        )
        background.add_task(queue_deliveries, [d.id for d in sent])
    out = WebhookOut.of(receiver).model_dump()
    return WebhookCreated(**out, secret=receiver.secret if generated else None)


@router.get(
    "/webhooks/{receiver_id}", response_model=WebhookOut, dependencies=READ, responses=errors(404)
)
def get_webhook(receiver_id: RowId, session: SessionDep) -> Any:
    return WebhookOut.of(_receiver(session, receiver_id))


@router.patch(
    "/webhooks/{receiver_id}",
    response_model=WebhookOut,
    dependencies=ADMIN,
    responses=errors(404, 409),
)
def update_webhook(receiver_id: RowId, body: WebhookUpdate, session: SessionDep) -> Any:
    """Change the fields sent. Rotate a generic receiver's secret by sending a new one."""
    receiver = _receiver(session, receiver_id)
    try:
        changes = body.changes()
    except ValueError as exc:  # a field sent as null that may not be
        raise Invalid(str(exc)) from None
    service.update_receiver(session=session, receiver=receiver, changes=changes)
    return WebhookOut.of(receiver)


@router.delete(
    "/webhooks/{receiver_id}", status_code=204, dependencies=ADMIN, responses=errors(404)
)
def delete_webhook(receiver_id: RowId, session: SessionDep) -> Response:
    """Delete the receiver and its delivery log."""
    service.delete_receiver(session=session, receiver=_receiver(session, receiver_id))
    return Response(status_code=204)


@router.post(
    "/webhooks/{receiver_id}/test",
    response_model=DeliveryOut,
    dependencies=ADMIN,
    responses=errors(404),
)
def send_test_notification(receiver_id: RowId, request: Request) -> Any:
    """Send a test notification now and return the delivery with its outcome (`state`,
    `response_code`, `error`). Works on a disabled receiver too; a test is tried once.

    No request-wide transaction here: the delivery is stored and committed, posted with
    no transaction open (a slow receiver must not hold the database), then read back."""
    factory = request.app.state.sessionmaker
    settings = request.app.state.settings
    with session_scope(factory, write=True) as session:
        receiver = _receiver(session, receiver_id)
        delivery = service.create_test_delivery(
            session=session, receiver=receiver, public_url=settings.public_url
        )
        delivery_id = delivery.id
    sender.send_one(factory, settings=settings, delivery_id=delivery_id)
    with session_scope(factory) as session:
        return DeliveryOut.model_validate(
            service.get_delivery(session=session, delivery_id=delivery_id)
        )


@router.post(
    "/webhooks/{receiver_id}/send-open",
    response_model=list[DeliveryOut],
    dependencies=ADMIN,
    responses=errors(404, 409),
)
def send_open_incidents(
    receiver_id: RowId, request: Request, session: SessionDep, background: BackgroundTasks
) -> Any:
    """Send the receiver every incident open now that its filters match and no silence
    mutes, grouped as usual and due at once (told of them before or not). Returns the
    deliveries; `[]` when nothing is open. 409 for a disabled receiver."""
    receiver = _receiver(session, receiver_id)
    public_url = request.app.state.settings.public_url
    sent = service.send_open(
        session=session, receiver=receiver, public_url=public_url, again=True, wait_s=0
    )
    background.add_task(queue_deliveries, [d.id for d in sent])
    return _deliveries_out(session, sent)


def _deliveries_out(session: Session, rows: list[WebhookDelivery]) -> list[DeliveryOut]:
    ids = grouping.incident_ids(session, [r.id for r in rows])
    return [
        DeliveryOut.model_validate(r).model_copy(update={"incident_ids": ids[r.id]}) for r in rows
    ]


@router.get(
    "/webhooks/{receiver_id}/deliveries",
    response_model=list[DeliveryOut],
    dependencies=READ,
    responses=errors(404),
)
def list_webhook_deliveries(
    receiver_id: RowId,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Any:
    """The delivery log, newest first: state, attempts, response code and error of each."""
    _receiver(session, receiver_id)
    rows = service.list_deliveries(session=session, receiver_id=receiver_id, limit=limit)
    return _deliveries_out(session, rows)
