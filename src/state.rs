//! The state every request handler shares: settings, database, signing key,
//! rate limiter. Passed explicitly (axum state), never a global, so tests can
//! run many servers in one process if they need to.

use std::ops::Deref;
use std::sync::Arc;

use crate::config::Settings;
use crate::ratelimit::RateLimiter;
use crate::signing_key::ServerKey;
use crate::storage::Db;
use crate::streams::{Notifier, Streams};
use crate::sync::typing::Typing;

/// Cheap to clone; all clones share one [`Services`].
#[derive(Debug, Clone)]
pub struct AppState(Arc<Services>);

/// The services behind [`AppState`].
#[derive(Debug)]
pub struct Services {
    /// Validated configuration.
    pub settings: Settings,
    /// Database.
    pub db: Db,
    /// The server's signing key.
    pub signing_key: ServerKey,
    /// Rate limiter (per address, account, room).
    pub rate_limiter: RateLimiter,
    /// The global stream position.
    pub streams: Arc<Streams>,
    /// Wakes long-polling syncs.
    pub notifier: Notifier,
    /// Who is typing where.
    pub typing: Typing,
    /// Who is online.
    pub presence: crate::sync::presence::PresenceMap,
    /// Unread-notification counts already worked out.
    pub counts: crate::notify::CountCache,
    /// What joined rooms' last `/sync` entries said besides their events.
    pub quiet_rooms: crate::sync::quiet::QuietRooms,
    /// Users with at least one pusher (so the send path asks no more).
    pub pusher_users: std::sync::RwLock<std::collections::HashSet<String>>,
    /// Outgoing HTTP (push gateways): address checks, TLS, no redirects.
    pub outbound: crate::outbound::Outbound,
    /// Push deliveries in flight at once (each may wait on a slow gateway).
    pub push_slots: std::sync::Arc<tokio::sync::Semaphore>,
    /// Access tokens resolved recently.
    pub tokens: crate::account::TokenCache,
    /// Password checks take turns per account.
    pub password_gate: crate::account::PasswordGate,
    /// Room appends waiting to be written in batches.
    pub write_queue: crate::room::timeline::WriteQueue,
    /// What deciding who may read what in a room needs, between requests.
    pub read_cache: crate::room::cache::ReadCache,
    /// Default push rule sets, built once per user.
    pub push_defaults: crate::notify::DefaultRules,
    /// Thumbnails made at once: one per core.
    pub thumbnailing: tokio::sync::Semaphore,
    /// URL previews being made.
    pub previews: crate::preview::Previews,
    /// Other servers' answers about their spaces' rooms, kept a while.
    pub hierarchy_cache: crate::room::spaces::RemoteCache,
    /// Servers whose keys could not be fetched lately, not asked again yet.
    pub key_fetch_backoff: crate::federation::keys::FetchBackoff,
    /// Other servers' stored keys, kept in memory a while.
    pub server_keys: crate::federation::keys::KeyCache,
    /// The tasks sending our events to other servers.
    pub federation_sender: crate::federation::sender::Sender,
    /// Where other servers are reached (well-known cache, SRV).
    pub server_resolver: crate::federation::resolve::Resolver,
    /// Sliding sync connections: what each client holds, per position.
    pub sliding: crate::sync::sliding::conn::Connections,
    /// Backfills under way, and events no server could give.
    pub backfills: crate::federation::backfill::Backfills,
    /// One received transaction at a time per sending server.
    pub inbound_turns: crate::federation::incoming::InboundTurns,
    /// Users deactivated with `erase: true` (loaded at start, added to on
    /// erasure): their events are served redacted to those who were not
    /// joined when they were sent.
    pub erased: std::sync::RwLock<std::collections::HashSet<String>>,
}

impl AppState {
    /// Wraps the services.
    pub fn new(
        settings: Settings,
        db: Db,
        signing_key: ServerKey,
        last_stream: i64,
        pusher_users: std::collections::HashSet<String>,
        outbound: crate::outbound::Outbound,
    ) -> Self {
        let rate_limiter = RateLimiter::new(settings.rate_limits.clone());
        let previews = crate::preview::Previews::new(settings.url_preview_ip_allow.clone());
        Self(Arc::new(Services {
            settings,
            db,
            signing_key,
            rate_limiter,
            streams: Streams::starting_after(last_stream),
            notifier: Notifier::default(),
            typing: Typing::default(),
            presence: crate::sync::presence::PresenceMap::default(),
            counts: crate::notify::CountCache::default(),
            quiet_rooms: crate::sync::quiet::QuietRooms::default(),
            pusher_users: std::sync::RwLock::new(pusher_users),
            server_resolver: crate::federation::resolve::Resolver::new(outbound.clone()),
            outbound,
            push_slots: std::sync::Arc::new(tokio::sync::Semaphore::new(crate::notify::MAX_PUSHES_IN_FLIGHT)),
            tokens: crate::account::TokenCache::default(),
            password_gate: crate::account::PasswordGate::default(),
            write_queue: crate::room::timeline::WriteQueue::default(),
            read_cache: crate::room::cache::ReadCache::default(),
            push_defaults: crate::notify::DefaultRules::default(),
            thumbnailing: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
            ),
            previews,
            hierarchy_cache: crate::room::spaces::RemoteCache::default(),
            key_fetch_backoff: crate::federation::keys::FetchBackoff::default(),
            server_keys: crate::federation::keys::KeyCache::default(),
            federation_sender: crate::federation::sender::Sender::default(),
            sliding: crate::sync::sliding::conn::Connections::new(),
            backfills: crate::federation::backfill::Backfills::default(),
            inbound_turns: crate::federation::incoming::InboundTurns::default(),
            erased: std::sync::RwLock::default(),
        }))
    }
}

impl Deref for AppState {
    type Target = Services;
    fn deref(&self) -> &Services {
        &self.0
    }
}
