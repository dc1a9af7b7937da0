//! The matrix-rust-sdk probe of seqline's real-client tests: Element X's sync
//! engine (matrix-sdk-ui's `SyncService`, i.e. the `room-list` and
//! `encryption` simplified sliding sync connections) against a homeserver.
//!
//! `rust-sdk-probe SCENARIO...` runs the scenarios named, in order, with one
//! logged-in client (a second one for `e2ee`); `all` runs every one but
//! `restart` (which needs the caller to restart the server) and `room-count`
//! (which wants a user with many rooms). Each
//! prints progress lines; the probe prints `OK` at the end, or exits non-zero
//! with the reason. Every wait is bounded (30 s).
//!
//! | scenario | environment (besides `PROBE_HS`, `PROBE_USER`, `PROBE_PASSWORD`) |
//! |---|---|
//! | `login` | – (discovery of sliding sync in `/versions`, password login, both connections running) |
//! | `room-list` | `PROBE_ROOMS`: room ids, comma-separated, all in the joined rooms list |
//! | `room-count` | `PROBE_ROOM_COUNT`: the user's number of rooms, all joined; the list grows until it holds them all and its count says so (not in `all`) |
//! | `latest-event` | `PROBE_LATEST_ROOM`, `PROBE_LATEST_EVENT`, `PROBE_LATEST_BODY`: the room list's latest event |
//! | `invite` | `PROBE_INVITE_ROOM`: shows up among invites (its sender `PROBE_INVITER` if set), is joined from the client, moves to the joined list |
//! | `messages` | `PROBE_CHAT_ROOM`, `PROBE_SEND_BODY` (sent, its remote echo awaited; prints `SENT <event id>`), `PROBE_LIVE_BODY` (prints `READY live`, then waits for another user to send it) |
//! | `restart` | `PROBE_CHAT_ROOM`, `PROBE_RESTART_BODY`: prints `READY restart`, then waits for that message, sent after the server restarted (sync errors meanwhile are met by starting the sync again, as apps do) |
//! | `leave` | `PROBE_LEAVE_ROOM`: left from the client; its state becomes Left and it leaves the joined list |
//! | `e2ee` | `PROBE_E2EE_ROOM`, `PROBE_USER2`, `PROBE_PASSWORD2`: both users' clients (each its own `SyncService`) send in the encrypted room and each decrypts the other's message |
//!
//! `RUST_LOG` sets the SDK's log filter (default `warn`), written to stderr.

// The SDK's futures nest deeply (the layout of `Probe::open` needs it).
#![recursion_limit = "256"]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::{OwnedEventId, OwnedRoomId, RoomId, UserId};
use matrix_sdk::sliding_sync::VersionBuilder;
use matrix_sdk::{BaseRoom, Client, Room, RoomState};
use matrix_sdk_ui::eyeball_im::Vector;
use matrix_sdk_ui::room_list_service::filters::{BoxedFilterFn, new_filter_invite, new_filter_joined};
use matrix_sdk_ui::room_list_service::{RoomList, RoomListItem, RoomListLoadingState};
use matrix_sdk_ui::sync_service::{self, SyncService};
use matrix_sdk_ui::timeline::{LatestEventValue, RoomExt, Timeline};

/// The bound of every wait.
const WAIT: Duration = Duration::from_secs(30);
/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(100);
/// Entries a room list view shows at once (more than any test prepares).
const PAGE: usize = 200;

const SCENARIOS: [&str; 7] = ["login", "room-list", "latest-event", "invite", "messages", "leave", "e2ee"];

fn env(key: &str) -> Result<String> {
    std::env::var(key).with_context(|| format!("the environment variable {key} is not set"))
}

fn room_id_env(key: &str) -> Result<OwnedRoomId> {
    let value = env(key)?;
    OwnedRoomId::try_from(value.as_str()).with_context(|| format!("{key}={value} is not a room id"))
}

/// The rooms a room list view holds now (kept up to date by its task).
type View = Arc<Mutex<Vector<RoomListItem>>>;

/// One logged-in client with Element X's `SyncService` running, and two views
/// of its room list as Element X's tabs show them.
struct Probe {
    name: String,
    client: Client,
    sync: SyncService,
    joined: View,
    invites: View,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Probe {
    /// Logs in through discovery (fails as Element X does when `/versions`
    /// does not advertise simplified sliding sync) and starts syncing.
    async fn start(hs: &str, user: &str, password: &str) -> Result<Self> {
        let name = user.to_owned();
        let client = Client::builder()
            .homeserver_url(hs)
            .sliding_sync_version_builder(VersionBuilder::DiscoverNative)
            .build()
            .await
            .with_context(|| {
                format!("{name}: building the client (is org.matrix.simplified_msc3575 in /versions?)")
            })?;
        client
            .matrix_auth()
            .login_username(user, password)
            .initial_device_display_name("seqline rust-sdk probe")
            .send()
            .await
            .with_context(|| format!("{name}: password login"))?;
        let device = client.device_id().context("no device id after login")?.to_owned();
        println!("{name}: logged in as {} (device {device})", client.user_id().context("no user id")?);

        let sync = SyncService::builder(client.clone()).build().await.context("building the SyncService")?;
        sync.start().await;
        let rooms = sync.room_list_service();
        let mut tasks = Vec::new();
        let joined = Self::view(rooms.all_rooms().await?, Box::new(new_filter_joined()), &mut tasks);
        let invites = Self::view(rooms.all_rooms().await?, Box::new(new_filter_invite()), &mut tasks);
        let probe = Self { name, client, sync, joined, invites, tasks };
        probe
            .wait("the sync service and the room list running", async || {
                let running = matches!(probe.sync.state().get(), sync_service::State::Running)
                    && matches!(
                        probe.sync.room_list_service().state().get(),
                        matrix_sdk_ui::room_list_service::State::Running
                    );
                Ok(running.then_some(()))
            })
            .await?;
        probe.say("SyncService running (connections room-list and encryption)");
        Ok(probe)
    }

    /// A view of `list` under `filter`, updated by a task of its own.
    fn view(list: RoomList, filter: BoxedFilterFn, tasks: &mut Vec<tokio::task::JoinHandle<()>>) -> View {
        let view = View::default();
        let out = view.clone();
        tasks.push(tokio::spawn(async move {
            let (stream, controller) = list.entries_with_dynamic_adapters(PAGE);
            controller.set_filter(filter);
            let mut stream = std::pin::pin!(stream);
            while let Some(diffs) = stream.next().await {
                let mut items = out.lock().expect("view lock");
                for diff in diffs {
                    diff.apply(&mut items);
                }
            }
        }));
        view
    }

    fn say(&self, what: &str) {
        println!("{}: {what}", self.name);
    }

    /// Fails when either sync loop stopped on an error.
    fn healthy(&self) -> Result<()> {
        match self.sync.state().get() {
            sync_service::State::Error(error) => {
                bail!("{}: the SyncService stopped on an error: {error}", self.name)
            }
            sync_service::State::Terminated => bail!("{}: the SyncService terminated", self.name),
            _ => Ok(()),
        }
    }

    /// Asks `check` again every 100 ms until it answers `Some`, for at most
    /// 30 s; fails at once if the sync stops on an error.
    async fn wait<T>(&self, what: &str, mut check: impl AsyncFnMut() -> Result<Option<T>>) -> Result<T> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(found) = check().await? {
                return Ok(found);
            }
            self.healthy()?;
            if Instant::now() >= deadline {
                bail!("{}: timed out after {} s waiting for {what}", self.name, WAIT.as_secs());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn in_view(view: &View, room_id: &RoomId) -> Option<Room> {
        let items = view.lock().expect("view lock");
        items.iter().find(|item| item.room_id() == room_id).map(|item| (**item).clone())
    }

    /// Waits until `room_id` is in the joined rooms list.
    async fn joined_room(&self, room_id: &RoomId) -> Result<Room> {
        self.wait(&format!("{room_id} in the joined rooms list"), async || {
            Ok(Self::in_view(&self.joined, room_id).filter(|room| room.state() == RoomState::Joined))
        })
        .await
    }

    /// Opens `room`'s timeline as Element X does when the room is shown: a
    /// room subscription, then the timeline.
    async fn open(&self, room: &Room) -> Result<Timeline> {
        self.sync.room_list_service().subscribe_to_rooms(&[room.room_id()]).await;
        room.timeline().await.with_context(|| format!("{}: the timeline of {}", self.name, room.room_id()))
    }

    async fn stop(self) {
        self.sync.stop().await;
        for task in self.tasks {
            task.abort();
        }
    }
}

/// The newest timeline item that is a message with `body`, sent by
/// `sender` if given: its event id once the server has it.
async fn message_in(timeline: &Timeline, body: &str, sender: Option<&UserId>) -> Option<OwnedEventId> {
    timeline.items().await.iter().rev().filter_map(|item| item.as_event()).find_map(|event| {
        let matches = event.content().as_message().is_some_and(|m| m.body() == body)
            && sender.is_none_or(|s| event.sender() == s);
        if matches { event.event_id().map(ToOwned::to_owned) } else { None }
    })
}

async fn room_list(probe: &Probe) -> Result<()> {
    let rooms = env("PROBE_ROOMS")?;
    let mut ids = Vec::new();
    for id in rooms.split(',').filter(|s| !s.is_empty()) {
        ids.push(OwnedRoomId::try_from(id).with_context(|| format!("PROBE_ROOMS: {id} is not a room id"))?);
    }
    probe
        .wait(&format!("the {} prepared rooms in the joined rooms list", ids.len()), async || {
            let all = ids.iter().all(|id| Probe::in_view(&probe.joined, id).is_some());
            Ok(all.then_some(()))
        })
        .await?;
    let count = probe.joined.lock().expect("view lock").len();
    probe.say(&format!(
        "room list: all {} prepared rooms are joined entries ({count} joined in all)",
        ids.len()
    ));
    Ok(())
}

/// The room list grows its range page by page (`[0,19]`, then by 100) until
/// it holds every room: all `PROBE_ROOM_COUNT` joined rooms become entries and
/// the list's `count` says as many.
async fn room_count(probe: &Probe) -> Result<()> {
    let want: usize = env("PROBE_ROOM_COUNT")?.parse().context("PROBE_ROOM_COUNT is not a number")?;
    let list = probe.sync.room_list_service().all_rooms().await?;
    let loading = list.loading_state();
    let mut seen = (0, None);
    probe
        .wait(&format!("{want} rooms in the joined rooms list"), async || {
            let entries = probe.joined.lock().expect("view lock").len();
            let count = match loading.get() {
                RoomListLoadingState::Loaded { maximum_number_of_rooms } => maximum_number_of_rooms,
                RoomListLoadingState::NotLoaded => None,
            };
            seen = (entries, count);
            Ok((entries == want && count == u32::try_from(want).ok()).then_some(()))
        })
        .await
        .with_context(|| format!("the list held {} entries, its count was {:?}", seen.0, seen.1))?;
    probe.say(&format!("room list: {want} joined entries, count {want}"));
    Ok(())
}

async fn latest_event(probe: &Probe) -> Result<()> {
    let room_id = room_id_env("PROBE_LATEST_ROOM")?;
    let want_id = env("PROBE_LATEST_EVENT")?;
    let want_body = env("PROBE_LATEST_BODY")?;
    let room = probe.joined_room(&room_id).await?;
    let mut seen = String::from("nothing");
    let found = probe
        .wait(&format!("the latest event of {room_id} to be {want_id}"), async || {
            let id = BaseRoom::latest_event(&room).event_id();
            let body = match RoomExt::latest_event(&room).await {
                LatestEventValue::Remote { content, .. } => content.as_message().map(|m| m.body().to_owned()),
                _ => None,
            };
            seen = format!("{id:?} with body {body:?}");
            Ok((id.as_deref().map(|i| i.as_str()) == Some(want_id.as_str())).then_some(body))
        })
        .await
        .with_context(|| format!("the room list's latest event was {seen}"))?;
    if found.as_deref() != Some(want_body.as_str()) {
        bail!("latest event of {room_id} is {want_id} but its body reads {found:?}, not {want_body:?}");
    }
    probe.say(&format!("latest event of {room_id}: {want_id} {want_body:?}"));
    Ok(())
}

async fn invite(probe: &Probe) -> Result<()> {
    let room_id = room_id_env("PROBE_INVITE_ROOM")?;
    let room = probe
        .wait(&format!("the invite to {room_id} in the invites list"), async || {
            Ok(Probe::in_view(&probe.invites, &room_id).filter(|room| room.state() == RoomState::Invited))
        })
        .await?;
    // Read from the user's own stripped member event in `invite_state`.
    let details = room.invite_details().await.with_context(|| format!("the invite details of {room_id}"))?;
    let inviter = details.inviter_id;
    if let Ok(want) = env("PROBE_INVITER")
        && inviter.as_str() != want
    {
        bail!("the invite to {room_id} names {inviter} as its sender, not {want}");
    }
    probe.say(&format!("invited to {room_id} by {inviter}; joining"));
    room.join().await.with_context(|| format!("joining {room_id}"))?;
    probe.joined_room(&room_id).await?;
    probe
        .wait(&format!("{room_id} out of the invites list"), async || {
            Ok(Probe::in_view(&probe.invites, &room_id).is_none().then_some(()))
        })
        .await?;
    probe.say(&format!("joined {room_id}: it moved from the invites to the joined rooms list"));
    Ok(())
}

async fn messages(probe: &Probe) -> Result<()> {
    let room_id = room_id_env("PROBE_CHAT_ROOM")?;
    let send_body = env("PROBE_SEND_BODY")?;
    let live_body = env("PROBE_LIVE_BODY")?;
    let room = probe.joined_room(&room_id).await?;
    let timeline = probe.open(&room).await?;
    let me = probe.client.user_id().context("no user id")?.to_owned();

    timeline
        .send(RoomMessageEventContent::text_plain(&send_body).into())
        .await
        .with_context(|| format!("sending in {room_id}"))?;
    let event_id = probe
        .wait("the remote echo of the message sent", async || {
            let echo = timeline.items().await.iter().filter_map(|i| i.as_event()).find_map(|e| {
                let ours = e.is_remote_event()
                    && e.sender() == me
                    && e.content().as_message().is_some_and(|m| m.body() == send_body);
                if ours { e.event_id().map(ToOwned::to_owned) } else { None }
            });
            Ok(echo)
        })
        .await?;
    probe.say(&format!("sent {send_body:?}, its remote echo came down the sync"));
    println!("SENT {event_id}");

    println!("READY live");
    let live = probe
        .wait(&format!("{live_body:?} from another user, live"), async || {
            Ok(message_in(&timeline, &live_body, None).await)
        })
        .await?;
    let sender = timeline
        .items()
        .await
        .iter()
        .filter_map(|i| i.as_event())
        .find(|e| e.event_id() == Some(&live))
        .map(|e| e.sender().to_owned());
    if sender.as_deref() == Some(&*me) {
        bail!("{live_body:?} came from the probe's own user, not another one");
    }
    probe.say(&format!("received {live_body:?} live ({live} from {sender:?})"));
    Ok(())
}

/// The server restarts (it keeps no sliding sync connection across that):
/// the sync loops stop on their errors and, started again as an app does,
/// meet `M_UNKNOWN_POS` and begin new connections; a message sent after the
/// restart must then come down into the open timeline.
async fn restart(probe: &Probe) -> Result<()> {
    let room_id = room_id_env("PROBE_CHAT_ROOM")?;
    let body = env("PROBE_RESTART_BODY")?;
    let room = probe.joined_room(&room_id).await?;
    let timeline = probe.open(&room).await?;
    println!("READY restart");
    let deadline = Instant::now() + WAIT;
    let mut restarts = 0;
    let found = loop {
        if let Some(found) = message_in(&timeline, &body, None).await {
            break found;
        }
        if let sync_service::State::Error(error) = probe.sync.state().get() {
            restarts += 1;
            probe.say(&format!("the sync stopped ({error}); starting it again"));
            probe.sync.start().await;
        }
        if Instant::now() >= deadline {
            bail!("timed out after {} s waiting for {body:?} after the restart", WAIT.as_secs());
        }
        tokio::time::sleep(POLL).await;
    };
    probe
        .wait("the sync service running again", async || {
            Ok(matches!(probe.sync.state().get(), sync_service::State::Running).then_some(()))
        })
        .await?;
    probe.say(&format!(
        "after the restart: {body:?} ({found}) came down; the sync was started {restarts} time(s)"
    ));
    Ok(())
}

async fn leave(probe: &Probe) -> Result<()> {
    let room_id = room_id_env("PROBE_LEAVE_ROOM")?;
    let room = probe.joined_room(&room_id).await?;
    room.leave().await.with_context(|| format!("leaving {room_id}"))?;
    probe
        .wait(&format!("{room_id} in state Left and out of the joined rooms list"), async || {
            let gone = Probe::in_view(&probe.joined, &room_id).is_none();
            let left = probe.client.get_room(&room_id).is_some_and(|r| r.state() == RoomState::Left);
            Ok((gone && left).then_some(()))
        })
        .await?;
    probe.say(&format!("left {room_id}: state Left, out of the joined rooms list"));
    Ok(())
}

/// Waits until `probe` knows a device of `user` (its keys came through
/// `/keys/query` after the `device_lists` of the `e2ee` extension or the
/// room's members told it to look).
async fn knows_device_of(probe: &Probe, user: &UserId, device: &str) -> Result<()> {
    probe
        .wait(&format!("device {device} of {user}"), async || {
            let devices = probe.client.encryption().get_user_devices(user).await?;
            Ok(devices.devices().any(|d| d.device_id().as_str() == device).then_some(()))
        })
        .await?;
    probe.say(&format!("knows device {device} of {user}"));
    Ok(())
}

async fn e2ee(hs: &str, probe: &Probe) -> Result<()> {
    let room_id = room_id_env("PROBE_E2EE_ROOM")?;
    let other = Probe::start(hs, &env("PROBE_USER2")?, &env("PROBE_PASSWORD2")?).await?;
    let result = e2ee_between(probe, &other, &room_id).await;
    other.stop().await;
    result
}

async fn e2ee_between(a: &Probe, b: &Probe, room_id: &RoomId) -> Result<()> {
    let a_user = a.client.user_id().context("no user id")?.to_owned();
    let b_user = b.client.user_id().context("no user id")?.to_owned();
    let a_device = a.client.device_id().context("no device")?.to_string();
    let b_device = b.client.device_id().context("no device")?.to_string();
    let a_room = a.joined_room(room_id).await?;
    let b_room = b.joined_room(room_id).await?;
    for (probe, room) in [(a, &a_room), (b, &b_room)] {
        probe
            .wait(&format!("{room_id} known to be encrypted"), async || {
                Ok(room.encryption_state().is_encrypted().then_some(()))
            })
            .await?;
    }
    // A, the room's creator, saw B join in the room's timeline: it tracks B
    // and must get B's device (a key query, again when the `e2ee`
    // extension's `device_lists.changed` names B after B's upload). B saw no
    // event of A's yet (`$LAZY` members only): B's first send loads the
    // room's members and queries A's keys itself.
    knows_device_of(a, &b_user, &b_device).await?;
    let a_timeline = a.open(&a_room).await?;
    let b_timeline = b.open(&b_room).await?;

    let pairs = [(a, &a_timeline, b, &b_timeline, &a_user), (b, &b_timeline, a, &a_timeline, &b_user)];
    for (from, from_timeline, to, to_timeline, sender) in pairs {
        let body = format!("encrypted hello from {sender}");
        from_timeline
            .send(RoomMessageEventContent::text_plain(&body).into())
            .await
            .with_context(|| format!("{}: sending in {room_id}", from.name))?;
        from.wait("the remote echo of the encrypted message", async || {
            Ok(message_in(from_timeline, &body, Some(sender)).await)
        })
        .await?;
        let mut utd = false;
        let id = to
            .wait(&format!("{body:?} decrypted"), async || {
                let items = to_timeline.items().await;
                utd = items.iter().filter_map(|i| i.as_event()).any(|e| e.content().is_unable_to_decrypt());
                Ok(message_in(to_timeline, &body, Some(sender)).await)
            })
            .await
            .with_context(|| format!("an unable-to-decrypt item was in the timeline: {utd}"))?;
        to.say(&format!("decrypted {body:?} ({id})"));
    }
    knows_device_of(b, &a_user, &a_device).await?;
    Ok(())
}

async fn run(scenarios: &[String]) -> Result<()> {
    let hs = env("PROBE_HS")?;
    let probe = Probe::start(&hs, &env("PROBE_USER")?, &env("PROBE_PASSWORD")?).await?;
    let mut result = Ok(());
    for scenario in scenarios {
        println!("== {scenario}");
        result = match scenario.as_str() {
            "login" => Ok(()),
            "room-list" => room_list(&probe).await,
            "room-count" => room_count(&probe).await,
            "latest-event" => latest_event(&probe).await,
            "invite" => invite(&probe).await,
            "messages" => messages(&probe).await,
            "leave" => leave(&probe).await,
            "restart" => restart(&probe).await,
            "e2ee" => e2ee(&hs, &probe).await,
            other => Err(anyhow::anyhow!("unknown scenario {other}")),
        }
        .with_context(|| format!("scenario {scenario}"));
        if result.is_err() {
            break;
        }
    }
    probe.stop().await;
    result
}

#[tokio::main]
async fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();

    // `all` stands for the scenarios it names, in place.
    let scenarios: Vec<String> = std::env::args()
        .skip(1)
        .flat_map(|arg| match arg.as_str() {
            "all" => SCENARIOS.iter().map(|s| (*s).to_owned()).collect(),
            _ => vec![arg],
        })
        .collect();
    if scenarios.is_empty() {
        eprintln!("usage: rust-sdk-probe SCENARIO... (all, {}, restart, room-count)", SCENARIOS.join(", "));
        std::process::exit(2);
    }
    match run(&scenarios).await {
        Ok(()) => println!("OK"),
        Err(error) => {
            println!("FAILED: {error:#}");
            eprintln!("rust-sdk-probe failed: {error:#}");
            std::process::exit(1);
        }
    }
}
