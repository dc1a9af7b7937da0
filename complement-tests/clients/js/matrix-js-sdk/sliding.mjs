// matrix-js-sdk's own sliding sync client (SlidingSync + SlidingSyncSdk, the
// simplified MSC4186 protocol) against a seqline server.
//
//     node sliding.mjs HOMESERVER_URL SERVER_NAME [--prefix P]
//
// Alice works over plain HTTP; bob's client syncs only through SlidingSync
// (a list of all rooms, newest first, and the to-device, account data,
// typing and receipt extensions). Alice makes a room with three messages and
// invites bob: bob's client must show the room as an invite, join it, and
// then hold the room's messages in its live timeline. A message alice sends
// then must reach bob's timeline live; bob sends one from the client and
// alice reads it with /messages. A second room with a newer message must come
// first in the list. Bob leaves the first room and his client sees himself
// out. Any failure exits 1 with a line starting "FAIL:".

import { parseArgs } from "node:util";

import { Failure, Timer, api, assertEqual, checks, load, main, packageVersion, waitFor } from "../common.mjs";

const PASSWORD = "a long sliding passphrase";

const sdk = await load("matrix-js-sdk");
const { createClient, EventType, KnownMembership, RoomEvent, ClientEvent, SyncState } = sdk;
const { SlidingSync, SlidingSyncEvent, SlidingSyncState } = await load("matrix-js-sdk/lib/sliding-sync.js");

const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: { prefix: { type: "string", default: "ss" } },
});
const [HS] = positionals;
if (!HS) throw new Error("usage: node sliding.mjs HOMESERVER_URL SERVER_NAME [--prefix P]");

const LOG = [];
const quiet = (name) => {
    const keep = (level) => (...msg) => LOG.push(`${name} ${level}: ${msg.map(String).join(" ").slice(0, 600)}`);
    const logger = { trace() {}, debug() {}, info() {}, warn: keep("warn"), error: keep("error") };
    logger.getChild = () => logger;
    return logger;
};

/** Registers through UIA with m.login.dummy and logs in; returns the login. */
async function account(localpart) {
    const first = await fetch(`${HS}/_matrix/client/v3/register`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ username: localpart, password: PASSWORD }),
    });
    const uia = await first.json();
    if (first.status !== 401 || !uia.session) throw new Failure(`register ${localpart}: ${first.status} ${JSON.stringify(uia)}`);
    await api(HS, "POST", "/_matrix/client/v3/register", {
        body: { username: localpart, password: PASSWORD, auth: { type: "m.login.dummy", session: uia.session } },
    });
    return api(HS, "POST", "/_matrix/client/v3/login", {
        body: { type: "m.login.password", identifier: { type: "m.id.user", user: localpart }, password: PASSWORD },
    });
}

let client;
let slidingSync;

async function flow() {
    const timer = new Timer();
    console.log(`matrix-js-sdk ${packageVersion("matrix-js-sdk")} sliding sync against ${HS}`);
    const alice = await account(`${values.prefix}_alice`);
    const bob = await account(`${values.prefix}_bob`);
    const as = (who) => ({ token: who.access_token });
    timer.lap("registered");

    const room = (await api(HS, "POST", "/_matrix/client/v3/createRoom", { ...as(alice), body: { name: "Sliding" } }))
        .room_id;
    let txn = 0;
    const send = async (who, roomId, body) =>
        (
            await api(HS, "PUT", `/_matrix/client/v3/rooms/${encodeURIComponent(roomId)}/send/m.room.message/js${txn++}`, {
                ...as(who),
                body: { msgtype: "m.text", body },
            })
        ).event_id;
    const before = [];
    for (const body of ["one", "two", "three"]) before.push(await send(alice, room, body));

    client = createClient({
        baseUrl: HS,
        userId: bob.user_id,
        accessToken: bob.access_token,
        deviceId: bob.device_id,
        logger: quiet("bob"),
    });
    const lists = new Map([
        [
            "all",
            {
                ranges: [[0, 19]],
                timeline_limit: 10,
                filters: {},
                required_state: [
                    ["m.room.name", ""],
                    ["m.room.create", ""],
                    ["m.room.member", "$ME"],
                    ["m.room.member", "$LAZY"],
                ],
            },
        ],
    ]);
    slidingSync = new SlidingSync(HS, lists, { timeline_limit: 10, required_state: [["*", "*"]] }, client, 10_000);
    const errors = [];
    client.on(ClientEvent.Sync, (state, _prev, data) => {
        if (state === SyncState.Error) errors.push(`sliding sync failed: ${data?.error}`);
    });
    checks.push(() => {
        if (errors.length) throw new Failure(errors.join("\n"));
    });
    let answers = 0;
    slidingSync.on(SlidingSyncEvent.Lifecycle, (state, resp) => {
        if (state === SlidingSyncState.Complete && resp) answers += 1;
    });
    const live = [];
    client.on(RoomEvent.Timeline, (event, r, toStart, removed, data) => {
        if (r?.roomId === room && !toStart && !removed && data?.liveEvent && event.getType() === EventType.RoomMessage) {
            live.push(event.getId());
        }
    });
    await client.startClient({ slidingSync });
    await waitFor("the first sliding sync answer", () => answers > 0);
    assertEqual(slidingSync.getListData("all")?.joinedCount, 0, "bob's list before any room");
    timer.lap("bob's client started on sliding sync");

    await api(HS, "POST", `/_matrix/client/v3/rooms/${encodeURIComponent(room)}/invite`, {
        ...as(alice),
        body: { user_id: bob.user_id },
    });
    await waitFor("the invite in bob's client", () => client.getRoom(room)?.getMyMembership() === KnownMembership.Invite);
    await client.joinRoom(room);
    await waitFor("bob joined in his client", () => client.getRoom(room)?.getMyMembership() === KnownMembership.Join);
    await waitFor("the room's history in bob's timeline", () => {
        const ids = client.getRoom(room)?.getLiveTimeline().getEvents().map((e) => e.getId()) ?? [];
        return before.every((id) => ids.includes(id));
    });
    assertEqual(client.getRoom(room).name, "Sliding", "the room's name in bob's client");
    timer.lap("invite shown, joined, history there");

    const fresh = await send(alice, room, "live from alice");
    await waitFor("alice's message live in bob's timeline", () => live.includes(fresh));
    const mine = (await client.sendTextMessage(room, "from bob's client")).event_id;
    const page = await api(HS, "GET", `/_matrix/client/v3/rooms/${encodeURIComponent(room)}/messages?dir=b&limit=5`, as(alice));
    const bobs = page.chunk.find((e) => e.event_id === mine);
    assertEqual(bobs?.content?.body, "from bob's client", "bob's message as alice reads it");
    timer.lap("messages both ways");

    // A newer room comes first.
    const second = (await api(HS, "POST", "/_matrix/client/v3/createRoom", { ...as(alice), body: { name: "Newer", invite: [bob.user_id] } }))
        .room_id;
    await waitFor("the second invite", () => client.getRoom(second)?.getMyMembership() === KnownMembership.Invite);
    await client.joinRoom(second);
    await send(alice, second, "newest of all");
    await waitFor("the list counting two rooms, the newer one bumped above", () => {
        const [a, b] = [client.getRoom(second)?.getBumpStamp(), client.getRoom(room)?.getBumpStamp()];
        return slidingSync.getListData("all")?.joinedCount === 2 && a > b;
    });
    timer.lap("list order");

    await client.leave(room);
    await waitFor("bob out of the room in his client", () => client.getRoom(room)?.getMyMembership() === KnownMembership.Leave);
    timer.lap("left");
    console.log(`OK: matrix-js-sdk sliding sync flow passed in ${timer.total()} s`);
}

await main(
    flow,
    async () => {
        client?.stopClient();
        if (LOG.length) console.log(LOG.slice(-20).join("\n"));
    },
    120_000,
);
