//! The sync figures (`--sync`): what a person feels each time they open or
//! watch their client, in a room whose timeline is its members' joins.
//!
//! - **Initial sync**: `--members` users join one room (nothing else is
//!   sent); then `--sync-initial-samples` of them, each syncing for the first
//!   time, run an initial `/sync` with [`FILTER`].
//! - **Wake-up**: one member long-polls `/sync?since=…&timeout=30000`,
//!   another sends; the latency runs from just before the send to the sync
//!   response carrying it (`--sync-wake-samples`).
//! - **Growth over members** (`--sync-growth-members 50,500,5000`): the room
//!   grows to each size in turn; at each, fresh early members (they have the
//!   most joins after their own) sync initially.
//! - **Growth over rooms** (`--sync-growth-rooms 1,10,100,300`): rooms of a
//!   creator and one message each; at each count, fresh users join every
//!   room and sync initially.
//!
//! Each initial-sync sample is a user's first sync, so no server can answer
//! it from a cache of an earlier answer.

use std::sync::Arc;
use std::time::Instant;

use super::{
    Better, Config, Hs, Progress, Report, Res, User, err, join_all, ms, pool, prefix, register_all,
    report_wakes, wake_ups,
};

/// The filter of the initial-sync figures.
pub const FILTER: &str = r#"{"room":{"state":{"lazy_load_members":true},"timeline":{"limit":10}}}"#;

/// Samples per size in the growth series.
const GROWTH_SAMPLES: usize = 5;

/// Initial syncs, one each by `users`; returns their latencies, the last
/// answer's size and how many rooms it held.
async fn initial(hs: &Hs, users: &[User]) -> Res<(Vec<f64>, usize, usize)> {
    let (mut lat, mut bytes, mut rooms) = (Vec::with_capacity(users.len()), 0, 0);
    for u in users {
        let t = Instant::now();
        let (v, n) = hs.sync(u, Some(FILTER), None, None).await?;
        lat.push(ms(t.elapsed()));
        bytes = n;
        rooms = v["rooms"]["join"].as_object().map_or(0, serde_json::Map::len);
    }
    Ok((lat, bytes, rooms))
}

/// The `--sync` figures.
pub async fn series(hs: &Hs, config: &Config, progress: &Progress, report: &mut Report) -> Res<()> {
    let run = prefix(config);
    let samples = config.sync_initial_samples.max(1);
    let mut sizes: Vec<usize> = config.sync_growth_members.clone();
    sizes.push(config.members);
    sizes.sort_unstable();
    sizes.dedup();
    let most = *sizes.last().unwrap_or(&config.members);
    let per_size = |size: usize| if size == config.members { samples } else { GROWTH_SAMPLES };
    // Early members sync at each size, so each size needs its own.
    let syncers: usize = sizes.iter().map(|&s| per_size(s)).sum();
    if most < syncers + 2 {
        return err(format!("--sync needs at least {} members for its samples", syncers + 2));
    }
    progress.say(&format!("sync: registering {most} users"));
    let names: Vec<String> = (0..most).map(|i| format!("{run}_s{i}")).collect();
    let users = register_all(hs, config, names, report, "register").await?;
    let creator = &users[0];
    let room = hs.create_room(creator, config.room_version.as_deref()).await?;
    // Syncers join first, so each has every later join in its view.
    let (early, rest) = users[1..].split_at(syncers + 1);
    let mut joined = 1;
    let mut next_syncer = 1;
    let mut later = rest.iter();
    for &size in &sizes {
        if joined == 1 {
            join_all(hs, config, &room, early, &mut Report::default()).await?;
            joined += early.len();
        }
        let more: Vec<User> = later.by_ref().take(size.saturating_sub(joined)).cloned().collect();
        progress.say(&format!("sync: {} more join ({size} members)", more.len()));
        join_all(hs, config, &room, &more, &mut Report::default()).await?;
        joined += more.len();
        let n = per_size(size);
        let who = &early[next_syncer..next_syncer + n];
        next_syncer += n;
        progress.say(&format!("sync: {n} initial syncs ({size} members)"));
        let (lat, bytes, _) = initial(hs, who).await?;
        if size == config.members {
            report.push("sync.members", joined as f64, "members", Better::Info);
            report.lat("sync.initial_lazy", &lat, &[50, 95]);
            report.push("sync.initial_lazy.bytes", bytes as f64, "bytes", Better::Lower);
            progress.say(&format!("sync: {} wake-up samples", config.sync_wake_samples));
            let wakes =
                wake_ups(hs, config.sync_wake_samples, &early[0], creator, &room, &format!("{run}-w"))
                    .await?;
            report_wakes(report, "sync.wake", &wakes);
        }
        if config.sync_growth_members.contains(&size) {
            report.lat(&format!("sync.growth_members.{size}.initial_lazy"), &lat, &[50]);
        }
    }
    if !config.sync_growth_rooms.is_empty() {
        rooms_series(hs, config, progress, report, creator, &run).await?;
    }
    Ok(())
}

/// Initial sync over the number of rooms a user is in.
async fn rooms_series(
    hs: &Hs,
    config: &Config,
    progress: &Progress,
    report: &mut Report,
    creator: &User,
    run: &str,
) -> Res<()> {
    let mut counts = config.sync_growth_rooms.clone();
    counts.sort_unstable();
    counts.dedup();
    let names: Vec<String> = (0..counts.len() * GROWTH_SAMPLES).map(|i| format!("{run}_r{i}")).collect();
    let fresh = register_all(hs, config, names, &mut Report::default(), "register.rooms").await?;
    let mut rooms: Vec<String> = Vec::new();
    for (ci, &count) in counts.iter().enumerate() {
        progress.say(&format!("sync: {count} rooms per user"));
        let add = count.saturating_sub(rooms.len());
        let (hs2, creator2, version, run2) = (
            hs.clone(),
            Arc::new(creator.clone()),
            config.room_version.clone(),
            Arc::new(format!("{run}-{ci}")),
        );
        let made = pool(add, config.concurrency, move |i| {
            let (hs, creator, version, run) = (hs2.clone(), creator2.clone(), version.clone(), run2.clone());
            async move {
                let room = hs.create_room(&creator, version.as_deref()).await?;
                hs.send(&creator, &room, &format!("{run}-{i}"), "the room's one message").await?;
                Ok(room)
            }
        })
        .await?;
        rooms.extend(made.into_iter().map(|(_, r)| r));
        let who = &fresh[ci * GROWTH_SAMPLES..(ci + 1) * GROWTH_SAMPLES];
        let pairs: Arc<Vec<(User, String)>> =
            Arc::new(who.iter().flat_map(|u| rooms.iter().map(move |r| (u.clone(), r.clone()))).collect());
        let hs2 = hs.clone();
        let n = pairs.len();
        pool(n, config.concurrency, move |i| {
            let (hs, pairs) = (hs2.clone(), pairs.clone());
            async move { hs.join(&pairs[i].0, &pairs[i].1).await }
        })
        .await?;
        let (lat, bytes, seen) = initial(hs, who).await?;
        if seen != rooms.len() {
            return err(format!("sync: an initial sync held {seen} rooms, not {}", rooms.len()));
        }
        report.lat(&format!("sync.growth_rooms.{count}.initial_lazy"), &lat, &[50]);
        report.push(&format!("sync.growth_rooms.{count}.bytes"), bytes as f64, "bytes", Better::Lower);
    }
    Ok(())
}
