//! The `latency` mode of `seqline-fed-bench`: how long a message, and
//! separately a typing notice, takes from the client request that makes it
//! on one server to the `/sync` long-poll of a user of another server.
//!
//! For each pair `sender:receiver` of `--latency-pairs` both servers start
//! fresh; a user of the sender creates a public room and a user of the
//! receiver joins it over federation. Then, `--samples` times for each kind
//! (after one warm-up sample of each, not counted), alternating:
//!
//! - the receiver's user catches up with a `/sync?timeout=0` from its
//!   token (this answering is the ready check: the receiver is up and the
//!   token current), then starts `/sync?since=<token>&timeout=30000`;
//! - the sender's user sends an `m.room.message` (a body unique to the
//!   sample), or `PUT /rooms/{r}/typing/{u}` with `typing: true`;
//! - the sample is the time from just before that request is issued to
//!   the moment a `/sync` response holding the message (or an `m.typing`
//!   naming the sender's user) has been received.
//!
//! After each typing sample the sender's user stops typing and we wait for
//! the receiver to see that (so the next start is a change again).

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::{
    Binaries, FedConfig, Kind, Server, create_room, failure, parse_pair, start_run, start_two, unix_secs,
};
use crate::{BenchError, PASSWORD, Progress, Res, User, V3, enc, err, ms, percentile};

/// The receiver's filter: a few timeline events of the room and its typing
/// notices; no presence, receipts or account data.
const FILTER: &str = r#"{"room":{"timeline":{"limit":10},"state":{"lazy_load_members":true},"ephemeral":{"types":["m.typing"]},"account_data":{"types":[]}},"presence":{"types":[]},"account_data":{"types":[]}}"#;

/// The long-poll's `timeout`, ms.
const LONG_POLL_MS: u64 = 30_000;

/// A fixed pause between starting the receiver's long-poll and the send,
/// so that the receiver is (very likely) parked in the wait when the event
/// arrives. It is not a correctness wait: the long-poll's token predates
/// the send, so a poll that is not parked yet still answers with the event
/// as soon as the receiver has it; the pause only makes the measured path
/// the usual one (a waiting client woken).
const PARK: Duration = Duration::from_millis(100);

/// One pair's samples.
#[derive(Debug, Clone, Default)]
pub struct LatencyResult {
    /// `seqline` or `Synapse`.
    pub sender: String,
    /// `seqline` or `Synapse`.
    pub receiver: String,
    /// A message, send until in the receiver's /sync, ms per sample.
    pub message_ms: Vec<f64>,
    /// A typing notice, request until in the receiver's /sync, ms per sample.
    pub typing_ms: Vec<f64>,
    /// Of `message_ms`, the sender's answer to the request (its 200), ms per sample.
    pub message_request_ms: Vec<f64>,
    /// Of `typing_ms`, the sender's answer to the request, ms per sample.
    pub typing_request_ms: Vec<f64>,
    /// Why the pair stopped, if it did.
    pub error: Option<String>,
}

/// p50, p95 and max (nearest rank) of `samples`, ms; NaN when empty.
fn stats(samples: &[f64]) -> (f64, f64, f64) {
    let max = if samples.is_empty() { f64::NAN } else { samples.iter().copied().fold(f64::MIN, f64::max) };
    (percentile(samples, 50.0), percentile(samples, 95.0), max)
}

fn kind_json(samples: &[f64], request: &[f64]) -> Value {
    let (p50, p95, max) = stats(samples);
    let finite = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    json!({
        "samples": samples.len(), "p50_ms": finite(p50), "p95_ms": finite(p95), "max_ms": finite(max),
        "request_p50_ms": finite(percentile(request, 50.0)), "all_ms": samples, "request_ms": request,
    })
}

impl LatencyResult {
    fn label(&self) -> String {
        format!("{} -> {}", self.sender, self.receiver)
    }

    /// The result as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "sender": self.sender, "receiver": self.receiver,
            "message": kind_json(&self.message_ms, &self.message_request_ms),
            "typing": kind_json(&self.typing_ms, &self.typing_request_ms),
            "error": self.error,
        })
    }
}

/// Every pair's results as JSON.
pub fn to_json(config: &FedConfig, results: &[LatencyResult]) -> Value {
    json!({
        "mode": "latency",
        "samples": config.samples,
        "warm_up_samples": 1,
        "long_poll_ms": LONG_POLL_MS,
        "park_ms": ms(PARK),
        "backend": config.backend().to_lowercase(),
        "pairs": results.iter().map(LatencyResult::to_json).collect::<Vec<_>>(),
    })
}

/// Runs every pair of `--latency-pairs`; a pair that fails keeps its samples so far and its error.
pub async fn run(config: &FedConfig) -> Res<Vec<LatencyResult>> {
    let pairs: Vec<(Kind, Kind)> = config.latency_pairs.iter().map(|p| parse_pair(p)).collect::<Res<_>>()?;
    if pairs.is_empty() || config.samples == 0 {
        return err("need at least one of --latency-pairs and --samples >= 1");
    }
    let (progress, out) = start_run(config)?;
    let bins = Binaries::find(config, &pairs).await?;
    let mut results = Vec::new();
    for (i, &(sender, receiver)) in pairs.iter().enumerate() {
        let mut result = LatencyResult {
            sender: sender.as_str().to_owned(),
            receiver: receiver.as_str().to_owned(),
            ..LatencyResult::default()
        };
        progress.say(&format!("latency pair {}: {}", i + 1, result.label()));
        let dir = out.join(format!(
            "latency-{}-{}-{}",
            i + 1,
            sender.as_str().to_lowercase(),
            receiver.as_str().to_lowercase()
        ));
        let outcome = run_pair(config, &bins, &progress, &dir, (sender, receiver), i, &mut result).await;
        result.error = failure(&progress, outcome);
        results.push(result);
    }
    Ok(results)
}

async fn run_pair(
    config: &FedConfig,
    bins: &Binaries,
    progress: &Progress,
    dir: &Path,
    (sender, receiver): (Kind, Kind),
    index: usize,
    result: &mut LatencyResult,
) -> Res<()> {
    let db = |role: &str| format!("fedlat_{}_{role}_{}", index + 1, std::process::id());
    let (tx_dir, rx_dir) = (dir.join("sender"), dir.join("receiver"));
    let (tx_db, rx_db) = (db("sender"), db("receiver"));
    let (mut tx, mut rx) =
        start_two(config, bins, (sender, &tx_dir, &tx_db), (receiver, &rx_dir, &rx_db)).await?;
    progress
        .say(&format!("  sender {} ({}), receiver {} ({})", tx.name, tx.client_url, rx.name, rx.client_url));
    let outcome = measure(config, progress, &tx, &rx, result).await;
    if let Err(e) = outcome {
        let logs = format!("{}{}", tx.log_tail("sender"), rx.log_tail("receiver"));
        tx.stop(config).await;
        rx.stop(config).await;
        return Err(BenchError(format!("{e}{logs}")));
    }
    tx.stop(config).await;
    rx.stop(config).await;
    Ok(())
}

/// What the receiver's long-poll waits for.
#[derive(Debug, Clone)]
enum Want {
    /// An `m.room.message` of this body in the room's timeline.
    Message(String),
    /// An `m.typing` of the room that names (true) or no longer names (false) this user.
    Typing(String, bool),
}

impl Want {
    fn found_in(&self, sync: &Value, room: &str) -> bool {
        let r = &sync["rooms"]["join"][room];
        let events = |section: &str| r[section]["events"].as_array().cloned().unwrap_or_default();
        match self {
            Self::Message(body) => events("timeline")
                .iter()
                .any(|e| e["type"] == "m.room.message" && e["content"]["body"].as_str() == Some(body)),
            Self::Typing(user, typing) => events("ephemeral").iter().any(|e| {
                e["type"] == "m.typing"
                    && e["content"]["user_ids"]
                        .as_array()
                        .is_some_and(|ids| ids.iter().any(|id| id.as_str() == Some(user)) == *typing)
            }),
        }
    }
}

/// The room, its two users, and the receiver's `/sync` token.
struct Setup<'a> {
    tx: &'a Server,
    rx: &'a Server,
    alice: User,
    bob: User,
    room: String,
    timeout: Duration,
}

async fn measure(
    config: &FedConfig,
    progress: &Progress,
    tx: &Server,
    rx: &Server,
    result: &mut LatencyResult,
) -> Res<()> {
    let run = format!("l{}", unix_secs() % 100_000_000);
    let alice = tx.hs.register(&format!("{run}_alice"), PASSWORD, None).await?;
    let bob = rx.hs.register(&format!("{run}_bob"), PASSWORD, None).await?;
    let body = json!({ "preset": "public_chat", "name": "seqline-fed-bench latency" });
    let room = create_room(config, &tx.hs, &alice, body).await?;
    // The join's 200 comes after the sender accepted it (send_join): the
    // receiver is then in the room for the sender too.
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&tx.name));
    rx.hs.ok("join", Method::POST, &path, Some(&bob.token), Some(&json!({}))).await?;
    let (v, _) = rx.hs.sync(&bob, Some(FILTER), None, None).await?;
    let Some(mut since) = v["next_batch"].as_str().map(str::to_owned) else {
        return err("the receiver's /sync has no next_batch");
    };
    progress.say(&format!("  room {room}: {} joined from {}", bob.user_id, rx.name));
    let timeout = Duration::from_secs(config.timeout_secs);
    let s = Setup { tx, rx, alice, bob, room, timeout };
    for i in 0..=config.samples {
        let body = format!("{run} sample {i}");
        let txn = format!("{run}-{i}");
        let (message, message_request, typing, typing_request);
        (message, message_request, since) =
            s.sample(&since, Want::Message(body.clone()), s.send(&txn, &body)).await?;
        let want = Want::Typing(s.alice.user_id.clone(), true);
        (typing, typing_request, since) = s.sample(&since, want, s.typing(true)).await?;
        // Stopped, and seen stopped, so that the next start is a change.
        let want = Want::Typing(s.alice.user_id.clone(), false);
        (_, _, since) = s.sample(&since, want, s.typing(false)).await?;
        if i == 0 {
            progress.say(&format!("  warm-up: message {message:.1} ms, typing {typing:.1} ms (not counted)"));
            continue;
        }
        result.message_ms.push(message);
        result.typing_ms.push(typing);
        result.message_request_ms.push(message_request);
        result.typing_request_ms.push(typing_request);
        if i % 10 == 0 || i == config.samples {
            let (m, t) = (stats(&result.message_ms), stats(&result.typing_ms));
            progress.say(&format!(
                "  {i} samples: message p50 {:.1} / p95 {:.1} ms, typing p50 {:.1} / p95 {:.1} ms",
                m.0, m.1, t.0, t.1
            ));
        }
    }
    Ok(())
}

impl Setup<'_> {
    /// The sender's user sends a message of `body` (the request only: run by `sample`).
    async fn send(&self, txn: &str, body: &str) -> Res<()> {
        let path = format!("{V3}/rooms/{}/send/m.room.message/{}", enc(&self.room), enc(txn));
        let content = json!({ "msgtype": "m.text", "body": body });
        self.tx.hs.ok("send", Method::PUT, &path, Some(&self.alice.token), Some(&content)).await.map(drop)
    }

    /// The sender's user starts (or stops) typing.
    async fn typing(&self, typing: bool) -> Res<()> {
        let path = format!("{V3}/rooms/{}/typing/{}", enc(&self.room), enc(&self.alice.user_id));
        let body =
            if typing { json!({ "typing": true, "timeout": 30_000 }) } else { json!({ "typing": false }) };
        self.tx.hs.ok("typing", Method::PUT, &path, Some(&self.alice.token), Some(&body)).await.map(drop)
    }

    /// One sample: the receiver's long-poll from `since` in flight, then
    /// `request` (lazy: it starts when awaited); answers ms from just
    /// before the request until the /sync response with `want` was
    /// received, ms until the request was answered, and the receiver's
    /// next token.
    async fn sample(
        &self,
        since: &str,
        want: Want,
        request: impl Future<Output = Res<()>>,
    ) -> Res<(f64, f64, String)> {
        // The ready check: the receiver answers a sync from our token at once.
        let (v, _) = self.rx.hs.sync(&self.bob, Some(FILTER), Some(since), Some(0)).await?;
        let since = v["next_batch"].as_str().unwrap_or(since).to_owned();
        let deadline = Instant::now() + PARK + self.timeout;
        let poll = tokio::spawn(long_poll(
            self.rx.hs.clone(),
            self.bob.clone(),
            self.room.clone(),
            since,
            want,
            deadline,
        ));
        tokio::time::sleep(PARK).await;
        let t0 = Instant::now();
        if let Err(e) = request.await {
            poll.abort();
            return Err(e);
        }
        let answered = ms(t0.elapsed());
        let (at, next) = poll.await.map_err(|e| BenchError(format!("long-poll task: {e}")))??;
        Ok((ms(at.saturating_duration_since(t0)), answered, next))
    }
}

/// Long-polls `user`'s /sync from `since` until a response satisfies
/// `want`; answers when that response was received and the next token.
async fn long_poll(
    hs: crate::Hs,
    user: User,
    room: String,
    mut since: String,
    want: Want,
    deadline: Instant,
) -> Res<(Instant, String)> {
    loop {
        let (v, _) = hs.sync(&user, Some(FILTER), Some(&since), Some(LONG_POLL_MS)).await?;
        let at = Instant::now();
        if let Some(next) = v["next_batch"].as_str() {
            next.clone_into(&mut since);
        }
        if want.found_in(&v, &room) {
            return Ok((at, since));
        }
        if at > deadline {
            return err(format!("{want:?} did not reach {}'s /sync in time", user.user_id));
        }
    }
}

/// The results as a table (ms: p50, p95, max per pair and kind) and the headline.
pub fn table(config: &FedConfig, results: &[LatencyResult]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== federation latency: a client request on the sender until its result is in a waiting /sync long-poll on the receiver ({backend})",
        backend = config.backend()
    );
    let _ = writeln!(
        out,
        "   {} samples per pair and kind after 1 warm-up; message = PUT /send, typing = PUT /typing (typing: true); ms",
        config.samples
    );
    let _ = writeln!(
        out,
        "{:<22} {:<8} {:>7} {:>9} {:>9} {:>9} {:>12}",
        "sender -> receiver", "kind", "samples", "p50", "p95", "max", "request p50"
    );
    for r in results {
        for (kind, samples, request) in [
            ("message", &r.message_ms, &r.message_request_ms),
            ("typing", &r.typing_ms, &r.typing_request_ms),
        ] {
            let (p50, p95, max) = stats(samples);
            let _ = writeln!(
                out,
                "{:<22} {kind:<8} {:>7} {p50:>9.1} {p95:>9.1} {max:>9.1} {:>12.1}",
                r.label(),
                samples.len(),
                percentile(request, 50.0)
            );
        }
    }
    let _ = writeln!(out, "   request p50: the sender's answer to the request, part of the time above");
    let find =
        |k: &str| results.iter().find(|r| r.sender == k && r.receiver == k && !r.message_ms.is_empty());
    if let (Some(s), Some(y)) = (find(Kind::Seqline.as_str()), find(Kind::Synapse.as_str())) {
        for (kind, a, b) in
            [("message", &s.message_ms, &y.message_ms), ("typing", &s.typing_ms, &y.typing_ms)]
        {
            let (sp, yp) = (stats(a).1, stats(b).1);
            let factor = yp / sp;
            let verdict = if factor >= 10.0 { "meets x10" } else { "BELOW x10" };
            let _ = writeln!(
                out,
                "headline {kind}: seqline->seqline p95 {sp:.1} ms vs Synapse->Synapse p95 {yp:.1} ms: x{factor:.1} faster: {verdict}"
            );
        }
    }
    for r in results.iter().filter(|r| r.error.is_some()) {
        let _ = writeln!(out, "  {} FAILED: {}", r.label(), r.error.as_deref().unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wants_match_messages_and_typing() {
        let sync = json!({ "rooms": { "join": { "!r": {
            "timeline": { "events": [{ "type": "m.room.message", "content": { "body": "b 1" } }] },
            "ephemeral": { "events": [{ "type": "m.typing", "content": { "user_ids": ["@a:x"] } }] },
        } } } });
        assert!(Want::Message("b 1".to_owned()).found_in(&sync, "!r"));
        assert!(!Want::Message("b 2".to_owned()).found_in(&sync, "!r"));
        assert!(Want::Typing("@a:x".to_owned(), true).found_in(&sync, "!r"));
        assert!(!Want::Typing("@a:x".to_owned(), false).found_in(&sync, "!r"));
        assert!(Want::Typing("@b:x".to_owned(), false).found_in(&sync, "!r"));
        assert!(!Want::Typing("@a:x".to_owned(), true).found_in(&sync, "!other"));
        let (p50, p95, max) = stats(&[3.0, 1.0, 2.0]);
        assert_eq!((p50, p95, max), (2.0, 3.0, 3.0));
        assert!(stats(&[]).0.is_nan());
    }
}
