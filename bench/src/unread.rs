//! The unread figures (`--unread`): rooms whose members have messages they
//! have not read, as the rooms people open are.
//!
//! For each room size of `--unread-members` (default 500 and 2,000), the
//! room fills up to each level of unread messages (`--unread-levels` for the
//! first size, default 0, 50, 1,000 and 10,000; `--unread-big-levels` for the
//! others, default 50). Every member joined before the first message and none
//! has read anything. At each level:
//!
//! - **Initial sync**: `--unread-samples` members, each syncing for the first
//!   time, run an initial lazy-member `/sync` (the `--sync` filter). Their
//!   `unread_notifications` are checked against what was sent: every message
//!   from another member notifies; the ones naming them in `m.mentions`
//!   highlight. A count that differs is a note in the report and the level's
//!   `counts_exact` figure is 0.
//! - **Wake-up**: one more member long-polls, another sends; the latency from
//!   the send's answer to the sync response carrying it.
//!
//! Messages are shaped as Element sends them: `m.text` with `m.mentions`
//! (empty, or naming one member every 25 messages).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::{
    Better, Config, Hs, Progress, Report, Res, User, err, join_all, ms, pool, prefix, register_all,
    report_wakes, wake_ups,
};

/// One message in this many names a member.
const MENTION_EVERY: usize = 25;

/// The `--unread` figures.
pub async fn series(hs: &Hs, config: &Config, progress: &Progress, report: &mut Report) -> Res<()> {
    let run = prefix(config);
    for (i, &members) in config.unread_members.iter().enumerate() {
        let levels = if i == 0 { &config.unread_levels } else { &config.unread_big_levels };
        room(hs, config, progress, report, &format!("{run}{i}"), members, levels).await?;
    }
    Ok(())
}

/// What the syncers should see: messages from others so far, and per member
/// how many of them named them.
#[derive(Debug, Default)]
struct Sent {
    messages: u64,
    mentions: HashMap<String, u64>,
}

async fn room(
    hs: &Hs,
    config: &Config,
    progress: &Progress,
    report: &mut Report,
    run: &str,
    members: usize,
    levels: &[usize],
) -> Res<()> {
    let samples = config.unread_samples.max(1);
    // Per level: the samples, and a waiter for the wake-ups.
    let syncers = levels.len() * (samples + 1);
    if members < syncers + 2 {
        return err(format!("--unread needs rooms of at least {} members", syncers + 2));
    }
    progress.say(&format!("unread: registering {members} users"));
    let names: Vec<String> = (0..members).map(|i| format!("{run}_u{i}")).collect();
    let users = register_all(hs, config, names, &mut Report::default(), "register").await?;
    let (creator, sender) = (&users[0], &users[1]);
    let room = hs.create_room(creator, config.room_version.as_deref()).await?;
    progress.say(&format!("unread: {} join", members - 1));
    join_all(hs, config, &room, &users[1..], &mut Report::default()).await?;
    let syncing: Vec<User> = users[2..2 + syncers].to_vec();
    let mut sent = Sent::default();
    let key = format!("unread.{members}");
    for (li, &level) in levels.iter().enumerate() {
        let more = usize::try_from(level as u64 - sent.messages.min(level as u64)).unwrap_or(0);
        progress.say(&format!("unread: {more} more messages ({level} unread, {members} members)"));
        fill(hs, config, creator, &room, &syncing, &format!("{run}-{li}"), more, &mut sent).await?;
        let who = &syncing[li * (samples + 1)..(li + 1) * (samples + 1)];
        let (waiter, samplers) = who.split_last().ok_or_else(|| super::BenchError("no syncers".into()))?;
        let mut lat = Vec::with_capacity(samplers.len());
        let mut wrong = Vec::new();
        for user in samplers {
            let t = Instant::now();
            let (v, _) = hs.sync(user, Some(super::sync::FILTER), None, None).await?;
            lat.push(ms(t.elapsed()));
            let counts = &v["rooms"]["join"][&room]["unread_notifications"];
            let seen = (counts["notification_count"].as_u64(), counts["highlight_count"].as_u64());
            let want = (Some(sent.messages), Some(sent.mentions.get(&user.user_id).copied().unwrap_or(0)));
            if seen != want {
                wrong.push(format!("{}: {seen:?}, expected {want:?}", user.user_id));
            }
        }
        let at = format!("{key}.{level}");
        report.lat(&format!("{at}.initial_lazy"), &lat, &[50, 95]);
        report.push(
            &format!("{at}.counts_exact"),
            f64::from(u8::from(wrong.is_empty())),
            "yes",
            Better::Info,
        );
        if let Some(first) = wrong.first() {
            report.notes.push(format!(
                "{at}: {} of {} counts differ, e.g. {first}",
                wrong.len(),
                samplers.len()
            ));
        }
        progress.say(&format!(
            "unread: {} wake-ups ({level} unread, {members} members)",
            config.unread_wake_samples
        ));
        let wakes =
            wake_ups(hs, config.unread_wake_samples, waiter, sender, &room, &format!("{run}-{li}-w")).await?;
        sent.messages += wakes.wake.len() as u64;
        report_wakes(report, &format!("{at}.wake"), &wakes);
    }
    report.push(&format!("{key}.members"), members as f64, "members", Better::Info);
    Ok(())
}

/// Sends `n` messages from `from`, naming one of `syncing` in every
/// [`MENTION_EVERY`]th.
#[allow(clippy::too_many_arguments)]
async fn fill(
    hs: &Hs,
    config: &Config,
    from: &User,
    room: &str,
    syncing: &[User],
    run: &str,
    n: usize,
    sent: &mut Sent,
) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    let base = usize::try_from(sent.messages).unwrap_or(0);
    let named: Arc<Vec<Option<String>>> = Arc::new(
        (base..base + n)
            .map(|k| {
                (k.is_multiple_of(MENTION_EVERY))
                    .then(|| syncing[(k / MENTION_EVERY) % syncing.len()].user_id.clone())
            })
            .collect(),
    );
    let (hs2, from, room2, run) =
        (hs.clone(), Arc::new(from.clone()), Arc::new(room.to_owned()), Arc::new(run.to_owned()));
    let names = named.clone();
    pool(n, config.concurrency, move |i| {
        let (hs, from, room, run, names) =
            (hs2.clone(), from.clone(), room2.clone(), run.clone(), names.clone());
        async move {
            let mentions = names[i].as_ref().map_or(json!({}), |u| json!({ "user_ids": [u] }));
            let content =
                json!({ "msgtype": "m.text", "body": format!("unread {i}"), "m.mentions": mentions });
            hs.send_content(&from, &room, &format!("{run}-{i}"), &content).await
        }
    })
    .await?;
    sent.messages += n as u64;
    for user in named.iter().flatten() {
        *sent.mentions.entry(user.clone()).or_default() += 1;
    }
    Ok(())
}
