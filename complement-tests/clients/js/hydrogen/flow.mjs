// A real Matrix client in a real browser: Hydrogen (hydrogen-view-sdk, the
// whole app) in Debian's headless Chromium, driven by playwright-core,
// against a seqline server.
//
//     node flow.mjs HOMESERVER_URL SERVER_NAME [--prefix P] [--artifacts DIR]
//
// Over plain HTTP first: alice and bob register, alice creates a room and
// invites bob, bob joins, they take turns sending 30 messages (more than one
// /sync timeline, so Hydrogen starts with a gap). Then the page (page/ plus
// esbuild) is built and served from a loopback port of its own, with the
// package's assets, its service worker and olm. In the browser, bob logs in
// through Hydrogen's login screen (homeserver, username, password), opens the
// room from the room list, sees the newest message, scrolls back until the
// first message is on screen (Hydrogen fills the gaps with /messages), and
// all 30 are shown in order under their event ids. A message alice sends
// now appears live. Bob sends one from the composer; it must arrive on the
// server (alice reads it with /messages) and show in the timeline under the
// id the server gave it. A screenshot is saved under --artifacts.
//
// Any failure exits 1 with a line starting "FAIL:".

import { createReadStream } from "node:fs";
import { mkdir, mkdtemp, rm, stat } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { Failure, Timer, api, assertEqual, checks, load, main, packageFile, packageVersion, waitFor } from "../common.mjs";

const MESSAGES = 30;
const PASSWORD = "a long hydrogen passphrase";
const CHROMIUM = process.env.SEQLINE_CHROMIUM || "/usr/bin/chromium";
const CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
];
const HERE = path.dirname(fileURLToPath(import.meta.url));

const TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
};

const cleanups = [];
const problems = []; // what the page reported, printed at the end
const fatal = []; // what fails the flow at the next check

checks.push(() => {
    if (fatal.length) throw new Failure(fatal.join("\n"));
});

/** Bundles page/main.js with esbuild; returns the directory with main.js. */
async function buildPage(esbuild) {
    const out = await mkdtemp(path.join(os.tmpdir(), "seqline-hydrogen-page-"));
    cleanups.push(() => rm(out, { recursive: true, force: true }));
    const result = await esbuild.build({
        entryPoints: [path.join(HERE, "page", "main.js")],
        bundle: true,
        format: "esm",
        target: "es2020",
        outfile: path.join(out, "main.js"),
        nodePaths: [packageFile("")],
        // olm.js (which Hydrogen imports for its global Olm) requires these
        // only when it finds itself in Node.
        external: ["crypto", "fs", "path"],
        logLevel: "silent",
    });
    if (result.errors.length) throw new Failure(`esbuild: ${JSON.stringify(result.errors)}`);
    return out;
}

/** Serves the page on 127.0.0.1 (a port of its own, so the homeserver is
 * another origin, as in real use); returns its base URL. */
async function servePage(built) {
    const roots = [
        ["/assets/", packageFile("hydrogen-view-sdk/asset-build/assets")],
        ["/olm/", packageFile("@matrix-org/olm")],
    ];
    const files = {
        "/": path.join(HERE, "page", "index.html"),
        "/index.html": path.join(HERE, "page", "index.html"),
        "/main.js": path.join(built, "main.js"),
        "/sw.js": packageFile("hydrogen-view-sdk/lib-build/sw.js"),
    };
    const resolve = (urlPath) => {
        if (files[urlPath]) return files[urlPath];
        for (const [prefix, dir] of roots) {
            if (!urlPath.startsWith(prefix)) continue;
            const file = path.resolve(dir, `.${path.posix.normalize(`/${urlPath.slice(prefix.length)}`)}`);
            return file.startsWith(dir + path.sep) ? file : null;
        }
        return null;
    };
    const server = http.createServer(async (req, res) => {
        const urlPath = decodeURIComponent(new URL(req.url, "http://x").pathname);
        const file = resolve(urlPath);
        const info = file && (await stat(file).catch(() => null));
        if (!info?.isFile()) {
            problems.push(`page server: 404 ${urlPath}`);
            res.writeHead(404).end();
            return;
        }
        res.writeHead(200, {
            "Content-Type": TYPES[path.extname(file)] ?? "application/octet-stream",
            "Content-Length": info.size,
            "Cache-Control": "no-store",
        });
        createReadStream(file).pipe(res);
    });
    await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
    cleanups.push(() => new Promise((ok) => server.close(ok)));
    return `http://127.0.0.1:${server.address().port}`;
}

/** Prepares users, room and history over plain HTTP. */
async function prepare(hs, serverName, prefix) {
    const users = {};
    for (const name of ["alice", "bob"]) {
        const localpart = `${prefix}_${name}`;
        const body = { username: localpart, password: PASSWORD, auth: { type: "m.login.dummy" } };
        const session = await api(hs, "POST", "/_matrix/client/v3/register", { body });
        assertEqual(session.user_id, `@${localpart}:${serverName}`, `register ${name}`);
        users[name] = { localpart, userId: session.user_id, token: session.access_token };
    }
    const { alice, bob } = users;
    const { room_id: roomId } = await api(hs, "POST", "/_matrix/client/v3/createRoom", {
        token: alice.token,
        body: { name: "Hydrogen flow", topic: "a real client in a real browser", invite: [bob.userId] },
    });
    const room = encodeURIComponent(roomId);
    await api(hs, "POST", `/_matrix/client/v3/rooms/${room}/join`, { token: bob.token, body: {} });
    const history = [];
    for (let i = 1; i <= MESSAGES; i++) {
        const [name, user] = i % 2 ? ["alice", alice] : ["bob", bob];
        const body = `hydrogen history ${String(i).padStart(2, "0")} from ${name}`;
        const { event_id } = await api(hs, "PUT", `/_matrix/client/v3/rooms/${room}/send/m.room.message/h${i}`, {
            token: user.token,
            body: { msgtype: "m.text", body },
        });
        history.push({ id: event_id, body });
    }
    return { users, roomId, history };
}

/** The messages Hydrogen shows, top to bottom: [{id, body}] (the body's
 * text without the time Hydrogen puts inside it). */
function shownMessages(page) {
    return page.$$eval(".Timeline_scroller li.Timeline_message", (items) =>
        items.map((li) => {
            const body = li.querySelector(".Timeline_messageBody")?.cloneNode(true);
            body?.querySelectorAll("time").forEach((t) => t.remove());
            return { id: li.dataset.eventId ?? null, body: body?.textContent.trim() ?? "" };
        }),
    );
}

/** Whether a tile is inside the timeline's visible area. */
function onScreen(tile) {
    return tile.evaluate((el) => {
        const r = el.getBoundingClientRect();
        const view = el.closest(".Timeline_scroller").getBoundingClientRect();
        return r.height > 0 && r.bottom > view.top && r.top < view.bottom;
    });
}

/** Waits for a message to be shown, on screen, under its event id. */
async function waitShown(page, id, what) {
    const tile = page.locator(`.Timeline_scroller li.Timeline_message[data-event-id="${id}"]`);
    await waitFor(what, async () => (await tile.count()) === 1 && onScreen(tile));
    return tile;
}

async function flow(hs, serverName, prefix, artifacts) {
    const timer = new Timer();
    const esbuild = await load("esbuild");
    const { chromium } = (await load("playwright-core")).default; // CommonJS
    console.log(
        `Hydrogen (hydrogen-view-sdk ${packageVersion("hydrogen-view-sdk")}) in ${CHROMIUM}, ` +
            `playwright-core ${packageVersion("playwright-core")}, against ${hs} (${serverName})`,
    );

    const { users, roomId, history } = await prepare(hs, serverName, prefix);
    const { alice, bob } = users;
    const room = encodeURIComponent(roomId);
    timer.lap(`over HTTP: register alice and bob, a room, bob joins, ${MESSAGES} messages`);

    const site = await servePage(await buildPage(esbuild));
    timer.lap(`esbuild bundles the page; served at ${site}`);

    const profile = await mkdtemp(path.join(os.tmpdir(), "seqline-hydrogen-chromium-"));
    cleanups.push(() => rm(profile, { recursive: true, force: true }));
    // launchPersistentContext passes --user-data-dir=<profile>, a fresh one.
    const context = await chromium.launchPersistentContext(profile, {
        executablePath: CHROMIUM,
        headless: true,
        args: CHROMIUM_FLAGS,
        viewport: { width: 1100, height: 760 },
        timeout: 60_000,
    });
    cleanups.unshift(() => context.close());
    const page = context.pages()[0] ?? (await context.newPage());
    page.on("pageerror", (e) => fatal.push(`the page threw: ${e.stack ?? e}`));
    page.on("console", (m) => {
        if (m.type() === "error" || m.type() === "warning") problems.push(`console ${m.type()}: ${m.text()}`);
    });
    page.on("response", (r) => {
        if (!r.url().startsWith(hs) || r.status() < 400) return;
        const line = `${r.request().method()} ${r.url().slice(hs.length)} -> ${r.status()}`;
        (r.status() >= 500 ? fatal : problems).push(`homeserver answered ${line}`);
    });
    page.on("requestfailed", (r) => {
        if (r.url().startsWith(hs)) problems.push(`request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`);
    });
    const version = context.browser()?.version() ?? "";
    timer.lap(`Chromium ${version} started (headless, fresh profile)`);

    await page.goto(`${site}/#/login`);
    const homeserver = page.locator("#homeserver");
    await homeserver.waitFor({ timeout: 30_000 });
    await homeserver.fill(hs);
    await homeserver.press("Tab"); // "change": Hydrogen asks the server how to log in
    const username = page.locator("#username");
    await username.waitFor({ timeout: 30_000 });
    await username.fill(bob.localpart);
    await page.locator("#password").fill(PASSWORD);
    await page.locator(".PasswordLoginView button[type=submit]").click();
    const tile = page.locator(".RoomList li", { hasText: "Hydrogen flow" });
    await waitFor("Hydrogen to log in and list the room", async () => {
        const error = await page.locator(".PasswordLoginView .error, .LoginView_sso .error").allInnerTexts();
        if (error.length) throw new Failure(`Hydrogen's login failed: ${error.join("; ")}`);
        return (await tile.count()) === 1;
    });
    const worker = await page.evaluate(() => navigator.serviceWorker.controller?.scriptURL ?? null);
    assertEqual(worker, `${site}/sw.js`, "the service worker controlling the page");
    timer.lap("log in through Hydrogen's login screen, first sync, the room listed; sw.js controls the page");

    await tile.locator("a").click();
    const last = history[history.length - 1];
    await waitShown(page, last.id, "the room's newest message on screen");
    const before = (await shownMessages(page)).length;
    if (before >= MESSAGES) throw new Failure(`Hydrogen showed all ${before} messages at once: no gap to fill`);
    timer.lap(`open the room: the newest message on screen, ${before} of ${MESSAGES} loaded`);

    // Scroll to the top until the first message is there; each scroll to
    // the top brings the gap into view and Hydrogen fills it (/messages).
    const first = history[0];
    const firstTile = page.locator(`.Timeline_scroller li.Timeline_message[data-event-id="${first.id}"]`);
    let scrolls = 0;
    await waitFor(
        "scrolling back to reach the first message",
        async () => {
            if ((await firstTile.count()) === 1) return true;
            scrolls++;
            await page.locator(".Timeline_scroller").evaluate((el) => el.scrollTo(0, 0));
            return false;
        },
        45_000,
    );
    await page.locator(".Timeline_scroller").evaluate((el) => el.scrollTo(0, 0));
    await waitShown(page, first.id, "the first message on screen");
    assertEqual(
        await shownMessages(page),
        history,
        "the messages Hydrogen shows after scrolling back, top to bottom",
    );
    timer.lap(`scroll back (${scrolls} scrolls to the top): the first message on screen, all ${MESSAGES} in order`);

    // Live: a message from alice now appears without any action.
    const live = await api(hs, "PUT", `/_matrix/client/v3/rooms/${room}/send/m.room.message/live`, {
        token: alice.token,
        body: { msgtype: "m.text", body: "hydrogen live message from alice" },
    });
    // Scrolled up, the timeline no longer follows new messages: jump down.
    const jumpDown = page.locator(".Timeline_jumpDown");
    await waitFor("the jump-down button", () => jumpDown.isVisible());
    await jumpDown.click();
    await waitShown(page, live.event_id, "alice's new message to appear live");
    timer.lap("jump down: alice's message (sent over HTTP) appears live");

    // Bob sends from the composer.
    const text = `sent from Hydrogen ${Math.random().toString(36).slice(2, 10)}`;
    const composer = page.locator(".MessageComposer_input textarea");
    await composer.fill(text);
    await composer.press("Enter");
    let sentId = null;
    await waitFor("the message from Hydrogen on the server", async () => {
        const { chunk } = await api(hs, "GET", `/_matrix/client/v3/rooms/${room}/messages?dir=b&limit=5`, {
            token: alice.token,
        });
        const found = chunk.find((e) => e.type === "m.room.message" && e.content?.body === text);
        if (found) {
            assertEqual(found.sender, bob.userId, "the sender of the message from Hydrogen");
            assertEqual(chunk[0].event_id, found.event_id, "the message from Hydrogen is the room's newest event");
            sentId = found.event_id;
        }
        return Boolean(found);
    });
    const echo = await waitShown(page, sentId, "Hydrogen to show its message under the server's event id");
    await waitFor("the message to lose its unsent mark", async () => !(await echo.getAttribute("class")).includes("unsent"));
    const mine = (await shownMessages(page)).find((m) => m.id === sentId);
    assertEqual(mine?.body, text, "the body of the message Hydrogen shows");
    timer.lap(`send from the composer: on the server as ${sentId}, shown under that id`);

    await mkdir(artifacts, { recursive: true });
    const shot = path.join(artifacts, `hydrogen-${prefix}.png`);
    await page.screenshot({ path: shot });
    console.log(`  screenshot: ${shot}`);
    timer.lap("screenshot");
    console.log(`OK: Hydrogen flow passed in ${timer.total()} s`);
}

const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
        prefix: { type: "string", default: "hydrogen" },
        artifacts: { type: "string", default: path.join(os.tmpdir(), "seqline-hydrogen") },
        timeout: { type: "string", default: "150" },
    },
});
if (positionals.length !== 2) {
    console.log("usage: flow.mjs HOMESERVER_URL SERVER_NAME [--prefix P] [--artifacts DIR] [--timeout SECONDS]");
    process.exit(2);
}
await main(
    () => flow(positionals[0].replace(/\/$/, ""), positionals[1], values.prefix, path.resolve(values.artifacts)),
    async () => {
        for (const cleanup of cleanups) await cleanup().catch((e) => console.log(`cleanup: ${e}`));
        if (problems.length) console.log(`what the page reported:\n  ${problems.join("\n  ")}`);
    },
    Number(values.timeout) * 1000,
);
