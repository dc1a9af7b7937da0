//! The search series (`--search N`): one room filled with N messages through
//! the client API, then `POST /search` timed for terms of falling
//! selectivity, in both orders, as one of the room's members.
//!
//! Message k holds `note` (every message), `alpha` (every 10th), `bravo`
//! (every 100th), `charlie` (every 1000th), two words of a small vocabulary
//! picked by k, and its number, so a term's match count is known in advance.

use std::sync::Arc;
use std::time::Instant;

use reqwest::Method;
use serde_json::{Value, json};

use super::{Better, Config, Hs, Progress, Report, Res, V3, ms, pool, prefix, register_all};

const VOCABULARY: [&str; 24] = [
    "harbour", "lantern", "orchard", "meadow", "copper", "willow", "granite", "ember", "tundra", "saffron",
    "quartz", "thistle", "falcon", "marble", "juniper", "cobalt", "prairie", "velvet", "summit", "glacier",
    "walnut", "cinder", "lagoon", "hazel",
];

/// The text of message `k`.
pub fn message_text(k: usize) -> String {
    let mut words = vec!["note"];
    for (every, word) in [(10, "alpha"), (100, "bravo"), (1000, "charlie")] {
        if k.is_multiple_of(every) {
            words.push(word);
        }
    }
    words.push(VOCABULARY[(k * 7) % VOCABULARY.len()]);
    words.push(VOCABULARY[(k * 13 + 5) % VOCABULARY.len()]);
    format!("{} number {k}", words.join(" "))
}

/// The terms timed.
const TERMS: [&str; 7] = ["note", "alpha", "bravo", "charlie", "alpha bravo", "harb", "zulu"];

/// How many of messages 1..=n a term matches (each of its words a prefix of
/// a word of the message).
fn expected(term: &str, n: usize) -> usize {
    (1..=n)
        .filter(|&k| {
            let text = message_text(k);
            term.split(' ').all(|w| text.split(' ').any(|x| x.starts_with(w)))
        })
        .count()
}

async fn search(hs: &Hs, token: &str, criteria: &Value, next: Option<&str>) -> Res<Value> {
    let path = match next {
        Some(t) => format!("{V3}/search?next_batch={}", super::enc(t)),
        None => format!("{V3}/search"),
    };
    let body = json!({ "search_categories": { "room_events": criteria } });
    let (v, _) = hs.ok("search", Method::POST, &path, Some(token), Some(&body)).await?;
    Ok(v["search_categories"]["room_events"].clone())
}

/// Fills a room with `--search` messages and times /search.
pub(super) async fn series(hs: &Hs, config: &Config, progress: &Progress, report: &mut Report) -> Res<()> {
    let n = config.search.unwrap_or(0);
    let run = prefix(config);
    let names: Vec<String> = (0..config.concurrency.max(2)).map(|i| format!("{run}_s{i}")).collect();
    progress.say(&format!("registering {} senders", names.len()));
    let users = register_all(hs, config, names, report, "register").await?;
    let room = hs.create_room(&users[0], config.room_version.as_deref()).await?;
    for u in &users[1..] {
        hs.join(u, &room).await?;
    }
    progress.say(&format!("room {room}: sending {n} messages, {} at a time", config.concurrency));
    let t = Instant::now();
    let (hs2, senders, room2, run2) =
        (hs.clone(), Arc::new(users.clone()), Arc::new(room.clone()), Arc::new(run));
    pool(n, config.concurrency, move |i| {
        let (hs, senders, room, run) = (hs2.clone(), senders.clone(), room2.clone(), run2.clone());
        async move {
            let k = i + 1;
            hs.send(&senders[k % senders.len()], &room, &format!("{run}-s{k}"), &message_text(k)).await
        }
    })
    .await?;
    let fill = t.elapsed().as_secs_f64();
    report.push("search.messages", n as f64, "messages", Better::Info);
    report.push("search.fill_rate", n as f64 / fill, "msgs/s", Better::Higher);
    progress.say(&format!("filled in {fill:.1} s; timing /search"));

    let reader = &users[1].token;
    let samples = config.search_samples.max(1);
    for term in TERMS {
        let expected = expected(term, n);
        for order in ["rank", "recent"] {
            let criteria = json!({
                "search_term": term,
                "order_by": order,
                "filter": { "rooms": [room], "limit": 10 },
            });
            let mut lat = Vec::with_capacity(samples);
            let mut count = 0;
            let mut answer = Value::Null;
            for _ in 0..samples {
                let t = Instant::now();
                answer = search(hs, reader, &criteria, None).await?;
                lat.push(ms(t.elapsed()));
                count = answer["count"].as_u64().unwrap_or(0);
            }
            let key = format!("search.{}.{order}", term.replace(' ', "+"));
            report.push(&format!("{key}.count"), count as f64, "matches", Better::Info);
            report.lat(&key, &lat, &[50, 95]);
            // Synapse answers an approximate count; seqline's is exact.
            if count as usize != expected {
                report
                    .notes
                    .push(format!("{term:?} ({order}): {count} matches counted, {expected} expected"));
            }
            // The tenth page of the same search through next_batch.
            if term == "note" {
                let mut next = answer["next_batch"].as_str().map(str::to_owned);
                let mut pages = 1;
                for _ in 2..10 {
                    let Some(token) = next else { break };
                    next = search(hs, reader, &criteria, Some(&token)).await?["next_batch"]
                        .as_str()
                        .map(str::to_owned);
                    pages += 1;
                }
                // Synapse pages only `recent` searches (no next_batch for `rank`).
                let Some(token) = next else {
                    report.notes.push(format!("\"note\" ({order}): no next_batch after page {pages}"));
                    continue;
                };
                let mut lat = Vec::with_capacity(samples);
                for _ in 0..samples {
                    let t = Instant::now();
                    search(hs, reader, &criteria, Some(&token)).await?;
                    lat.push(ms(t.elapsed()));
                }
                report.lat(&format!("{key}.page10"), &lat, &[50]);
            }
        }
    }
    // What clients send: context around each result with profiles.
    let criteria = json!({
        "search_term": "bravo",
        "filter": { "rooms": [room], "limit": 10 },
        "event_context": { "before_limit": 1, "after_limit": 1, "include_profile": true },
    });
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        search(hs, reader, &criteria, None).await?;
        lat.push(ms(t.elapsed()));
    }
    report.lat("search.bravo.rank.context", &lat, &[50, 95]);
    progress.say("done");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_hold_the_terms_as_often_as_said() {
        let n = 2000;
        let texts: Vec<String> = (1..=n).map(message_text).collect();
        let has = |t: &str, w: &str| t.split(' ').any(|x| x == w);
        assert_eq!(texts.iter().filter(|t| has(t, "note")).count(), n);
        assert_eq!(texts.iter().filter(|t| has(t, "alpha")).count(), n / 10);
        assert_eq!(texts.iter().filter(|t| has(t, "bravo")).count(), n / 100);
        assert_eq!(texts.iter().filter(|t| has(t, "charlie")).count(), n / 1000);
        assert_eq!(expected("alpha bravo", n), n / 100);
        assert_eq!(expected("zulu", n), 0);
    }
}
