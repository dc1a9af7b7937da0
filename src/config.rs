//! One typed configuration, read from an optional TOML file, then overridden by
//! `SEQLINE_*` environment variables, then validated once at start-up.
//!
//! The documented example `config/seqline.toml` is embedded in the binary: it is
//! what `seqline generate-config` prints, and a unit test checks that it parses to
//! exactly [`Config::default`], so the file and the defaults cannot drift apart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use ruma::OwnedServerName;
use serde::Deserialize;

/// The example configuration shipped with seqline, every setting at its default.
pub const EXAMPLE: &str = include_str!("../config/seqline.toml");

/// A configuration problem, phrased as one line naming the setting.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// How new accounts may be created over the client API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegistrationMode {
    /// Only the `register-user` command creates accounts.
    Off,
    /// Anyone may register, completing `m.login.dummy`.
    Open,
    /// Registering needs a configured token (`m.login.registration_token`).
    Token,
}

impl RegistrationMode {
    fn parse(value: &str) -> Option<Self> {
        match value {
            "off" => Some(Self::Off),
            "open" => Some(Self::Open),
            "token" => Some(Self::Token),
            _ => None,
        }
    }
}

/// When an SQLite commit reaches the disk (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// Before it is answered: nothing acknowledged is lost to a power cut.
    Full,
    /// At the next checkpoint: faster; a power cut (not a crash of seqline)
    /// can lose the last commits, also ones already answered.
    Normal,
}

impl SqliteSynchronous {
    fn parse(value: &str) -> Option<Self> {
        match value {
            "full" => Some(Self::Full),
            "normal" => Some(Self::Normal),
            _ => None,
        }
    }

    /// The pragma's value.
    pub fn as_pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// The whole configuration as written in the file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The server name in user ids and aliases.
    pub server_name: String,
    /// Base URL advertised to clients; empty means derived from the listener.
    pub public_baseurl: String,
    /// Directory holding the key, the SQLite file and media.
    pub data_dir: PathBuf,
    /// `sqlite://...` or `postgres://...`; empty means SQLite in the data dir.
    pub database_url: String,
    /// SQLite only: when a commit reaches the disk.
    pub sqlite_synchronous: SqliteSynchronous,
    /// Path of the signing key file; empty means `<data_dir>/signing.key`.
    pub signing_key_path: String,
    /// tracing filter.
    pub log: String,
    /// Listeners.
    pub listen: Listen,
    /// Who may register.
    pub registration: Registration,
    /// Request size limits.
    pub limits: Limits,
    /// Rate limits for login and registration.
    pub rate_limits: RateLimits,
    /// History settings.
    pub history: History,
    /// Presence.
    pub presence: PresenceConfig,
    /// VoIP (TURN servers for calls).
    pub voip: Voip,
    /// Media limits.
    pub media: MediaConfig,
    /// Requests seqline makes to other hosts.
    pub outbound: OutboundConfig,
    /// Federation with other servers.
    pub federation: FederationConfig,
    /// The federation listener's certificate.
    pub tls: TlsConfig,
}

/// Federation settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FederationConfig {
    /// Whether the federation listener serves (when `listen.federation` is set).
    pub enabled: bool,
    /// Whether outbound federation requests check the peer's certificate.
    pub verify_tls: bool,
    /// Most events kept queued for one server that does not answer; past
    /// it only the newest event of each room is kept (the server fills the
    /// rest from /get_missing_events and /backfill when it is back).
    pub max_queued_per_destination: u32,
}

impl Default for FederationConfig {
    fn default() -> Self {
        Self { enabled: true, verify_tls: true, max_queued_per_destination: 1000 }
    }
}

/// The federation listener's certificate chain and key (PEM files).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain, leaf first.
    pub cert_path: String,
    /// Private key of the leaf certificate.
    pub key_path: String,
}

/// Media limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MediaConfig {
    /// Images with more pixels (width x height, read from the header) get no thumbnail.
    pub max_thumbnail_pixels: u64,
    /// `/v1/create` reservations a user may hold unused at once.
    pub max_pending_uploads: u32,
    /// Whether `/preview_url` fetches pages (404 M_UNRECOGNIZED when off).
    pub url_previews: bool,
    /// Bytes read of a previewed page or its image at most.
    pub url_preview_max_bytes: usize,
    /// CIDR ranges previews may fetch from although they are internal; on
    /// purpose not `outbound.ip_allow` (a push gateway on the LAN must not
    /// open the LAN to every user's previews).
    pub url_preview_ip_allow: Vec<String>,
}

impl Default for MediaConfig {
    fn default() -> Self {
        Self {
            max_thumbnail_pixels: 32 * 1024 * 1024,
            max_pending_uploads: 5,
            url_previews: true,
            url_preview_max_bytes: 10 * 1024 * 1024,
            url_preview_ip_allow: Vec::new(),
        }
    }
}

/// Outbound request settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboundConfig {
    /// CIDR ranges exempt from the default refusal of internal addresses.
    pub ip_allow: Vec<String>,
}

/// Presence settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PresenceConfig {
    /// Whether presence is kept and sent at all.
    pub enabled: bool,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// TURN settings handed to clients by `GET /voip/turnServer`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Voip {
    /// TURN server URIs (`turn:host:port?transport=udp`, ...); none = no TURN.
    pub turn_uris: Vec<String>,
    /// Shared secret for time-limited credentials (the TURN REST API scheme
    /// that coturn's `use-auth-secret` implements).
    pub turn_shared_secret: String,
    /// Fixed credentials, used when there is no shared secret.
    pub turn_username: String,
    /// Fixed credentials, used when there is no shared secret.
    pub turn_password: String,
    /// How long handed-out credentials stay valid, in seconds.
    pub turn_user_lifetime_secs: u64,
}

impl Default for Voip {
    fn default() -> Self {
        Self {
            turn_uris: Vec::new(),
            turn_shared_secret: String::new(),
            turn_username: String::new(),
            turn_password: String::new(),
            turn_user_lifetime_secs: 86_400,
        }
    }
}

/// History settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct History {
    /// Power level a room member needs to purge the room's history.
    pub purge_power_level: i64,
    /// The shortest `m.room.retention` `max_lifetime` honoured, in ms: a
    /// shorter one counts as this (so a room setting cannot hide all history
    /// at once).
    pub retention_min_lifetime_ms: i64,
    /// The longest `max_lifetime` honoured, in ms (0: no bound).
    pub retention_max_lifetime_ms: i64,
}

impl Default for History {
    fn default() -> Self {
        Self { purge_power_level: 100, retention_min_lifetime_ms: 86_400_000, retention_max_lifetime_ms: 0 }
    }
}

impl History {
    /// The `max_lifetime` in force for a room that asks for `asked` ms.
    pub fn clamp_lifetime(&self, asked: i64) -> i64 {
        let max = if self.retention_max_lifetime_ms > 0 { self.retention_max_lifetime_ms } else { i64::MAX };
        asked.clamp(self.retention_min_lifetime_ms, max.max(self.retention_min_lifetime_ms))
    }
}

/// Listener addresses.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listen {
    /// Client-server API, `address:port`.
    pub client: String,
    /// Federation (TLS), `address:port`; empty: none.
    pub federation: String,
}

/// Registration settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Registration {
    /// `off`, `open` or `token`.
    pub mode: RegistrationMode,
    /// Tokens accepted in `token` mode.
    pub tokens: Vec<String>,
    /// Lifetime of an access token that comes with a refresh token.
    pub access_token_lifetime_ms: i64,
}

/// Size limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted request body on the client API.
    pub max_request_body_bytes: usize,
    /// Largest media upload.
    pub max_upload_bytes: usize,
    /// Seconds a client may take to send a request's headers.
    pub header_read_timeout_secs: u64,
    /// Seconds a client may take to send a request's body.
    pub body_read_timeout_secs: u64,
}

/// Token-bucket rate limits (a burst, refilled at a rate per second): per
/// client address, per account, per room.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimits {
    /// Whether limits apply at all.
    pub enabled: bool,
    /// Login refill rate, per client address.
    pub login_per_second: f64,
    /// Login burst size, per client address.
    pub login_burst: u32,
    /// Successful logins per account: refill rate.
    pub login_account_per_second: f64,
    /// Successful logins per account: burst.
    pub login_account_burst: u32,
    /// Wrong passwords per account (logins and UIA password stages): refill rate.
    pub failed_login_per_second: f64,
    /// Wrong passwords per account: burst.
    pub failed_login_burst: u32,
    /// Registration refill rate.
    pub register_per_second: f64,
    /// Registration burst size.
    pub register_burst: u32,
    /// Events sent per user: refill rate.
    pub message_per_second: f64,
    /// Events sent per user: burst.
    pub message_burst: u32,
    /// Joins per user: refill rate.
    pub join_per_second: f64,
    /// Joins per user: burst.
    pub join_burst: u32,
    /// Invites into one room: refill rate.
    pub invite_room_per_second: f64,
    /// Invites into one room: burst.
    pub invite_room_burst: u32,
    /// Invites received by one user: refill rate.
    pub invite_user_per_second: f64,
    /// Invites received by one user: burst.
    pub invite_user_burst: u32,
    /// Presence updates per user: refill rate.
    pub presence_per_second: f64,
    /// Presence updates per user: burst.
    pub presence_burst: u32,
    /// URL previews fetched per user: refill rate.
    pub url_preview_per_second: f64,
    /// URL previews fetched per user: burst.
    pub url_preview_burst: u32,
    /// Proxies (addresses or CIDRs) whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<String>,
}

impl RateLimits {
    fn rates(&self) -> [(&'static str, f64, u32); 10] {
        [
            ("login", self.login_per_second, self.login_burst),
            ("login_account", self.login_account_per_second, self.login_account_burst),
            ("failed_login", self.failed_login_per_second, self.failed_login_burst),
            ("register", self.register_per_second, self.register_burst),
            ("message", self.message_per_second, self.message_burst),
            ("join", self.join_per_second, self.join_burst),
            ("invite_room", self.invite_room_per_second, self.invite_room_burst),
            ("invite_user", self.invite_user_per_second, self.invite_user_burst),
            ("presence", self.presence_per_second, self.presence_burst),
            ("url_preview", self.url_preview_per_second, self.url_preview_burst),
        ]
    }
}

/// A trusted proxy: an address (a single-host network) or a CIDR.
fn parse_ip_range(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>().ok().or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server_name: "localhost:8008".into(),
            public_baseurl: String::new(),
            data_dir: PathBuf::from("./data"),
            database_url: String::new(),
            sqlite_synchronous: SqliteSynchronous::Full,
            signing_key_path: String::new(),
            log: "info".into(),
            listen: Listen::default(),
            registration: Registration::default(),
            limits: Limits::default(),
            rate_limits: RateLimits::default(),
            history: History::default(),
            presence: PresenceConfig::default(),
            voip: Voip::default(),
            media: MediaConfig::default(),
            outbound: OutboundConfig::default(),
            federation: FederationConfig::default(),
            tls: TlsConfig::default(),
        }
    }
}

impl Default for Listen {
    fn default() -> Self {
        Self { client: "127.0.0.1:8008".into(), federation: String::new() }
    }
}

impl Default for Registration {
    fn default() -> Self {
        Self { mode: RegistrationMode::Off, tokens: Vec::new(), access_token_lifetime_ms: 300_000 }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_body_bytes: 1024 * 1024,
            max_upload_bytes: 50 * 1024 * 1024,
            header_read_timeout_secs: 30,
            body_read_timeout_secs: 60,
        }
    }
}

impl Default for RateLimits {
    fn default() -> Self {
        // Synapse's defaults (rc_login, rc_message, rc_joins.local, rc_invites, rc_presence).
        Self {
            enabled: true,
            login_per_second: 0.003,
            login_burst: 5,
            login_account_per_second: 0.003,
            login_account_burst: 5,
            failed_login_per_second: 0.17,
            failed_login_burst: 3,
            register_per_second: 0.2,
            register_burst: 5,
            message_per_second: 0.2,
            message_burst: 10,
            join_per_second: 0.1,
            join_burst: 10,
            invite_room_per_second: 0.3,
            invite_room_burst: 10,
            invite_user_per_second: 0.003,
            invite_user_burst: 5,
            presence_per_second: 0.1,
            presence_burst: 1,
            url_preview_per_second: 0.2,
            url_preview_burst: 10,
            trusted_proxies: Vec::new(),
        }
    }
}

/// The configuration after overrides and validation: what the server runs on.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Server name, parsed.
    pub server_name: OwnedServerName,
    /// Base URL for `/.well-known/matrix/client`, with a trailing slash;
    /// `None` until known when derived from the listener (which may bind port 0).
    pub public_baseurl: Option<String>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Database URL, resolved.
    pub database_url: String,
    /// SQLite's `synchronous`.
    pub sqlite_synchronous: SqliteSynchronous,
    /// Signing key file, resolved.
    pub signing_key_path: PathBuf,
    /// tracing filter.
    pub log: String,
    /// Client listener.
    pub client_listen: SocketAddr,
    /// Registration mode.
    pub registration: RegistrationMode,
    /// Registration tokens.
    pub registration_tokens: Vec<String>,
    /// Lifetime of an access token that comes with a refresh token.
    pub access_token_lifetime_ms: i64,
    /// Body limit.
    pub max_request_body_bytes: usize,
    /// Media upload limit.
    pub max_upload_bytes: usize,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: std::time::Duration,
    /// How long a client may take to send a request's body.
    pub body_read_timeout: std::time::Duration,
    /// Rate limits.
    pub rate_limits: RateLimits,
    /// `rate_limits.trusted_proxies`, parsed.
    pub trusted_proxies: Vec<IpNet>,
    /// Power level needed to purge a room's history, retention bounds.
    pub history: History,
    /// Whether presence is kept and sent.
    pub presence_enabled: bool,
    /// TURN settings.
    pub voip: Voip,
    /// Media limits.
    pub media: MediaConfig,
    /// Ranges outbound requests may reach despite the default refusals.
    pub outbound_ip_allow: Vec<ipnet::IpNet>,
    /// `media.url_preview_ip_allow`, parsed.
    pub url_preview_ip_allow: Vec<ipnet::IpNet>,
    /// The federation listener, when federation is on.
    pub federation: Option<FederationListener>,
    /// Whether outbound federation requests check the peer's certificate.
    pub federation_verify_tls: bool,
    /// `federation.max_queued_per_destination` (at least 1).
    pub federation_max_queued: i64,
}

/// The federation listener: its address and TLS configuration (certificate
/// and key read and checked at start-up).
#[derive(Debug, Clone)]
pub struct FederationListener {
    /// `listen.federation`.
    pub addr: SocketAddr,
    /// rustls server configuration with the certificate chain and key.
    pub tls: std::sync::Arc<rustls::ServerConfig>,
}

impl Config {
    /// Reads the file if one is given (else the defaults), then applies the
    /// `SEQLINE_*` environment overrides from `env`.
    pub fn load(path: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ConfigError(format!("config file {}: cannot read: {e}", path.display())))?;
                Self::parse(&text)
                    .map_err(|e| ConfigError(format!("config file {}: {}", path.display(), e.0)))?
            }
            None => Self::default(),
        };
        config.apply_env(env)?;
        Ok(config)
    }

    /// Parses TOML text; unknown settings are an error naming them.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| {
            // toml's messages span several lines (a source excerpt); keep the one that says what is wrong.
            let message = e.message().trim().to_owned();
            match e.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].lines().count().max(1);
                    ConfigError(format!("line {line}: {message}"))
                }
                None => ConfigError(message),
            }
        })
    }

    fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(v) = env("SEQLINE_SERVER_NAME") {
            self.server_name = v;
        }
        if let Some(v) = env("SEQLINE_PUBLIC_BASEURL") {
            self.public_baseurl = v;
        }
        if let Some(v) = env("SEQLINE_LISTEN") {
            self.listen.client = v;
        }
        if let Some(v) = env("SEQLINE_DATA_DIR") {
            self.data_dir = PathBuf::from(v);
        }
        if let Some(v) = env("SEQLINE_DATABASE_URL") {
            self.database_url = v;
        }
        if let Some(v) = env("SEQLINE_SQLITE_SYNCHRONOUS") {
            self.sqlite_synchronous = SqliteSynchronous::parse(&v).ok_or_else(|| {
                ConfigError(format!("SEQLINE_SQLITE_SYNCHRONOUS: {v:?} is not \"full\" or \"normal\""))
            })?;
        }
        if let Some(v) = env("SEQLINE_SIGNING_KEY_PATH") {
            self.signing_key_path = v;
        }
        if let Some(v) = env("SEQLINE_LOG") {
            self.log = v;
        }
        if let Some(v) = env("SEQLINE_REGISTRATION") {
            self.registration.mode = RegistrationMode::parse(&v).ok_or_else(|| {
                ConfigError(format!("SEQLINE_REGISTRATION: {v:?} is not one of \"off\", \"open\", \"token\""))
            })?;
        }
        if let Some(v) = env("SEQLINE_REGISTRATION_TOKENS") {
            self.registration.tokens =
                v.split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect();
        }
        if let Some(v) = env("SEQLINE_RATE_LIMITS") {
            self.rate_limits.enabled = match v.as_str() {
                "on" => true,
                "off" => false,
                _ => {
                    return Err(ConfigError(format!("SEQLINE_RATE_LIMITS: {v:?} is not \"on\" or \"off\"")));
                }
            };
        }
        if let Some(v) = env("SEQLINE_TRUSTED_PROXIES") {
            self.rate_limits.trusted_proxies =
                v.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect();
        }
        if let Some(v) = env("SEQLINE_PRESENCE") {
            self.presence.enabled = match v.as_str() {
                "on" => true,
                "off" => false,
                _ => return Err(ConfigError(format!("SEQLINE_PRESENCE: {v:?} is not \"on\" or \"off\""))),
            };
        }
        if let Some(v) = env("SEQLINE_TURN_URIS") {
            self.voip.turn_uris =
                v.split(',').map(str::trim).filter(|u| !u.is_empty()).map(String::from).collect();
        }
        if let Some(v) = env("SEQLINE_URL_PREVIEW_IP_ALLOW") {
            self.media.url_preview_ip_allow =
                v.split(',').map(str::trim).filter(|r| !r.is_empty()).map(String::from).collect();
        }
        if let Some(v) = env("SEQLINE_OUTBOUND_IP_ALLOW") {
            self.outbound.ip_allow =
                v.split(',').map(str::trim).filter(|r| !r.is_empty()).map(String::from).collect();
        }
        if let Some(v) = env("SEQLINE_LISTEN_FEDERATION") {
            self.listen.federation = v;
        }
        for (name, field) in [
            ("SEQLINE_FEDERATION", &mut self.federation.enabled),
            ("SEQLINE_FEDERATION_VERIFY_TLS", &mut self.federation.verify_tls),
            ("SEQLINE_URL_PREVIEWS", &mut self.media.url_previews),
        ] {
            if let Some(v) = env(name) {
                *field = match v.as_str() {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    _ => {
                        return Err(ConfigError(format!("{name}: {v:?} is not one of on, off, true, false")));
                    }
                };
            }
        }
        if let Some(v) = env("SEQLINE_FEDERATION_MAX_QUEUED") {
            self.federation.max_queued_per_destination = v
                .parse()
                .map_err(|_| ConfigError(format!("SEQLINE_FEDERATION_MAX_QUEUED: {v:?} is not a number")))?;
        }
        if let Some(v) = env("SEQLINE_TLS_CERT") {
            self.tls.cert_path = v;
        }
        if let Some(v) = env("SEQLINE_TLS_KEY") {
            self.tls.key_path = v;
        }
        if let Some(v) = env("SEQLINE_TURN_SHARED_SECRET") {
            self.voip.turn_shared_secret = v;
        }
        for (name, field) in [
            ("SEQLINE_RETENTION_MIN_LIFETIME_MS", &mut self.history.retention_min_lifetime_ms),
            ("SEQLINE_RETENTION_MAX_LIFETIME_MS", &mut self.history.retention_max_lifetime_ms),
            ("SEQLINE_ACCESS_TOKEN_LIFETIME_MS", &mut self.registration.access_token_lifetime_ms),
        ] {
            if let Some(v) = env(name) {
                *field = v
                    .parse()
                    .map_err(|_| ConfigError(format!("{name}: {v:?} is not a number of milliseconds")))?;
            }
        }
        if let Some(v) = env("SEQLINE_MAX_UPLOAD_BYTES") {
            self.limits.max_upload_bytes = v
                .parse()
                .map_err(|_| ConfigError(format!("SEQLINE_MAX_UPLOAD_BYTES: {v:?} is not a byte count")))?;
        }
        for (name, field) in [
            ("SEQLINE_HEADER_READ_TIMEOUT_SECS", &mut self.limits.header_read_timeout_secs),
            ("SEQLINE_BODY_READ_TIMEOUT_SECS", &mut self.limits.body_read_timeout_secs),
        ] {
            if let Some(v) = env(name) {
                *field = v
                    .parse()
                    .map_err(|_| ConfigError(format!("{name}: {v:?} is not a number of seconds")))?;
            }
        }
        if let Some(v) = env("SEQLINE_MAX_REQUEST_BODY_BYTES") {
            self.limits.max_request_body_bytes = v.parse().map_err(|_| {
                ConfigError(format!("SEQLINE_MAX_REQUEST_BODY_BYTES: {v:?} is not a byte count"))
            })?;
        }
        if let Some(v) = env("SEQLINE_MAX_THUMBNAIL_PIXELS") {
            self.media.max_thumbnail_pixels = v.parse().map_err(|_| {
                ConfigError(format!("SEQLINE_MAX_THUMBNAIL_PIXELS: {v:?} is not a pixel count"))
            })?;
        }
        if let Some(v) = env("SEQLINE_URL_PREVIEW_MAX_BYTES") {
            self.media.url_preview_max_bytes = v.parse().map_err(|_| {
                ConfigError(format!("SEQLINE_URL_PREVIEW_MAX_BYTES: {v:?} is not a byte count"))
            })?;
        }
        if let Some(v) = env("SEQLINE_MAX_PENDING_MEDIA_UPLOADS") {
            self.media.max_pending_uploads = v.parse().map_err(|_| {
                ConfigError(format!("SEQLINE_MAX_PENDING_MEDIA_UPLOADS: {v:?} is not a count"))
            })?;
        }
        Ok(())
    }

    /// Checks every setting and resolves the derived ones.
    pub fn validate(self) -> Result<Settings, ConfigError> {
        let server_name = OwnedServerName::try_from(self.server_name.as_str()).map_err(|e| {
            ConfigError(format!("server_name: {:?} is not a valid server name ({e})", self.server_name))
        })?;
        let client_listen: SocketAddr = self.listen.client.parse().map_err(|_| {
            ConfigError(format!(
                "listen.client: {:?} is not an address:port such as 127.0.0.1:8008",
                self.listen.client
            ))
        })?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError("data_dir: must not be empty".into()));
        }
        if self.history.retention_min_lifetime_ms < 0 || self.history.retention_max_lifetime_ms < 0 {
            return Err(ConfigError("history.retention_*_lifetime_ms: must not be negative".into()));
        }
        let database_url = if self.database_url.is_empty() {
            format!("sqlite://{}", self.data_dir.join("seqline.db").display())
        } else {
            self.database_url.clone()
        };
        if !(database_url.starts_with("sqlite:")
            || database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://"))
        {
            return Err(ConfigError(format!(
                "database_url: {database_url:?} must start with sqlite:// or postgres://"
            )));
        }
        let signing_key_path = if self.signing_key_path.is_empty() {
            self.data_dir.join("signing.key")
        } else {
            PathBuf::from(&self.signing_key_path)
        };
        if self.registration.mode == RegistrationMode::Token && self.registration.tokens.is_empty() {
            return Err(ConfigError("registration.tokens: mode = \"token\" needs at least one token".into()));
        }
        if self.limits.max_request_body_bytes < 1024 {
            return Err(ConfigError("limits.max_request_body_bytes: must be at least 1024".into()));
        }
        if self.limits.header_read_timeout_secs == 0 || self.limits.body_read_timeout_secs == 0 {
            return Err(ConfigError(
                "limits.header_read_timeout_secs, body_read_timeout_secs: must be at least 1".into(),
            ));
        }
        for (name, rate, burst) in self.rate_limits.rates() {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(ConfigError(format!("rate_limits.{name}_per_second: must be a positive number")));
            }
            if burst == 0 {
                return Err(ConfigError(format!("rate_limits.{name}_burst: must be at least 1")));
            }
        }
        let trusted_proxies = self
            .rate_limits
            .trusted_proxies
            .iter()
            .map(|p| {
                parse_ip_range(p).ok_or_else(|| {
                    ConfigError(format!("rate_limits.trusted_proxies: {p:?} is not an IP address or CIDR"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let voip = &self.voip;
        for uri in &voip.turn_uris {
            if !(uri.starts_with("turn:") || uri.starts_with("turns:") || uri.starts_with("stun:")) {
                return Err(ConfigError(format!(
                    "voip.turn_uris: {uri:?} must start with turn:, turns: or stun:"
                )));
            }
        }
        let fixed = !voip.turn_username.is_empty() && !voip.turn_password.is_empty();
        if !voip.turn_uris.is_empty() && voip.turn_shared_secret.is_empty() && !fixed {
            return Err(ConfigError(
                "voip.turn_uris: needs turn_shared_secret, or turn_username and turn_password".into(),
            ));
        }
        if voip.turn_user_lifetime_secs == 0 {
            return Err(ConfigError("voip.turn_user_lifetime_secs: must be at least 1".into()));
        }
        if self.media.max_thumbnail_pixels == 0 {
            return Err(ConfigError("media.max_thumbnail_pixels: must be at least 1".into()));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log) {
            return Err(ConfigError(format!("log: {:?} is not a valid filter ({e})", self.log)));
        }
        let ranges = |field: &str, list: &[String]| {
            list.iter()
                .map(|r| {
                    // A bare address is the range of that one address.
                    parse_ip_range(r).ok_or_else(|| {
                        ConfigError(format!("{field}: {r:?} is not a CIDR range such as 127.0.0.0/8"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let outbound_ip_allow = ranges("outbound.ip_allow", &self.outbound.ip_allow)?;
        let url_preview_ip_allow = ranges("media.url_preview_ip_allow", &self.media.url_preview_ip_allow)?;
        let federation = self.federation_listener()?;
        let public_baseurl = if self.public_baseurl.is_empty() {
            None
        } else if self.public_baseurl.starts_with("http://") || self.public_baseurl.starts_with("https://") {
            let mut url = self.public_baseurl.clone();
            if !url.ends_with('/') {
                url.push('/');
            }
            Some(url)
        } else {
            return Err(ConfigError(format!(
                "public_baseurl: {:?} must start with http:// or https://",
                self.public_baseurl
            )));
        };
        Ok(Settings {
            server_name,
            public_baseurl,
            data_dir: self.data_dir,
            database_url,
            sqlite_synchronous: self.sqlite_synchronous,
            signing_key_path,
            log: self.log,
            client_listen,
            registration: self.registration.mode,
            registration_tokens: self.registration.tokens,
            access_token_lifetime_ms: self.registration.access_token_lifetime_ms.max(1),
            max_request_body_bytes: self.limits.max_request_body_bytes,
            max_upload_bytes: self.limits.max_upload_bytes,
            header_read_timeout: std::time::Duration::from_secs(self.limits.header_read_timeout_secs),
            body_read_timeout: std::time::Duration::from_secs(self.limits.body_read_timeout_secs),
            rate_limits: self.rate_limits,
            trusted_proxies,
            history: self.history,
            presence_enabled: self.presence.enabled,
            voip: self.voip,
            media: self.media,
            outbound_ip_allow,
            url_preview_ip_allow,
            federation,
            federation_verify_tls: self.federation.verify_tls,
            federation_max_queued: i64::from(self.federation.max_queued_per_destination.max(1)),
        })
    }

    /// The federation listener: none when `listen.federation` is empty or
    /// federation is off; else its address and the certificate and key,
    /// read and checked now.
    fn federation_listener(&self) -> Result<Option<FederationListener>, ConfigError> {
        if self.listen.federation.is_empty() || !self.federation.enabled {
            return Ok(None);
        }
        let addr: SocketAddr = self.listen.federation.parse().map_err(|_| {
            ConfigError(format!(
                "listen.federation: {:?} is not an address:port such as 0.0.0.0:8448",
                self.listen.federation
            ))
        })?;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (cert_path, key_path) = (&self.tls.cert_path, &self.tls.key_path);
        if cert_path.is_empty() || key_path.is_empty() {
            return Err(ConfigError(
                "tls.cert_path, tls.key_path: listen.federation needs a certificate and a key".into(),
            ));
        }
        let chain = CertificateDer::pem_file_iter(cert_path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| ConfigError(format!("tls.cert_path: {cert_path}: {e}")))?;
        if chain.is_empty() {
            return Err(ConfigError(format!("tls.cert_path: {cert_path}: no certificate in the file")));
        }
        let key = PrivateKeyDer::from_pem_file(key_path)
            .map_err(|e| ConfigError(format!("tls.key_path: {key_path}: {e}")))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| ConfigError(format!("tls.cert_path, tls.key_path: {e}")))?;
        Ok(Some(FederationListener { addr, tls: std::sync::Arc::new(tls) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn example_file_is_the_defaults() {
        assert_eq!(Config::parse(EXAMPLE).unwrap(), Config::default());
    }

    #[test]
    fn defaults_validate_to_localhost() {
        let s = Config::load(None, no_env).unwrap().validate().unwrap();
        assert_eq!(s.server_name.as_str(), "localhost:8008");
        assert_eq!(s.client_listen.to_string(), "127.0.0.1:8008");
        assert_eq!(s.public_baseurl, None);
        assert_eq!(s.database_url, "sqlite://./data/seqline.db");
        assert_eq!(s.sqlite_synchronous, SqliteSynchronous::Full);
        assert_eq!(s.registration, RegistrationMode::Off);
    }

    #[test]
    fn env_overrides_file() {
        let env = |k: &str| match k {
            "SEQLINE_SERVER_NAME" => Some("example.org".to_owned()),
            "SEQLINE_LISTEN" => Some("127.0.0.1:9000".to_owned()),
            "SEQLINE_REGISTRATION" => Some("token".to_owned()),
            "SEQLINE_REGISTRATION_TOKENS" => Some("a, b".to_owned()),
            "SEQLINE_RATE_LIMITS" => Some("off".to_owned()),
            "SEQLINE_SQLITE_SYNCHRONOUS" => Some("normal".to_owned()),
            _ => None,
        };
        let s = Config::load(None, env).unwrap().validate().unwrap();
        assert_eq!(s.sqlite_synchronous, SqliteSynchronous::Normal);
        assert_eq!(s.server_name.as_str(), "example.org");
        assert_eq!(s.client_listen.port(), 9000);
        assert_eq!(s.registration_tokens, vec!["a", "b"]);
        assert!(!s.rate_limits.enabled);
        let env = |k: &str| match k {
            "SEQLINE_MAX_THUMBNAIL_PIXELS" => Some("1000".to_owned()),
            "SEQLINE_MAX_PENDING_MEDIA_UPLOADS" => Some("0".to_owned()),
            _ => None,
        };
        let s = Config::load(None, env).unwrap().validate().unwrap();
        assert_eq!(
            s.media,
            MediaConfig { max_thumbnail_pixels: 1000, max_pending_uploads: 0, ..MediaConfig::default() }
        );
        let env = |k: &str| (k == "SEQLINE_MAX_THUMBNAIL_PIXELS").then(|| "0".to_owned());
        let err = Config::load(None, env).unwrap().validate().unwrap_err();
        assert!(err.0.starts_with("media.max_thumbnail_pixels"), "{err}");
        let env =
            |k: &str| (k == "SEQLINE_OUTBOUND_IP_ALLOW").then(|| "127.0.0.0/8, ::1, 10.0.0.7".to_owned());
        let s = Config::load(None, env).unwrap().validate().unwrap();
        let ips: Vec<String> = s.outbound_ip_allow.iter().map(|n| n.to_string()).collect();
        assert_eq!(ips, ["127.0.0.0/8", "::1/128", "10.0.0.7/32"]);
    }

    #[test]
    fn federation_needs_a_readable_certificate_and_key() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        // No listener: no federation, whatever else is set.
        let s =
            Config::load(None, with(&[("SEQLINE_TLS_CERT", "/nonexistent")])).unwrap().validate().unwrap();
        assert!(s.federation.is_none() && s.federation_verify_tls);
        // A listener without a certificate, or with files that are not there or hold none.
        let err = Config::load(None, with(&[("SEQLINE_LISTEN_FEDERATION", "127.0.0.1:8448")]))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.0.starts_with("tls.cert_path, tls.key_path"), "{err}");
        let missing = &[
            ("SEQLINE_LISTEN_FEDERATION", "127.0.0.1:8448"),
            ("SEQLINE_TLS_CERT", "/nonexistent/cert.pem"),
            ("SEQLINE_TLS_KEY", "/nonexistent/key.pem"),
        ];
        let err = Config::load(None, with(missing)).unwrap().validate().unwrap_err();
        assert!(err.0.starts_with("tls.cert_path: /nonexistent/cert.pem") && !err.0.contains('\n'), "{err}");
        let not_pem = &[
            ("SEQLINE_LISTEN_FEDERATION", "127.0.0.1:8448"),
            ("SEQLINE_TLS_CERT", "Cargo.toml"),
            ("SEQLINE_TLS_KEY", "Cargo.toml"),
        ];
        let err = Config::load(None, with(not_pem)).unwrap().validate().unwrap_err();
        assert!(err.0.starts_with("tls.cert_path: Cargo.toml: no certificate"), "{err}");
        let bad_addr = &[("SEQLINE_LISTEN_FEDERATION", "8448")];
        let err = Config::load(None, with(bad_addr)).unwrap().validate().unwrap_err();
        assert!(err.0.starts_with("listen.federation"), "{err}");
        // Off: the listener is not opened, so its files are not read.
        let off = &[("SEQLINE_LISTEN_FEDERATION", "127.0.0.1:8448"), ("SEQLINE_FEDERATION", "off")];
        assert!(Config::load(None, with(off)).unwrap().validate().unwrap().federation.is_none());
        let no_verify = &[("SEQLINE_FEDERATION_VERIFY_TLS", "false")];
        assert!(!Config::load(None, with(no_verify)).unwrap().validate().unwrap().federation_verify_tls);
        let err = Config::load(None, with(&[("SEQLINE_FEDERATION", "maybe")])).unwrap_err();
        assert!(err.0.starts_with("SEQLINE_FEDERATION:"), "{err}");
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let err = Config::parse("nonsense = 1").unwrap_err();
        assert!(err.0.contains("nonsense"), "{err}");
        let err = Config::parse("[listen]\nclient = 5").unwrap_err();
        assert!(err.0.starts_with("line 2"), "{err}");
        let mut c = Config::default();
        c.listen.client = "nowhere".into();
        assert!(c.validate().unwrap_err().0.starts_with("listen.client"));
        let c = Config { server_name: "bad name!".into(), ..Config::default() };
        assert!(c.validate().unwrap_err().0.starts_with("server_name"));
        let mut c = Config::default();
        c.registration.mode = RegistrationMode::Token;
        assert!(c.validate().unwrap_err().0.starts_with("registration.tokens"));
        let env = |k: &str| (k == "SEQLINE_REGISTRATION").then(|| "maybe".to_owned());
        assert!(Config::load(None, env).unwrap_err().0.starts_with("SEQLINE_REGISTRATION"));
        let env = |k: &str| (k == "SEQLINE_SQLITE_SYNCHRONOUS").then(|| "off".to_owned());
        assert!(Config::load(None, env).unwrap_err().0.starts_with("SEQLINE_SQLITE_SYNCHRONOUS"));
        let env = |k: &str| (k == "SEQLINE_OUTBOUND_IP_ALLOW").then(|| "127.0.0.0/8, localhost".to_owned());
        let err = Config::load(None, env).unwrap().validate().unwrap_err();
        assert!(err.0.starts_with("outbound.ip_allow") && err.0.contains("localhost"), "{err}");
        let err = Config::parse("sqlite_synchronous = \"off\"").unwrap_err();
        assert!(err.0.starts_with("line 1"), "{err}");
    }

    #[test]
    fn rate_limits_and_trusted_proxies() {
        let env = |k: &str| (k == "SEQLINE_TRUSTED_PROXIES").then(|| "10.0.0.0/8, ::1 ,192.0.2.7".to_owned());
        let s = Config::load(None, env).unwrap().validate().unwrap();
        let nets: Vec<String> = s.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(nets, ["10.0.0.0/8", "::1/128", "192.0.2.7/32"]);
        let env = |k: &str| (k == "SEQLINE_TRUSTED_PROXIES").then(|| "10.0.0.0/8,proxy.local".to_owned());
        let err = Config::load(None, env).unwrap().validate().unwrap_err();
        assert!(err.0.starts_with("rate_limits.trusted_proxies") && err.0.contains("proxy.local"), "{err}");
        let c = Config::parse("[rate_limits]\nfailed_login_burst = 0").unwrap();
        assert!(c.validate().unwrap_err().0.starts_with("rate_limits.failed_login_burst"));
        let c = Config::parse("[rate_limits]\nmessage_per_second = -1.0").unwrap();
        assert!(c.validate().unwrap_err().0.starts_with("rate_limits.message_per_second"));
    }
}
