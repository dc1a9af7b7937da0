// A real Matrix client (matrix-js-sdk, with its Rust crypto) against a seqline
// server.
//
//     node flow.mjs HOMESERVER_URL SERVER_NAME [--prefix P]
//                   [--bob-homeserver URL --bob-server-name NAME]
//
// With --bob-homeserver, bob lives on a second server: invites, joins,
// messages, history, device keys, one-time keys and room keys cross servers.
//
// Two users register through UIA (the SDK's InteractiveAuth: a request
// without auth, the 401 with flows and a session, then m.login.dummy with that
// session), log in on new devices, set up Rust crypto (initRustCrypto with the
// in-memory store) and start their sync loops. Alice creates a room and
// invites bob; bob's client sees the invite and joins. They take turns sending
// 25 messages, each seen by both as live timeline events from /sync (event
// ids, senders, bodies, order). A fresh device of bob's, started with a short
// initial sync, scrolls back (`scrollback`, /messages) to the m.room.create
// event and must find all 25 in order. Then an end-to-end encrypted room
// (Megolm): invite, join, 10 messages in turns, each decrypted by the other
// side with the plaintext body checked, the server holding only ciphertext. Alice bootstraps
// cross-signing; bob's client must find her device signed by her. Bob leaves both rooms; alice sees the
// leaves and bob's client sees itself out. Both log out.
//
// Any failure exits 1 with a line starting "FAIL:".

import { parseArgs } from "node:util";

import { Failure, Timer, api, assertEqual, checks, load, main, packageVersion, waitFor } from "../common.mjs";

const MESSAGES = 25;
const E2EE_MESSAGES = 10;
const PASSWORD = "a long js-sdk passphrase";

const sdk = await load("matrix-js-sdk");
const {
    ClientEvent,
    createClient,
    EventType,
    InteractiveAuth,
    KnownMembership,
    MsgType,
    PendingEventOrdering,
    RoomEvent,
    RoomMemberEvent,
    SyncState,
} = sdk;

/** A logger for one client: debug and info are dropped, warnings and errors
 * are kept and printed at the end. */
function makeLogger(name, sink) {
    const keep = (level) => (...msg) => sink.push(`${name} ${level}: ${msg.map(String).join(" ").slice(0, 600)}`);
    const logger = {
        trace() {},
        debug() {},
        info() {},
        warn: keep("warn"),
        error: keep("error"),
        getChild: (ns) => makeLogger(`${name} ${ns}`, sink),
    };
    return logger;
}

const LOG = [];
const PEERS = [];

// The SDK's global logger (used where no client logger reaches): the same.
const { logger: globalLogger } = await load("matrix-js-sdk/lib/logger.js");
globalLogger.methodFactory = (method) =>
    method === "warn" || method === "error" ? makeLogger("sdk", LOG)[method] : () => {};
globalLogger.rebuild();

/** A logged-in client with its sync loop and the live events it has seen. */
class Peer {
    constructor(name, client) {
        this.name = name;
        this.client = client;
        this.live = new Map(); // room id -> MatrixEvents from /sync, in arrival order
        this.errors = [];
        client.on(RoomEvent.Timeline, (event, room, toStartOfTimeline, removed, data) => {
            if (!room || removed || toStartOfTimeline || !data?.liveEvent) return;
            this.events(room.roomId).push(event);
        });
        client.on(ClientEvent.Sync, (state, _prev, data) => {
            if (state === SyncState.Error) this.errors.push(`${name}: /sync failed: ${data?.error}`);
        });
        PEERS.push(this);
    }

    get userId() {
        return this.client.getUserId();
    }

    events(roomId) {
        if (!this.live.has(roomId)) this.live.set(roomId, []);
        return this.live.get(roomId);
    }

    /** The messages seen live in a room: [{id, sender, body}]. */
    texts(roomId) {
        return this.events(roomId)
            .filter((e) => e.getType() === EventType.RoomMessage)
            .map((e) => ({ id: e.getId(), sender: e.getSender(), body: e.getContent().body }));
    }

    membership(roomId, userId, membership) {
        return this.events(roomId).some(
            (e) =>
                e.getType() === EventType.RoomMember &&
                e.getStateKey() === userId &&
                e.getContent().membership === membership,
        );
    }

    async start(syncLimit) {
        let prepared = false;
        this.client.on(ClientEvent.Sync, (state) => {
            if (state === SyncState.Prepared) prepared = true;
        });
        await this.client.startClient({
            initialSyncLimit: syncLimit,
            pendingEventOrdering: PendingEventOrdering.Detached,
        });
        await waitFor(`${this.name}'s first sync`, () => prepared);
    }

    check() {
        if (this.errors.length) throw new Failure(this.errors.join("\n"));
    }
}

checks.push(() => PEERS.forEach((p) => p.check()));

/** Registers through the SDK's InteractiveAuth and returns the user id. The
 * registration device is logged out again. */
async function register(hs, localpart) {
    const client = createClient({ baseUrl: hs, logger: makeLogger(`register ${localpart}`, LOG) });
    const sent = [];
    const auth = new InteractiveAuth({
        matrixClient: client,
        doRequest: (authDict) => {
            sent.push(authDict);
            return client.registerRequest({
                username: localpart,
                password: PASSWORD,
                initial_device_display_name: "js-sdk register",
                ...(authDict ? { auth: authDict } : {}),
            });
        },
        stateUpdated: () => {},
        requestEmailToken: () => Promise.reject(new Failure("the server asked for an email")),
        supportedStages: ["m.login.dummy"],
    });
    const response = await auth.attemptAuth();
    const session = auth.getSessionId();
    if (!session) throw new Failure(`register ${localpart}: the 401 had no UIA session`);
    const stages = sent.map((a) => (a ? `${a.type} session=${a.session}` : "no auth"));
    assertEqual(stages, ["no auth", `m.login.dummy session=${session}`], `register ${localpart}: the UIA requests sent`);
    const done = createClient({
        baseUrl: hs,
        userId: response.user_id,
        accessToken: response.access_token,
        deviceId: response.device_id,
        logger: makeLogger(`register ${localpart}`, LOG),
    });
    await done.logout(true);
    return response.user_id;
}

async function login(hs, name, localpart, expectedUserId, { crypto }) {
    const anon = createClient({ baseUrl: hs, logger: makeLogger(name, LOG) });
    const response = await anon.loginRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: localpart },
        password: PASSWORD,
        initial_device_display_name: `js-sdk ${name}`,
    });
    assertEqual(response.user_id, expectedUserId, `login ${name}: user_id`);
    const client = createClient({
        baseUrl: hs,
        userId: response.user_id,
        accessToken: response.access_token,
        deviceId: response.device_id,
        logger: makeLogger(name, LOG),
    });
    if (crypto) await client.initRustCrypto({ useIndexedDB: false });
    return new Peer(name, client);
}

/** Bob's client joins every room it is invited to. */
function joinOnInvite(peer) {
    const joining = new Set();
    peer.client.on(RoomMemberEvent.Membership, (_event, member) => {
        if (member.userId !== peer.userId || member.membership !== KnownMembership.Invite) return;
        if (joining.has(member.roomId)) return;
        joining.add(member.roomId);
        peer.client.joinRoom(member.roomId).catch((e) => peer.errors.push(`${peer.name}: join ${member.roomId}: ${e}`));
    });
    return joining;
}

async function inviteAndJoin(alice, bob, joining, roomId) {
    await alice.client.invite(roomId, bob.userId);
    await waitFor("bob's client to see the invite and join", () => joining.has(roomId));
    await waitFor("alice to see bob's join in her timeline", () => alice.membership(roomId, bob.userId, "join"));
    await waitFor(
        "bob's client to show the room as joined",
        () => bob.client.getRoom(roomId)?.getMyMembership() === KnownMembership.Join,
    );
}

/** Alice and bob take turns; each waits to have seen all earlier messages
 * before sending. Returns [{id, sender, body}] as sent. */
async function converse(alice, bob, roomId, count, label) {
    const expected = [];
    for (let i = 1; i <= count; i++) {
        const sender = i % 2 ? alice : bob;
        const seen = expected.length;
        await waitFor(`${sender.name} to see ${label} message ${i - 1} before sending ${i}`, () => {
            const got = sender.texts(roomId);
            return got.length >= seen && JSON.stringify(got.slice(0, seen)) === JSON.stringify(expected);
        });
        const body = `js-sdk ${label} message ${String(i).padStart(2, "0")} from ${sender.name}`;
        const { event_id } = await sender.client.sendMessage(roomId, { msgtype: MsgType.Text, body });
        if (!event_id?.startsWith("$")) throw new Failure(`send ${label} ${i}: event_id ${event_id}`);
        expected.push({ id: event_id, sender: sender.userId, body });
    }
    for (const peer of [alice, bob]) {
        await waitFor(`${peer.name} to see all ${count} ${label} messages`, () => peer.texts(roomId).length >= count);
        assertEqual(peer.texts(roomId), expected, `${peer.name}'s live ${label} messages`);
    }
    return expected;
}

async function flow(hs, serverName, prefix, bobHs, bobServerName) {
    const timer = new Timer();
    const where = bobHs === hs ? `${hs} (${serverName})` : `${hs} (${serverName}), bob on ${bobHs} (${bobServerName})`;
    console.log(`matrix-js-sdk ${packageVersion("matrix-js-sdk")} flow against ${where}, Node ${process.version}`);

    const ids = {};
    const homes = { alice: [hs, serverName], bob: [bobHs, bobServerName] };
    for (const name of ["alice", "bob"]) {
        const localpart = `${prefix}_${name}`;
        ids[name] = await register(homes[name][0], localpart);
        assertEqual(ids[name], `@${localpart}:${homes[name][1]}`, `registered ${name}`);
    }
    timer.lap("register alice and bob through InteractiveAuth (401 flows, then m.login.dummy), log out");

    const alice = await login(hs, "alice", `${prefix}_alice`, ids.alice, { crypto: true });
    const bob = await login(bobHs, "bob", `${prefix}_bob`, ids.bob, { crypto: true });
    const joining = joinOnInvite(bob);
    await Promise.all([alice.start(20), bob.start(20)]);
    for (const peer of [alice, bob]) {
        const keys = await peer.client.getCrypto().getOwnDeviceKeys();
        if (!keys.ed25519 || !keys.curve25519) throw new Failure(`${peer.name}: Rust crypto has no device keys`);
    }
    timer.lap("log in, initRustCrypto (in-memory store), startClient, first syncs");

    // An unencrypted room.
    const { room_id: roomId } = await alice.client.createRoom({ name: "js-sdk flow", topic: "a real client" });
    await inviteAndJoin(alice, bob, joining, roomId);
    // The room's state reached bob's client with his join (the /sync state).
    const bobsRoom = bob.client.getRoom(roomId);
    assertEqual(bobsRoom.name, "js-sdk flow", "the room name in bob's client");
    assertEqual(bobsRoom.currentState.getStateEvents(EventType.RoomTopic, "")?.getContent().topic, "a real client", "the topic in bob's client");
    timer.lap("createRoom, invite, bob's client joins on the invite, alice sees the join");

    const expected = await converse(alice, bob, roomId, MESSAGES, "plain");
    timer.lap(`${MESSAGES} messages, taking turns, each seen live by both, same ids and order`);

    // A new device of bob's with a short initial sync scrolls back to the start.
    const reader = await login(bobHs, "bob-history", `${prefix}_bob`, ids.bob, { crypto: false });
    await reader.start(5);
    const room = reader.client.getRoom(roomId);
    if (!room) throw new Failure("bob's new device does not have the room after its first sync");
    const before = room.getLiveTimeline().getEvents().length;
    if (!room.currentState.getStateEvents(EventType.RoomCreate, "")) {
        throw new Failure("bob's new device: the room's state after a limited initial sync has no m.room.create");
    }
    assertEqual(room.name, "js-sdk flow", "the room name on bob's new device");
    let pages = 0;
    while (room.oldState.paginationToken !== null) {
        if (++pages > 50) throw new Failure("scrollback: more than 50 pages, the start never came");
        await reader.client.scrollback(room, 10);
    }
    const history = room.getLiveTimeline().getEvents();
    const first = history[0];
    if (first?.getType() !== EventType.RoomCreate) {
        throw new Failure(`scrollback ended at ${first?.getType()} ${first?.getId()}, not the m.room.create event`);
    }
    const historyIds = history.map((e) => e.getId());
    if (new Set(historyIds).size !== historyIds.length) throw new Failure(`scrollback: an event came twice: ${historyIds}`);
    const paged = history
        .filter((e) => e.getType() === EventType.RoomMessage)
        .map((e) => ({ id: e.getId(), sender: e.getSender(), body: e.getContent().body }));
    assertEqual(paged, expected, "the messages scrollback found, oldest first");
    if (pages < 2) throw new Failure(`scrollback took ${pages} page(s): the initial sync was not limited`);
    reader.client.stopClient();
    await reader.client.logout(true);
    timer.lap(`bob's new device: initial sync of ${before} events, ${pages} scrollbacks to m.room.create, all ${MESSAGES} in order`);

    // An end-to-end encrypted room. Bob's device keys must be on the server
    // before alice's client encrypts for him.
    const query = { device_keys: { [bob.userId]: [] } };
    const token = alice.client.getAccessToken();
    await waitFor("bob's device keys on the server", async () => {
        const keys = await api(hs, "POST", "/_matrix/client/v3/keys/query", { token, body: query });
        return Boolean(keys.device_keys?.[bob.userId]?.[bob.client.getDeviceId()]);
    });
    const { room_id: secretRoom } = await alice.client.createRoom({
        name: "js-sdk e2ee flow",
        initial_state: [
            { type: EventType.RoomEncryption, state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } },
        ],
    });
    await inviteAndJoin(alice, bob, joining, secretRoom);
    for (const peer of [alice, bob]) {
        await waitFor(`${peer.name}'s client to see the room as encrypted`, () =>
            peer.client.getCrypto().isEncryptionEnabledInRoom(secretRoom),
        );
    }
    timer.lap("keys on the server, encrypted createRoom, invite, join");

    const secret = await converse(alice, bob, secretRoom, E2EE_MESSAGES, "secret");
    for (const peer of [alice, bob]) {
        for (const e of peer.events(secretRoom).filter((e) => e.getType() === EventType.RoomMessage)) {
            if (!e.isEncrypted()) throw new Failure(`${peer.name}: ${e.getId()} came unencrypted in an encrypted room`);
            if (e.isDecryptionFailure()) throw new Failure(`${peer.name}: could not decrypt ${e.getId()}`);
        }
        const failures = peer.events(secretRoom).filter((e) => e.isDecryptionFailure());
        if (failures.length) throw new Failure(`${peer.name}: undecryptable: ${failures.map((e) => e.getId())}`);
    }
    // What crossed the wire: ciphertext only, under the same event ids.
    for (const { id } of secret) {
        const raw = await api(hs, "GET", `/_matrix/client/v3/rooms/${encodeURIComponent(secretRoom)}/event/${encodeURIComponent(id)}`, { token });
        if (raw.type !== "m.room.encrypted" || raw.content?.body !== undefined || !raw.content?.ciphertext) {
            throw new Failure(`the server holds ${id} as ${JSON.stringify(raw).slice(0, 300)}, not Megolm ciphertext`);
        }
    }
    timer.lap(`${E2EE_MESSAGES} Megolm messages in turns, each decrypted by the other side, bodies checked`);

    // Cross-signing (bob's client tracks alice's devices now that they share an
    // encrypted room): alice's client makes her three keys (the first upload
    // takes no UIA) and signs its device with her self-signing key; the
    // server keeps only signatures that verify, so seeing that signature, and
    // bob's client finding the device signed by its owner, means the server
    // took what Rust crypto signed.
    await alice.client.getCrypto().bootstrapCrossSigning({
        authUploadDeviceSigningKeys: async (makeRequest) => {
            await makeRequest(null);
        },
    });
    const aliceDevice = alice.client.getDeviceId();
    await waitFor("alice's device signed by her self-signing key, as bob queries it", async () => {
        const body = { device_keys: { [alice.userId]: [] } };
        const keys = await api(bobHs, "POST", "/_matrix/client/v3/keys/query", { token: bob.client.getAccessToken(), body });
        const ssk = Object.keys(keys.self_signing_keys?.[alice.userId]?.keys ?? {})[0];
        return Boolean(ssk && keys.device_keys?.[alice.userId]?.[aliceDevice]?.signatures?.[alice.userId]?.[ssk]);
    });
    await waitFor("bob's client to find alice's device signed by her", async () => {
        await bob.client.getCrypto().getUserDeviceInfo([alice.userId], true);
        const status = await bob.client.getCrypto().getDeviceVerificationStatus(alice.userId, aliceDevice);
        return status?.signedByOwner === true;
    });
    timer.lap("alice bootstraps cross-signing; bob's client sees her device signed by her self-signing key");

    for (const r of [roomId, secretRoom]) {
        await bob.client.leave(r);
        await waitFor("alice to see bob's leave in her timeline", () => alice.membership(r, bob.userId, "leave"));
        await waitFor(
            "bob's client to show the room as left",
            () => bob.client.getRoom(r)?.getMyMembership() === KnownMembership.Leave,
        );
    }
    timer.lap("bob leaves both rooms, alice sees the leaves, bob's client sees itself out");

    for (const peer of [alice, bob]) {
        peer.client.stopClient();
        await peer.client.logout(true);
    }
    timer.lap("log out");
    console.log(`OK: matrix-js-sdk flow passed in ${timer.total()} s`);
}

const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
        prefix: { type: "string", default: "jssdk" },
        timeout: { type: "string", default: "120" },
        "bob-homeserver": { type: "string" },
        "bob-server-name": { type: "string" },
    },
});
if (positionals.length !== 2) {
    console.log("usage: flow.mjs HOMESERVER_URL SERVER_NAME [--prefix P] [--timeout SECONDS]");
    process.exit(2);
}
await main(
    () =>
        flow(
            positionals[0].replace(/\/$/, ""),
            positionals[1],
            values.prefix,
            (values["bob-homeserver"] ?? positionals[0]).replace(/\/$/, ""),
            values["bob-server-name"] ?? positionals[1],
        ),
    async () => {
        for (const peer of PEERS) peer.client.stopClient();
        if (LOG.length) console.log(`matrix-js-sdk warnings and errors:\n  ${LOG.join("\n  ")}`);
    },
    Number(values.timeout) * 1000,
);
