#!/usr/bin/env python3
"""A real Matrix client (matrix-nio) against a seqline server.

    flow.py HOMESERVER_URL SERVER_NAME [--plain] [--prefix P]
            [--bob-homeserver URL --bob-server-name NAME]

Two users register (UIA with m.login.dummy: alice in one request, bob through
the 401 flows/session step first) and log in on new devices; alice creates a
room (end-to-end encrypted with Megolm unless --plain), invites bob; bob's sync
loop sees the invite and joins; they take turns sending 25 messages, each seen
by both through timeline events in /sync (bodies, senders, order, and, when
encrypted, decrypted); bob pages back with /messages to the room's create event
(all 25 in order); bob leaves, alice sees the leave, bob sees the room under
rooms.leave; both log out.

With --bob-homeserver, bob lives on a second server: the invite, his join,
every message (and, encrypted, the device-key queries, one-time-key claims
and room-key to-device messages behind them) cross between the two servers.

nio validates every response and event against its JSON schemas. A response it
rejects is reported with the schema, the error and the body; that, or any
other failure, exits 1 with a line starting "FAIL:".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from nio import (
    AsyncClient,
    AsyncClientConfig,
    BadEvent,
    InviteMemberEvent,
    JoinResponse,
    LoginResponse,
    LogoutResponse,
    MegolmEvent,
    MessageDirection,
    RegisterResponse,
    RoomCreateEvent,
    RoomCreateResponse,
    RoomInviteResponse,
    RoomLeaveResponse,
    RoomMemberEvent,
    RoomMessagesResponse,
    RoomMessageText,
    RoomSendResponse,
    SyncError,
    SyncResponse,
    UnknownBadEvent,
)
from nio.event_builders import EnableEncryptionBuilder
from nio.responses import RegisterInteractiveResponse
from nio.schemas import Schemas

MESSAGES = 25
PASSWORD = "a long nio passphrase"
WAIT = 30.0  # seconds any one condition may take


class Failure(Exception):
    pass


class Rejections(logging.Handler):
    """Collects what nio's schema validation rejected, from nio's own log.

    nio logs "Validating response schema <schema>: <body>" (debug) just before
    validating, then "Error validating response: <error>" (warning) on failure;
    events that fail their schema log "Error validating event: <error>"."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.names = {id(v): k for k, v in vars(Schemas).items() if isinstance(v, dict)}
        self.last: tuple[str, Any] | None = None
        self.items: list[str] = []
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:
            if isinstance(record.msg, str) and record.msg.startswith("Validating response schema"):
                schema, body = record.args  # type: ignore[misc]
                self.last = (self.names.get(id(schema), "<unnamed schema>"), body)
            return
        msg = record.getMessage()
        if msg.startswith("Error validating response"):
            schema, body = self.last or ("<unknown schema>", None)
            self.items.append(
                f"nio rejected a response (schema Schemas.{schema}): {msg}\n  body: {_short(body)}"
            )
        elif msg.startswith("Error validating event"):
            self.items.append(f"nio rejected an event: {msg}")
        else:
            self.warnings.append(f"{record.name}: {msg}")


def _short(value: Any, limit: int = 2000) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


REJECTIONS = Rejections()


def expect(response: Any, kind: type, what: str) -> Any:
    if not isinstance(response, kind):
        detail = getattr(response, "status_code", None), getattr(response, "message", None)
        raise Failure(f"{what}: expected {kind.__name__}, got {type(response).__name__} {detail}: {response}")
    return response


class Peer:
    """A logged-in nio client with its sync loop and what it has seen."""

    def __init__(self, name: str, client: AsyncClient) -> None:
        self.name = name
        self.client = client
        self.timeline: list[tuple[str, Any]] = []  # (room_id, event) in arrival order
        self.left_rooms: set[str] = set()
        # room -> (prev_batch, events) of the latest sync batch with events there
        self.last_batch: dict[str, tuple[str, list[Any]]] = {}
        self.errors: list[str] = []
        self.task: asyncio.Task | None = None
        client.add_event_callback(self._on_event, object)  # type: ignore[arg-type]
        client.add_response_callback(self._on_sync, SyncResponse)  # type: ignore[arg-type]
        client.add_response_callback(self._on_sync_error, SyncError)  # type: ignore[arg-type]

    @property
    def user_id(self) -> str:
        return self.client.user_id

    async def _on_event(self, room: Any, event: Any) -> None:
        if isinstance(event, (BadEvent, UnknownBadEvent)):
            self.errors.append(f"{self.name}: nio could not parse an event: {_short(event.source)}")
        elif isinstance(event, MegolmEvent):
            self.errors.append(f"{self.name}: could not decrypt {event.event_id} from {event.sender}")
        if not isinstance(event, InviteMemberEvent):
            self.timeline.append((room.room_id, event))

    async def _on_sync(self, response: SyncResponse) -> None:
        self.left_rooms.update(response.rooms.leave.keys())
        for room_id, info in response.rooms.join.items():
            if info.timeline.events:
                self.last_batch[room_id] = (info.timeline.prev_batch, list(info.timeline.events))

    async def _on_sync_error(self, response: SyncError) -> None:
        self.errors.append(f"{self.name}: /sync failed: {response.status_code} {response.message}")

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.client.sync_forever(timeout=5000, full_state=True))

    def check(self) -> None:
        if self.errors:
            raise Failure("\n".join(self.errors))
        if self.task is not None and self.task.done() and not self.task.cancelled():
            exc = self.task.exception()
            raise Failure(f"{self.name}'s sync loop ended: {exc!r}")

    def texts(self, room_id: str) -> list[tuple[str, str]]:
        return [
            (e.sender, e.body)
            for r, e in self.timeline
            if r == room_id and isinstance(e, RoomMessageText)
        ]

    async def stop(self) -> None:
        if self.task is not None:
            self.client.stop_sync_forever()
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass
            self.task = None


PEERS: list[Peer] = []


async def wait_for(what: str, pred: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for peer in PEERS:
            peer.check()
        if REJECTIONS.items:
            raise Failure("\n".join(REJECTIONS.items))
        if pred():
            return
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.01)


class Timer:
    def __init__(self) -> None:
        self.t0 = self.t = time.monotonic()

    def lap(self, what: str) -> None:
        now = time.monotonic()
        print(f"  {what}: {now - self.t:.2f} s", flush=True)
        self.t = now


async def paginate(peer: Peer, room_id: str, token: str, what: str) -> tuple[list[Any], int]:
    """Pages back with /messages from token until the end; oldest first."""
    history: list[Any] = []
    pages = 0
    while True:
        page = expect(
            await peer.client.room_messages(room_id, start=token, direction=MessageDirection.back, limit=10),
            RoomMessagesResponse,
            f"/messages page {pages + 1} from {what} ({token})",
        )
        pages += 1
        history.extend(page.chunk)
        if not page.chunk or not page.end or page.end == token:
            break
        if pages > 50:
            raise Failure(f"/messages from {what}: more than 50 pages, the end never came")
        token = page.end
    history.reverse()
    return history, pages


def check_history(history: list[Any], expected: list[tuple[str, str]], what: str, e2e: bool) -> None:
    for e in history:
        if e2e and isinstance(e, RoomMessageText) and not e.decrypted:
            raise Failure(f"{what}: {e.event_id} was not encrypted in an encrypted room")
        if isinstance(e, (BadEvent, UnknownBadEvent)):
            raise Failure(f"{what}: nio could not parse {_short(e.source)}")
        if isinstance(e, MegolmEvent):
            raise Failure(f"{what}: could not decrypt {e.event_id}")
    if not history or not isinstance(history[0], RoomCreateEvent):
        first = type(history[0]).__name__ if history else "nothing"
        raise Failure(f"{what}: the oldest event reached is {first}, not the m.room.create event")
    ids = [e.event_id for e in history]
    if len(set(ids)) != len(ids):
        raise Failure(f"{what}: an event came twice: {ids}")
    paged = [(e.sender, e.body) for e in history if isinstance(e, RoomMessageText)]
    if paged != expected:
        raise Failure(f"{what} gave:\n  {paged}\nexpected:\n  {expected}")


async def register(hs: str, localpart: str, interactive: bool) -> str:
    client = AsyncClient(hs, config=AsyncClientConfig(encryption_enabled=False))
    try:
        session = None
        if interactive:
            # The UIA first step: no auth, expect 401 with flows and a session.
            body = {"username": localpart, "password": PASSWORD}
            raw = await client.send(
                "POST",
                "/_matrix/client/v3/register",
                json.dumps(body),
                {"Content-Type": "application/json"},
            )
            data = await raw.json()
            if raw.status != 401:
                raise Failure(f"register {localpart} without auth: expected 401, got {raw.status} {data}")
            flows = expect(
                RegisterInteractiveResponse.from_dict(data),
                RegisterInteractiveResponse,
                f"register {localpart}: the 401 flows response",
            )
            if not any(f.get("stages") == ["m.login.dummy"] for f in data.get("flows", [])):
                raise Failure(f"register {localpart}: no m.login.dummy flow in {data}")
            session = flows.session
        response = expect(
            await client.register(localpart, PASSWORD, device_name="nio register", session_token=session),
            RegisterResponse,
            f"register {localpart}",
        )
        expect(await client.logout(), LogoutResponse, f"logout {localpart}'s registration device")
        return response.user_id
    finally:
        await client.close()


async def login(hs: str, name: str, user_id: str, store: str, e2e: bool) -> Peer:
    config = AsyncClientConfig(encryption_enabled=e2e, store_sync_tokens=False)
    client = AsyncClient(hs, user_id, store_path=store, config=config)
    response = expect(await client.login(PASSWORD, device_name=f"nio {name}"), LoginResponse, f"login {name}")
    if response.user_id != user_id:
        raise Failure(f"login {name}: user_id {response.user_id}, expected {user_id}")
    peer = Peer(name, client)
    PEERS.append(peer)
    return peer


async def flow(
    hs: str, server_name: str, e2e: bool, prefix: str, store: str, bob_hs: str, bob_server_name: str
) -> None:
    timer = Timer()
    mode = "end-to-end encrypted (Megolm, vodozemac)" if e2e else "unencrypted"
    where = f"{hs} ({server_name})" + (f", bob on {bob_hs} ({bob_server_name})" if bob_hs != hs else "")
    print(f"matrix-nio flow against {where}, {mode} room", flush=True)

    alice_id = await register(hs, f"{prefix}_alice", interactive=False)
    bob_id = await register(bob_hs, f"{prefix}_bob", interactive=True)
    for uid, local, name in ((alice_id, "alice", server_name), (bob_id, "bob", bob_server_name)):
        if uid != f"@{prefix}_{local}:{name}":
            raise Failure(f"registered as {uid}, expected @{prefix}_{local}:{name}")
    timer.lap("register alice (dummy) and bob (401 flows, then dummy with session), log out")

    alice = await login(hs, "alice", alice_id, f"{store}/alice", e2e)
    bob = await login(bob_hs, "bob", bob_id, f"{store}/bob", e2e)
    joined: list[str] = []

    async def on_invite(room: Any, event: InviteMemberEvent) -> None:
        if event.state_key == bob.user_id and event.membership == "invite" and room.room_id not in joined:
            joined.append(room.room_id)
            try:
                expect(await bob.client.join(room.room_id), JoinResponse, "bob joins on the invite")
            except Failure as e:
                bob.errors.append(str(e))

    bob.client.add_event_callback(on_invite, InviteMemberEvent)  # type: ignore[arg-type]
    alice.start()
    bob.start()
    await wait_for("both first syncs", lambda: bool(alice.client.next_batch and bob.client.next_batch))
    if e2e:
        await wait_for(
            "device keys uploaded",
            lambda: not alice.client.should_upload_keys and not bob.client.should_upload_keys,
        )
    timer.lap("log in on new devices, first syncs" + (", device keys uploaded" if e2e else ""))

    initial_state = [EnableEncryptionBuilder().as_dict()] if e2e else []
    created = expect(
        await alice.client.room_create(name="nio flow", topic="a real client", initial_state=initial_state),
        RoomCreateResponse,
        "createRoom",
    )
    room_id = created.room_id
    expect(await alice.client.room_invite(room_id, bob.user_id), RoomInviteResponse, "invite bob")

    def member_event(peer: Peer, membership: str) -> bool:
        return any(
            r == room_id
            and isinstance(e, RoomMemberEvent)
            and e.state_key == bob.user_id
            and e.membership == membership
            for r, e in peer.timeline
        )

    await wait_for("bob's sync loop to see the invite and join", lambda: room_id in joined)
    await wait_for("alice to see bob's join in her timeline", lambda: member_event(alice, "join"))
    await wait_for("bob to see the room as joined", lambda: room_id in bob.client.rooms and
                   bob.user_id in bob.client.rooms[room_id].users)
    if e2e and not (alice.client.rooms[room_id].encrypted and bob.client.rooms[room_id].encrypted):
        raise Failure("the room is not encrypted for both clients")
    timer.lap("createRoom, invite, bob joins from his sync loop, alice sees the join")

    expected: list[tuple[str, str]] = []
    for i in range(1, MESSAGES + 1):
        sender, other = (alice, bob) if i % 2 else (bob, alice)
        body = f"nio message {i:02d} from {sender.name}"
        seen = list(expected)
        await wait_for(
            f"{sender.name} to see message {i - 1} before sending {i}",
            lambda: sender.texts(room_id)[: len(seen)] == seen and len(sender.texts(room_id)) >= len(seen),
        )
        expect(
            await sender.client.room_send(
                room_id,
                "m.room.message",
                {"msgtype": "m.text", "body": body},
                ignore_unverified_devices=True,
            ),
            RoomSendResponse,
            f"{sender.name} sends message {i}",
        )
        expected.append((sender.user_id, body))
    for peer in (alice, bob):
        await wait_for(f"{peer.name} to see all {MESSAGES} messages", lambda: len(peer.texts(room_id)) >= MESSAGES)
        got = peer.texts(room_id)
        if got != expected:
            raise Failure(f"{peer.name} saw in /sync:\n  {got}\nexpected:\n  {expected}")
        if e2e:
            encrypted = [e for r, e in peer.timeline if r == room_id and isinstance(e, RoomMessageText)]
            if not all(e.decrypted for e in encrypted):
                raise Failure(f"{peer.name}: some messages arrived unencrypted in an encrypted room")
    timer.lap(f"{MESSAGES} messages, taking turns, each seen in /sync by both, in order")

    # Bob pages back as clients do: from the prev_batch of the latest sync
    # batch that had events in the room, those events being the newest part.
    # nio runs event callbacks before response callbacks, so wait until the
    # batch holding the last message has been recorded too.
    last_body = expected[-1][1]
    await wait_for(
        "bob's latest sync batch to be recorded",
        lambda: any(getattr(e, "body", None) == last_body for e in bob.last_batch.get(room_id, ("", []))[1]),
    )
    prev_batch, batch = bob.last_batch[room_id]
    history, pages = await paginate(bob, room_id, prev_batch, "prev_batch of bob's latest sync batch")
    history += batch
    check_history(history, expected, "/messages from the sync's prev_batch", e2e)
    timer.lap(f"bob pages back ({pages} pages, {len(history)} events) to m.room.create, all {MESSAGES} in order")

    expect(await bob.client.room_leave(room_id), RoomLeaveResponse, "bob leaves")
    await wait_for("alice to see bob's leave in her timeline", lambda: member_event(alice, "leave"))
    await wait_for("bob's sync to list the room under rooms.leave", lambda: room_id in bob.left_rooms)
    if bob.user_id in alice.client.rooms[room_id].users:
        raise Failure("alice's client still lists bob as a member after his leave")
    timer.lap("bob leaves, alice sees the leave, bob sees the room under rooms.leave")

    # The spec also allows a sync next_batch as /messages' from. Bob, now
    # departed, still reads everything up to his leave.
    history, pages = await paginate(bob, room_id, bob.client.next_batch, "bob's sync next_batch")
    check_history(history, expected, "/messages from the sync's next_batch, after the leave", e2e)
    last = history[-1]
    if not (isinstance(last, RoomMemberEvent) and last.state_key == bob.user_id and last.membership == "leave"):
        raise Failure(f"/messages after the leave: the newest event is {type(last).__name__}, not bob's leave")
    timer.lap(f"departed bob pages back from next_batch ({pages} pages): his leave down to m.room.create")

    for peer in (alice, bob):
        await peer.stop()
        expect(await peer.client.logout(), LogoutResponse, f"logout {peer.name}")
    timer.lap("log out")
    if REJECTIONS.items:
        raise Failure("\n".join(REJECTIONS.items))
    print(f"OK: matrix-nio {mode} flow passed in {time.monotonic() - timer.t0:.2f} s", flush=True)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("homeserver", help="e.g. http://127.0.0.1:8008")
    parser.add_argument("server_name", help="the server name in user ids, e.g. localhost:8008")
    parser.add_argument("--plain", action="store_true", help="an unencrypted room")
    parser.add_argument("--prefix", default="nio", help="localpart prefix for the two users")
    parser.add_argument("--timeout", type=float, default=120.0, help="whole-flow limit in seconds")
    parser.add_argument("--bob-homeserver", help="bob's server, when not alice's")
    parser.add_argument("--bob-server-name", help="the server name in bob's user id")
    args = parser.parse_args()

    nio_log = logging.getLogger("nio")
    nio_log.setLevel(logging.DEBUG)
    nio_log.addHandler(REJECTIONS)
    nio_log.propagate = False

    store = tempfile.mkdtemp(prefix="seqline-nio-")
    for sub in ("alice", "bob"):
        os.makedirs(f"{store}/{sub}")
    code = 0
    try:
        await asyncio.wait_for(
            flow(
                args.homeserver.rstrip("/"),
                args.server_name,
                not args.plain,
                args.prefix,
                store,
                (args.bob_homeserver or args.homeserver).rstrip("/"),
                args.bob_server_name or args.server_name,
            ),
            args.timeout,
        )
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
        code = 1
    except asyncio.TimeoutError:
        print(f"FAIL: the flow did not finish within {args.timeout:.0f} s", flush=True)
        code = 1
    except Exception:
        print("FAIL: unexpected exception:\n" + traceback.format_exc(), flush=True)
        code = 1
    finally:
        for peer in PEERS:
            await peer.stop()
            await peer.client.close()
        shutil.rmtree(store, ignore_errors=True)
    if REJECTIONS.items and code == 0:
        print("FAIL: " + "\n".join(REJECTIONS.items), flush=True)
        code = 1
    if REJECTIONS.warnings:
        print("nio warnings:\n  " + "\n  ".join(REJECTIONS.warnings), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
