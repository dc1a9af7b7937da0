//! Where another server is reached: the server-server API's "Resolving server
//! names". [`Resolver::resolve`] turns a server name into a [`Destination`]:
//! the name the URL carries (and so the name the TLS certificate must be
//! valid for, sent as SNI unless it is an IP address), the port, the `Host`
//! header, and for an SRV answer the host actually connected to.
//!
//! 1. An IP literal: that address, with the name's port or 8448; `Host` = the
//!    server name.
//! 2. A host name with a port: that host and port; `Host` = the server name.
//! 3. Otherwise `https://<hostname>/.well-known/matrix/server` is asked
//!    ([`HttpWellKnown`]: redirects followed, at most [`MAX_REDIRECTS`], https
//!    only, never a URL twice). Its `m.server` is used as in 1–2 when it is an
//!    IP literal or carries a port, `Host` = the delegated name; a bare
//!    delegated host name goes through SRV as in 4, with the delegated name
//!    for `Host` and the certificate.
//! 4. No usable well-known: SRV `_matrix-fed._tcp.<hostname>`, then the
//!    deprecated `_matrix._tcp.<hostname>` (an SRV answer's target is
//!    connected to, the URL, certificate and `Host` keep the name looked up),
//!    else `<hostname>:8448`.
//!
//! Well-known answers are cached per host name ([`WellKnownCache`]): for what
//! the answer's `Cache-Control` max-age or `Expires` says, 24 hours when it
//! says nothing, within [`MIN_CACHE`]..=[`MAX_CACHE`]; no usable answer for
//! an hour. When a delegation we knew expires and the new ask fails for a
//! passing reason (no connection, a 5xx), the old delegation is kept for that
//! hour instead, once. SRV answers are cached by the DNS resolver (their TTL).
//!
//! The addresses are checked by the outbound client at connect time
//! (`outbound.ip_allow` and the refused ranges), SRV targets included.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use ruma::{OwnedServerName, ServerName};

use super::FederationError;
use crate::outbound::{Outbound, OutboundError};

/// The port of a server name that names none (and of an SRV-less host).
pub const DEFAULT_PORT: u16 = 8448;

/// How long a well-known answer is kept when its headers say nothing.
pub const DEFAULT_CACHE: Duration = Duration::from_secs(24 * 3600);

/// The longest a well-known answer is kept, whatever its headers say.
pub const MAX_CACHE: Duration = Duration::from_secs(48 * 3600);

/// The shortest a well-known answer is kept (`no-store`, `max-age=0`, a past
/// `Expires`): asking again on every request would put a round trip in front
/// of each.
pub const MIN_CACHE: Duration = Duration::from_secs(5 * 60);

/// How long "no usable well-known" is kept.
pub const ERROR_CACHE: Duration = Duration::from_secs(3600);

/// Host names whose well-known answer is kept at most.
pub const MAX_CACHED: usize = 10_000;

/// Redirects followed for one well-known ask.
pub const MAX_REDIRECTS: usize = 5;

/// Largest well-known body read (the object holds one short string).
const MAX_WELL_KNOWN_BYTES: usize = 64 * 1024;

/// The time limit of each well-known request (each redirect hop is one).
const WELL_KNOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how requests for one server are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The host the URL names: the name the certificate must be valid for
    /// (sent as SNI unless it is an IP literal). IPv6 in brackets.
    pub host: String,
    /// The port connected to.
    pub port: u16,
    /// The `Host` header.
    pub host_header: String,
    /// An SRV answer's target: the connection goes to its addresses, not to
    /// `host`'s.
    pub connect_to: Option<String>,
}

impl Destination {
    /// The base URL requests are built on.
    pub fn base_url(&self) -> String {
        format!("https://{}:{}", self.host, self.port)
    }
}

/// One SRV record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvRecord {
    /// Lower is tried first.
    pub priority: u16,
    /// Share among records of one priority.
    pub weight: u16,
    /// Port on the target.
    pub port: u16,
    /// Target host, without the trailing dot; "." means "no such service here".
    pub target: String,
}

/// SRV look-ups (DNS in production, a table in tests).
pub trait SrvLookup: Send + Sync + 'static {
    /// The SRV records of `name` (fully qualified, trailing dot); empty when
    /// there are none.
    fn lookup(&self, name: &str) -> impl Future<Output = Result<Vec<SrvRecord>, String>> + Send;
}

/// What asking for a well-known document gave.
#[derive(Debug, Clone)]
pub struct WellKnownResponse {
    /// The final status (after redirects).
    pub status: u16,
    /// Its headers (cache lifetime).
    pub headers: HeaderMap,
    /// Its body.
    pub body: Vec<u8>,
}

/// Why no well-known answer came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// No answer: connection, TLS, timeout, refused address. Passing, maybe.
    Transport(String),
    /// An answer that is none: redirect loop, too many redirects, a redirect
    /// off https, a body over the limit.
    Invalid(String),
}

/// Asks `https://<hostname>/.well-known/matrix/server`.
pub trait WellKnownFetch: Send + Sync + 'static {
    /// The answer for `hostname`.
    fn fetch(&self, hostname: &str) -> impl Future<Output = Result<WellKnownResponse, FetchError>> + Send;
}

/// Resolves server names; one per process (it holds the well-known cache).
#[derive(Debug)]
pub struct Resolver<W = HttpWellKnown, S = DnsSrv> {
    well_known: W,
    srv: S,
    cache: Mutex<WellKnownCache>,
}

impl Resolver {
    /// The production resolver: well-known through `outbound`, SRV through
    /// the system's DNS configuration.
    pub fn new(outbound: Outbound) -> Self {
        Self::with(HttpWellKnown::new(outbound), DnsSrv::from_system(), MAX_CACHED)
    }
}

impl<W: WellKnownFetch, S: SrvLookup> Resolver<W, S> {
    /// A resolver over these sources, keeping at most `cap` well-known answers.
    pub fn with(well_known: W, srv: S, cap: usize) -> Self {
        Self { well_known, srv, cache: Mutex::new(WellKnownCache::new(cap)) }
    }

    /// Where requests for `server` go.
    pub async fn resolve(&self, server: &ServerName) -> Result<Destination, FederationError> {
        self.resolve_at(server, Instant::now()).await
    }

    async fn resolve_at(&self, server: &ServerName, now: Instant) -> Result<Destination, FederationError> {
        if let Some(direct) = direct(server) {
            return Ok(direct);
        }
        let hostname = server.host();
        match self.delegation(hostname, now).await {
            Some(delegated) => match direct(&delegated) {
                Some(direct) => Ok(direct),
                None => self.through_srv(delegated.host()).await,
            },
            None => self.through_srv(hostname).await,
        }
    }

    /// The well-known delegation of `hostname`, from the cache or asked.
    async fn delegation(&self, hostname: &str, now: Instant) -> Option<OwnedServerName> {
        let key = hostname.to_ascii_lowercase();
        let previous = {
            let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match cache.get(&key) {
                Some(entry) if entry.expires > now => return entry.delegated.clone(),
                other => other.cloned(),
            }
        };
        let answer = self.well_known.fetch(hostname).await;
        let entry = entry_for(answer, previous, now, SystemTime::now(), hostname);
        let delegated = entry.delegated.clone();
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).put(key, entry, now);
        delegated
    }

    /// Steps 3.3–3.5 and 4–6: SRV for `host`, else `host`:8448.
    async fn through_srv(&self, host: &str) -> Result<Destination, FederationError> {
        for service in ["_matrix-fed._tcp", "_matrix._tcp"] {
            let name = format!("{service}.{}.", host.trim_end_matches('.'));
            let records = match self.srv.lookup(&name).await {
                Ok(records) => records,
                Err(e) => {
                    tracing::debug!("SRV {name}: {e}; taken as none");
                    continue;
                }
            };
            if records.is_empty() {
                continue;
            }
            let Some(record) = pick(&records, |total| rand::random_range(0..=total)) else {
                return Err(FederationError::NoService(host.to_owned()));
            };
            let connect_to = (!record.target.eq_ignore_ascii_case(host)).then(|| record.target.clone());
            return Ok(Destination {
                host: host.to_owned(),
                port: record.port,
                host_header: host.to_owned(),
                connect_to,
            });
        }
        Ok(Destination {
            host: host.to_owned(),
            port: DEFAULT_PORT,
            host_header: host.to_owned(),
            connect_to: None,
        })
    }

    /// How many well-known answers are cached.
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.lock().unwrap().entries.len()
    }
}

/// Steps 1 and 2: an IP literal, or a name with a port, is used as it is.
fn direct(name: &ServerName) -> Option<Destination> {
    (name.is_ip_literal() || name.port().is_some()).then(|| Destination {
        host: name.host().to_owned(),
        port: name.port().unwrap_or(DEFAULT_PORT),
        host_header: name.as_str().to_owned(),
        connect_to: None,
    })
}

/// The record to use (RFC 2782): the lowest priority, then by weight, with
/// `roll(total)` a uniform draw from `0..=total`. None when the only records
/// say "." (the service is not offered).
fn pick(records: &[SrvRecord], roll: impl FnOnce(u32) -> u32) -> Option<&SrvRecord> {
    let usable: Vec<&SrvRecord> =
        records.iter().filter(|r| r.target != "." && !r.target.is_empty()).collect();
    let lowest = usable.iter().map(|r| r.priority).min()?;
    // Zero weights first, so they win only a draw of 0.
    let mut group: Vec<&SrvRecord> = usable.into_iter().filter(|r| r.priority == lowest).collect();
    group.sort_by_key(|r| r.weight != 0);
    let total: u32 = group.iter().map(|r| u32::from(r.weight)).sum();
    if total == 0 {
        return group.first().copied();
    }
    let draw = roll(total);
    let mut running = 0;
    for record in &group {
        running += u32::from(record.weight);
        if running >= draw {
            return Some(record);
        }
    }
    group.last().copied()
}

/// The cache entry an ask for `hostname` leaves.
fn entry_for(
    answer: Result<WellKnownResponse, FetchError>,
    previous: Option<Entry>,
    now: Instant,
    wall: SystemTime,
    hostname: &str,
) -> Entry {
    let passing = match &answer {
        Ok(response) if response.status == 200 => match parse_well_known(&response.body) {
            Ok(delegated) => {
                let lifetime = cache_lifetime(&response.headers, wall);
                return Entry { delegated: Some(delegated), expires: now + lifetime, kept: false };
            }
            Err(why) => {
                tracing::debug!("{hostname}'s well-known is unusable: {why}");
                false
            }
        },
        Ok(response) => {
            tracing::debug!("{hostname}'s well-known answered {}", response.status);
            response.status >= 500
        }
        Err(FetchError::Invalid(why)) => {
            tracing::debug!("{hostname}'s well-known: {why}");
            false
        }
        Err(FetchError::Transport(why)) => {
            tracing::debug!("{hostname}'s well-known not reached: {why}");
            true
        }
    };
    match previous {
        Some(Entry { delegated: Some(delegated), kept: false, .. }) if passing => {
            Entry { delegated: Some(delegated), expires: now + ERROR_CACHE, kept: true }
        }
        _ => Entry { delegated: None, expires: now + ERROR_CACHE, kept: false },
    }
}

/// The `m.server` of a well-known body, or why there is none.
pub fn parse_well_known(body: &[u8]) -> Result<OwnedServerName, String> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let field = value.get("m.server").ok_or("no m.server")?;
    let name = field.as_str().ok_or("m.server is not a string")?;
    OwnedServerName::try_from(name).map_err(|e| format!("m.server {name:?}: {e}"))
}

/// How long an answer with these headers is kept: `Cache-Control: max-age`
/// (`no-store`/`no-cache`: nothing), else `Expires` less `Date` (or now),
/// else [`DEFAULT_CACHE`]; within [`MIN_CACHE`]..=[`MAX_CACHE`].
pub fn cache_lifetime(headers: &HeaderMap, now: SystemTime) -> Duration {
    declared_lifetime(headers, now).map_or(DEFAULT_CACHE, |d| d.clamp(MIN_CACHE, MAX_CACHE))
}

fn declared_lifetime(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let directives = headers
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    let mut max_age = None;
    for directive in directives {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(seconds) = lower.strip_prefix("max-age=") {
            max_age = seconds.trim_matches('"').parse::<u64>().ok().map(Duration::from_secs).or(max_age);
        }
    }
    if max_age.is_some() {
        return max_age;
    }
    let date = |name| headers.get(name).and_then(|v| v.to_str().ok()).map(httpdate::parse_http_date);
    match date(http::header::EXPIRES)? {
        // An Expires that does not parse means "already expired" (RFC 9111).
        Err(_) => Some(Duration::ZERO),
        Ok(expires) => {
            let base = match date(http::header::DATE) {
                Some(Ok(date)) => date,
                _ => now,
            };
            Some(expires.duration_since(base).unwrap_or(Duration::ZERO))
        }
    }
}

/// One host name's well-known outcome.
#[derive(Debug, Clone)]
struct Entry {
    /// The delegated server name, None for "no usable well-known".
    delegated: Option<OwnedServerName>,
    expires: Instant,
    /// A delegation kept past its lifetime because the new ask failed.
    kept: bool,
}

/// Well-known outcomes per host name, at most `cap` of them.
#[derive(Debug)]
pub struct WellKnownCache {
    entries: HashMap<String, Entry>,
    cap: usize,
}

impl WellKnownCache {
    fn new(cap: usize) -> Self {
        Self { entries: HashMap::new(), cap: cap.max(1) }
    }

    fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Stores `entry`; when full, expired entries go first, then those that
    /// expire soonest.
    fn put(&mut self, key: String, entry: Entry, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.cap {
            self.entries.retain(|_, e| e.expires > now);
            while self.entries.len() >= self.cap {
                let Some(soonest) =
                    self.entries.iter().min_by_key(|(_, e)| e.expires).map(|(k, _)| k.clone())
                else {
                    break;
                };
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, entry);
    }
}

/// The well-known document over HTTPS, through the outbound client's
/// federation side (its address policy and `federation.verify_tls`).
///
/// Redirects: the spec says to follow them and avoid loops. They are followed
/// here by hand, at most [`MAX_REDIRECTS`], each hop a new request through
/// the same checks (an IP-literal URL against the policy, a name by the
/// checking resolver); a hop that leaves the first URL's scheme (https) or
/// comes back to a URL already asked ends the ask as an unusable answer.
#[derive(Debug, Clone)]
pub struct HttpWellKnown {
    outbound: Outbound,
    /// Tests: `http://127.0.0.1:<port>` instead of `https://<hostname>`.
    origin: Option<String>,
}

impl HttpWellKnown {
    /// Asks through `outbound`.
    pub fn new(outbound: Outbound) -> Self {
        Self { outbound, origin: None }
    }

    /// Asks `origin` whatever the host name (tests against a local server).
    #[cfg(test)]
    fn at(outbound: Outbound, origin: &str) -> Self {
        Self { outbound, origin: Some(origin.to_owned()) }
    }
}

impl WellKnownFetch for HttpWellKnown {
    async fn fetch(&self, hostname: &str) -> Result<WellKnownResponse, FetchError> {
        let first = match &self.origin {
            Some(origin) => format!("{origin}/.well-known/matrix/server"),
            None => format!("https://{hostname}/.well-known/matrix/server"),
        };
        let mut url =
            reqwest::Url::parse(&first).map_err(|e| FetchError::Invalid(format!("{first}: {e}")))?;
        let mut asked = vec![url.clone()];
        loop {
            let response = self
                .outbound
                .federation_request(reqwest::Method::GET, url.as_str())
                .map_err(|e| FetchError::Transport(e.to_string()))?
                .timeout(WELL_KNOWN_TIMEOUT)
                .send()
                .await
                .map_err(|e| FetchError::Transport(OutboundError::from(e).to_string()))?;
            let status = response.status();
            if is_followed_redirect(status.as_u16()) {
                let location = response.headers().get(http::header::LOCATION).and_then(|v| v.to_str().ok());
                url = next_hop(&asked, location)?;
                asked.push(url.clone());
                continue;
            }
            let headers = response.headers().clone();
            let body =
                crate::outbound::read_capped(response, MAX_WELL_KNOWN_BYTES).await.map_err(|e| match e {
                    OutboundError::TooLarge(_) => FetchError::Invalid(e.to_string()),
                    other => FetchError::Transport(other.to_string()),
                })?;
            return Ok(WellKnownResponse { status: status.as_u16(), headers, body });
        }
    }
}

fn is_followed_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// Where a redirect from the last of `asked` leads, if it may be followed.
fn next_hop(asked: &[reqwest::Url], location: Option<&str>) -> Result<reqwest::Url, FetchError> {
    let (Some(first), Some(current)) = (asked.first(), asked.last()) else {
        return Err(FetchError::Invalid("no URL asked".to_owned()));
    };
    if asked.len() > MAX_REDIRECTS {
        return Err(FetchError::Invalid(format!("more than {MAX_REDIRECTS} redirects")));
    }
    let location = location.ok_or_else(|| FetchError::Invalid("redirect without Location".to_owned()))?;
    let next =
        current.join(location).map_err(|e| FetchError::Invalid(format!("redirect to {location:?}: {e}")))?;
    if next.scheme() != first.scheme() {
        return Err(FetchError::Invalid(format!("redirect off {} to {next}", first.scheme())));
    }
    if asked.contains(&next) {
        return Err(FetchError::Invalid(format!("redirect loop at {next}")));
    }
    Ok(next)
}

/// SRV through the system's DNS servers (hickory), cached for the records'
/// TTL. Without a readable system configuration there are no SRV answers.
#[derive(Debug)]
pub struct DnsSrv(Option<hickory_resolver::TokioResolver>);

impl DnsSrv {
    /// From `/etc/resolv.conf` (or the platform's equivalent).
    pub fn from_system() -> Self {
        match hickory_resolver::TokioResolver::builder_tokio().and_then(|builder| builder.build()) {
            Ok(resolver) => Self(Some(resolver)),
            Err(e) => {
                tracing::warn!(
                    "no DNS configuration for SRV look-ups ({e}): server names resolve without SRV"
                );
                Self(None)
            }
        }
    }
}

#[cfg(test)]
impl DnsSrv {
    /// Asking only the DNS server at `server` (UDP), with no cache between
    /// tests' servers.
    fn at(server: std::net::SocketAddr) -> Self {
        use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
        let mut udp = ConnectionConfig::udp();
        udp.port = server.port();
        let config =
            ResolverConfig::from_name_servers(vec![NameServerConfig::new(server.ip(), true, vec![udp])]);
        let provider = hickory_resolver::net::runtime::TokioRuntimeProvider::default();
        Self(Some(hickory_resolver::TokioResolver::builder_with_config(config, provider).build().unwrap()))
    }
}

impl SrvLookup for DnsSrv {
    async fn lookup(&self, name: &str) -> Result<Vec<SrvRecord>, String> {
        let Some(resolver) = &self.0 else { return Ok(Vec::new()) };
        match resolver.srv_lookup(name).await {
            Ok(lookup) => Ok(lookup
                .answers()
                .iter()
                .filter_map(|record| match &record.data {
                    hickory_resolver::proto::rr::RData::SRV(srv) => Some(SrvRecord {
                        priority: srv.priority,
                        weight: srv.weight,
                        port: srv.port,
                        target: if srv.target.is_root() {
                            ".".to_owned()
                        } else {
                            srv.target.to_ascii().trim_end_matches('.').to_owned()
                        },
                    }),
                    _ => None,
                })
                .collect()),
            Err(e) if e.is_no_records_found() => Ok(Vec::new()),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn name(s: &str) -> &ServerName {
        <&ServerName>::try_from(s).unwrap()
    }

    fn dest(host: &str, port: u16, host_header: &str, connect_to: Option<&str>) -> Destination {
        Destination {
            host: host.to_owned(),
            port,
            host_header: host_header.to_owned(),
            connect_to: connect_to.map(str::to_owned),
        }
    }

    /// Canned answers by name.
    type Table<T> = Arc<Mutex<HashMap<String, T>>>;

    /// Well-known answers by host name; counts the asks.
    #[derive(Default, Clone)]
    struct FakeWellKnown {
        answers: Table<Result<WellKnownResponse, FetchError>>,
        asked: Arc<Mutex<Vec<String>>>,
    }

    impl FakeWellKnown {
        fn set(&self, host: &str, answer: Result<WellKnownResponse, FetchError>) {
            self.answers.lock().unwrap().insert(host.to_owned(), answer);
        }
        fn delegate(&self, host: &str, to: &str, headers: &[(&str, &str)]) {
            self.set(host, Ok(response(200, headers, format!(r#"{{"m.server": "{to}"}}"#).as_bytes())));
        }
        fn asks(&self) -> usize {
            self.asked.lock().unwrap().len()
        }
    }

    impl WellKnownFetch for FakeWellKnown {
        async fn fetch(&self, hostname: &str) -> Result<WellKnownResponse, FetchError> {
            self.asked.lock().unwrap().push(hostname.to_owned());
            self.answers
                .lock()
                .unwrap()
                .get(hostname)
                .cloned()
                .unwrap_or_else(|| Ok(response(404, &[], b"{\"errcode\":\"M_NOT_FOUND\"}")))
        }
    }

    fn response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> WellKnownResponse {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        WellKnownResponse { status, headers: map, body: body.to_vec() }
    }

    /// SRV records by query name; records the queries.
    #[derive(Default, Clone)]
    struct FakeSrv {
        records: Table<Result<Vec<SrvRecord>, String>>,
        asked: Arc<Mutex<Vec<String>>>,
    }

    impl FakeSrv {
        fn set(&self, query: &str, records: &[Srv]) {
            let records = records
                .iter()
                .map(|&(priority, weight, port, target)| SrvRecord {
                    priority,
                    weight,
                    port,
                    target: target.to_owned(),
                })
                .collect();
            self.records.lock().unwrap().insert(query.to_owned(), Ok(records));
        }
        fn fail(&self, query: &str) {
            self.records.lock().unwrap().insert(query.to_owned(), Err("SERVFAIL".to_owned()));
        }
        fn queries(&self) -> Vec<String> {
            self.asked.lock().unwrap().clone()
        }
    }

    impl SrvLookup for FakeSrv {
        async fn lookup(&self, name: &str) -> Result<Vec<SrvRecord>, String> {
            self.asked.lock().unwrap().push(name.to_owned());
            self.records.lock().unwrap().get(name).cloned().unwrap_or_else(|| Ok(Vec::new()))
        }
    }

    fn resolver() -> (Resolver<FakeWellKnown, FakeSrv>, FakeWellKnown, FakeSrv) {
        let (w, s) = (FakeWellKnown::default(), FakeSrv::default());
        (Resolver::with(w.clone(), s.clone(), MAX_CACHED), w, s)
    }

    async fn resolve(r: &Resolver<FakeWellKnown, FakeSrv>, server: &str, now: Instant) -> Destination {
        r.resolve_at(name(server), now).await.unwrap()
    }

    /// SRV records as (priority, weight, port, target).
    type Srv = (u16, u16, u16, &'static str);

    /// A DNS server on loopback (UDP) answering SRV queries from `zone`
    /// (query name -> records), NXDOMAIN for any other name.
    async fn dns_server(zone: Vec<(&'static str, Vec<Srv>)>) -> std::net::SocketAddr {
        use hickory_resolver::proto::op::{Message, OpCode, ResponseCode};
        use hickory_resolver::proto::rr::{Name, RData, Record, rdata::SRV};
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else { return };
                let Ok(query) = Message::from_vec(&buf[..n]) else { continue };
                let mut answer = Message::response(query.metadata.id, OpCode::Query);
                answer.metadata.authoritative = true;
                answer.metadata.recursion_desired = query.metadata.recursion_desired;
                answer.metadata.recursion_available = true;
                let Some(question) = query.queries.first().cloned() else { continue };
                let asked = question.name().to_ascii();
                answer.add_query(question.clone());
                match zone.iter().find(|(name, _)| name.eq_ignore_ascii_case(&asked)) {
                    Some((_, records)) => {
                        for &(priority, weight, port, target) in records {
                            let target = Name::from_ascii(target).unwrap();
                            let srv = RData::SRV(SRV::new(priority, weight, port, target));
                            answer.add_answer(Record::from_rdata(question.name().clone(), 300, srv));
                        }
                    }
                    None => answer.metadata.response_code = ResponseCode::NXDomain,
                }
                let _ = socket.send_to(&answer.to_vec().unwrap(), from).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn srv_records_come_from_dns() {
        let dns = dns_server(vec![
            ("_matrix-fed._tcp.a.test.", vec![(10, 5, 8449, "fed.a.test."), (20, 0, 1, "late.a.test.")]),
            ("_matrix._tcp.b.test.", vec![(0, 0, 8000, "old.b.test.")]),
            ("_matrix-fed._tcp.dot.test.", vec![(0, 0, 0, ".")]),
        ])
        .await;
        let srv = DnsSrv::at(dns);
        let rec = |priority, weight, port, target: &str| SrvRecord {
            priority,
            weight,
            port,
            target: target.to_owned(),
        };
        assert_eq!(
            srv.lookup("_matrix-fed._tcp.a.test.").await.unwrap(),
            [rec(10, 5, 8449, "fed.a.test"), rec(20, 0, 1, "late.a.test")]
        );
        assert_eq!(srv.lookup("_matrix-fed._tcp.dot.test.").await.unwrap(), [rec(0, 0, 0, ".")]);
        assert_eq!(srv.lookup("_matrix-fed._tcp.none.test.").await.unwrap(), []);

        // The whole resolution over it (no well-known anywhere).
        let r = Resolver::with(FakeWellKnown::default(), srv, MAX_CACHED);
        let now = Instant::now();
        assert_eq!(
            r.resolve_at(name("a.test"), now).await.unwrap(),
            dest("a.test", 8449, "a.test", Some("fed.a.test"))
        );
        assert_eq!(
            r.resolve_at(name("b.test"), now).await.unwrap(),
            dest("b.test", 8000, "b.test", Some("old.b.test"))
        );
        assert_eq!(r.resolve_at(name("c.test"), now).await.unwrap(), dest("c.test", 8448, "c.test", None));
        assert!(matches!(r.resolve_at(name("dot.test"), now).await, Err(FederationError::NoService(_))));
    }

    #[tokio::test]
    async fn ip_literals_are_used_directly_with_the_server_name_as_host() {
        let (r, w, s) = resolver();
        let now = Instant::now();
        assert_eq!(resolve(&r, "1.2.3.4", now).await, dest("1.2.3.4", 8448, "1.2.3.4", None));
        assert_eq!(resolve(&r, "1.2.3.4:99", now).await, dest("1.2.3.4", 99, "1.2.3.4:99", None));
        assert_eq!(
            resolve(&r, "[2001:db8::1]", now).await,
            dest("[2001:db8::1]", 8448, "[2001:db8::1]", None)
        );
        assert_eq!(resolve(&r, "[::1]:8449", now).await, dest("[::1]", 8449, "[::1]:8449", None));
        assert_eq!(resolve(&r, "127.0.0.1:18612", now).await.base_url(), "https://127.0.0.1:18612");
        assert_eq!(resolve(&r, "[::1]:8449", now).await.base_url(), "https://[::1]:8449");
        assert_eq!((w.asks(), s.queries().len()), (0, 0), "no well-known, no SRV for an IP literal");
    }

    #[tokio::test]
    async fn host_names_with_a_port_are_used_directly() {
        let (r, w, s) = resolver();
        w.delegate("example.org", "elsewhere.example.net", &[]);
        let got = resolve(&r, "example.org:8000", Instant::now()).await;
        assert_eq!(got, dest("example.org", 8000, "example.org:8000", None));
        assert_eq!(got.base_url(), "https://example.org:8000");
        assert_eq!((w.asks(), s.queries().len()), (0, 0));
    }

    #[tokio::test]
    async fn a_delegation_to_an_ip_literal_or_a_name_with_a_port_is_used_directly() {
        let (r, w, s) = resolver();
        let now = Instant::now();
        w.delegate("a.example", "1.2.3.4", &[]);
        w.delegate("b.example", "1.2.3.4:90", &[]);
        w.delegate("c.example", "[2001:db8::2]:91", &[]);
        w.delegate("d.example", "matrix.d.example:443", &[]);
        assert_eq!(resolve(&r, "a.example", now).await, dest("1.2.3.4", 8448, "1.2.3.4", None));
        assert_eq!(resolve(&r, "b.example", now).await, dest("1.2.3.4", 90, "1.2.3.4:90", None));
        assert_eq!(resolve(&r, "c.example", now).await, dest("[2001:db8::2]", 91, "[2001:db8::2]:91", None));
        assert_eq!(
            resolve(&r, "d.example", now).await,
            dest("matrix.d.example", 443, "matrix.d.example:443", None)
        );
        assert_eq!(w.asks(), 4);
        assert!(
            s.queries().is_empty(),
            "no SRV once the delegation names an IP or a port: {:?}",
            s.queries()
        );
    }

    #[tokio::test]
    async fn a_bare_delegated_name_goes_through_srv_of_the_delegated_name() {
        let (r, w, s) = resolver();
        let now = Instant::now();
        w.delegate("example.org", "matrix.example.org", &[]);
        s.set("_matrix-fed._tcp.matrix.example.org.", &[(10, 0, 8449, "fed1.example.net")]);
        s.set("_matrix-fed._tcp.example.org.", &[(10, 0, 1, "wrong.example.net")]);
        assert_eq!(
            resolve(&r, "example.org", now).await,
            dest("matrix.example.org", 8449, "matrix.example.org", Some("fed1.example.net")),
            "connect to the SRV target; URL, certificate and Host are the delegated name"
        );
        assert_eq!(s.queries(), ["_matrix-fed._tcp.matrix.example.org."]);
    }

    #[tokio::test]
    async fn a_bare_delegated_name_falls_back_to_the_deprecated_srv_then_8448() {
        let (r, w, s) = resolver();
        let now = Instant::now();
        w.delegate("example.org", "matrix.example.org", &[]);
        s.set("_matrix._tcp.matrix.example.org.", &[(0, 0, 8450, "old.example.net")]);
        assert_eq!(
            resolve(&r, "example.org", now).await,
            dest("matrix.example.org", 8450, "matrix.example.org", Some("old.example.net"))
        );
        assert_eq!(s.queries(), ["_matrix-fed._tcp.matrix.example.org.", "_matrix._tcp.matrix.example.org."]);

        w.delegate("example.com", "matrix.example.com", &[]);
        assert_eq!(
            resolve(&r, "example.com", now).await,
            dest("matrix.example.com", 8448, "matrix.example.com", None)
        );
    }

    #[tokio::test]
    async fn without_a_well_known_srv_of_the_server_name_then_8448() {
        let (r, w, s) = resolver();
        let now = Instant::now();
        s.set("_matrix-fed._tcp.a.example.", &[(0, 0, 443, "fed.a.example")]);
        s.set("_matrix._tcp.a.example.", &[(0, 0, 1, "wrong.example")]);
        s.set("_matrix._tcp.b.example.", &[(0, 0, 8000, "old.b.example")]);
        assert_eq!(
            resolve(&r, "a.example", now).await,
            dest("a.example", 443, "a.example", Some("fed.a.example"))
        );
        assert_eq!(
            resolve(&r, "b.example", now).await,
            dest("b.example", 8000, "b.example", Some("old.b.example"))
        );
        assert_eq!(resolve(&r, "c.example", now).await, dest("c.example", 8448, "c.example", None));
        assert_eq!(w.asked.lock().unwrap().clone(), ["a.example", "b.example", "c.example"]);
        assert_eq!(
            s.queries(),
            [
                "_matrix-fed._tcp.a.example.",
                "_matrix-fed._tcp.b.example.",
                "_matrix._tcp.b.example.",
                "_matrix-fed._tcp.c.example.",
                "_matrix._tcp.c.example.",
            ]
        );
    }

    #[tokio::test]
    async fn srv_targets_naming_the_host_itself_connect_by_that_name_and_failures_count_as_none() {
        let (r, _w, s) = resolver();
        let now = Instant::now();
        s.set("_matrix-fed._tcp.a.example.", &[(0, 0, 443, "A.example")]);
        assert_eq!(resolve(&r, "a.example", now).await, dest("a.example", 443, "a.example", None));
        s.fail("_matrix-fed._tcp.b.example.");
        s.set("_matrix._tcp.b.example.", &[(0, 0, 8000, "old.b.example")]);
        assert_eq!(
            resolve(&r, "b.example", now).await,
            dest("b.example", 8000, "b.example", Some("old.b.example"))
        );
    }

    #[tokio::test]
    async fn an_srv_answer_of_dot_means_no_federation_there() {
        let (r, _w, s) = resolver();
        s.set("_matrix-fed._tcp.a.example.", &[(0, 0, 0, ".")]);
        let got = r.resolve_at(name("a.example"), Instant::now()).await;
        assert!(matches!(got, Err(FederationError::NoService(ref h)) if h == "a.example"), "{got:?}");
        assert_eq!(s.queries(), ["_matrix-fed._tcp.a.example."], "the deprecated record is not asked then");
    }

    #[test]
    fn srv_records_are_picked_by_priority_then_weight() {
        let rec = |priority, weight, target: &str| SrvRecord {
            priority,
            weight,
            port: 1,
            target: target.to_owned(),
        };
        let records = [rec(20, 100, "late"), rec(10, 0, "zero"), rec(10, 30, "w30"), rec(10, 70, "w70")];
        let pick_with = |draw: u32| {
            pick(&records, |total| {
                assert_eq!(total, 100, "only the lowest priority's weights count");
                draw
            })
            .unwrap()
            .target
            .clone()
        };
        assert_eq!(pick_with(0), "zero", "weight 0 wins only a draw of 0");
        assert_eq!(pick_with(1), "w30");
        assert_eq!(pick_with(30), "w30");
        assert_eq!(pick_with(31), "w70");
        assert_eq!(pick_with(100), "w70");
        let all_zero = [rec(5, 0, "first"), rec(5, 0, "second")];
        assert_eq!(pick(&all_zero, |_| panic!("no draw without weights")).unwrap().target, "first");
        let dots = [rec(0, 0, "."), rec(1, 0, "fallback")];
        assert_eq!(pick(&dots, |t| t).unwrap().target, "fallback", "a \".\" record among others is skipped");
        assert!(pick(&[rec(0, 0, ".")], |t| t).is_none());
    }

    #[tokio::test]
    async fn unusable_well_known_answers_count_as_none_for_an_hour() {
        for (what, answer) in [
            ("not JSON", Ok(response(200, &[], b"<html>hello</html>"))),
            ("not an object", Ok(response(200, &[], b"[\"m.server\"]"))),
            ("no m.server", Ok(response(200, &[], b"{\"m.homeserver\": \"x.example\"}"))),
            ("m.server not a string", Ok(response(200, &[], b"{\"m.server\": 8448}"))),
            ("a URL", Ok(response(200, &[], b"{\"m.server\": \"https://x.example\"}"))),
            ("a space", Ok(response(200, &[], b"{\"m.server\": \"x example\"}"))),
            ("a port too large", Ok(response(200, &[], b"{\"m.server\": \"x.example:65536\"}"))),
            ("empty", Ok(response(200, &[], b"{\"m.server\": \"\"}"))),
            ("status 404", Ok(response(404, &[], b"{\"m.server\": \"x.example\"}"))),
            (
                "status 500",
                Ok(response(500, &[("cache-control", "max-age=86400")], b"{\"m.server\": \"x.example\"}")),
            ),
            ("redirect loop", Err(FetchError::Invalid("redirect loop".to_owned()))),
            ("unreachable", Err(FetchError::Transport("connection refused".to_owned()))),
        ] {
            let (r, w, s) = resolver();
            let t0 = Instant::now();
            w.set("example.org", answer);
            s.set("_matrix-fed._tcp.example.org.", &[(0, 0, 8443, "fed.example.org")]);
            let want = dest("example.org", 8443, "example.org", Some("fed.example.org"));
            assert_eq!(resolve(&r, "example.org", t0).await, want, "{what}: SRV of the server name");
            assert_eq!(resolve(&r, "example.org", t0 + ERROR_CACHE - Duration::from_secs(1)).await, want);
            assert_eq!(w.asks(), 1, "{what}: remembered for an hour");
            w.delegate("example.org", "1.2.3.4", &[]);
            assert_eq!(
                resolve(&r, "example.org", t0 + ERROR_CACHE).await,
                dest("1.2.3.4", 8448, "1.2.3.4", None)
            );
            assert_eq!(w.asks(), 2, "{what}: asked again after the hour");
        }
    }

    #[test]
    fn well_known_bodies_parse_to_a_server_name() {
        assert_eq!(
            parse_well_known(br#"{"m.server": "matrix.example.org:443"}"#).unwrap(),
            "matrix.example.org:443"
        );
        assert_eq!(parse_well_known(br#"{"m.server": "[::1]", "other": 1}"#).unwrap(), "[::1]");
        for bad in [&b""[..], b"null", b"{}", br#"{"m.server": null}"#, br#"{"m.server": "a/b"}"#] {
            assert!(parse_well_known(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// How long a delegation with these headers is used before asking again.
    async fn kept_for(headers: &[(&str, &str)]) -> Duration {
        let (r, w, _s) = resolver();
        let t0 = Instant::now();
        w.delegate("example.org", "1.2.3.4", headers);
        resolve(&r, "example.org", t0).await;
        // Probe the expiry without asking: the entry's instant is what we test.
        let expires = r.cache.lock().unwrap().get("example.org").unwrap().expires;
        let lifetime = expires - t0;
        // And it holds: no ask just before, an ask at the instant.
        resolve(&r, "example.org", t0 + lifetime - Duration::from_secs(1)).await;
        assert_eq!(w.asks(), 1);
        resolve(&r, "example.org", t0 + lifetime).await;
        assert_eq!(w.asks(), 2);
        lifetime
    }

    #[tokio::test]
    async fn well_known_answers_are_kept_as_their_headers_say_within_bounds() {
        let hour = Duration::from_secs(3600);
        assert_eq!(kept_for(&[]).await, 24 * hour, "no headers: 24 h");
        assert_eq!(kept_for(&[("cache-control", "public, max-age=7200")]).await, 2 * hour);
        assert_eq!(kept_for(&[("Cache-Control", "Max-Age=36000")]).await, 10 * hour, "case-insensitive");
        assert_eq!(kept_for(&[("cache-control", "max-age=1000000")]).await, 48 * hour, "clamped to 48 h");
        assert_eq!(kept_for(&[("cache-control", "max-age=0")]).await, MIN_CACHE);
        assert_eq!(kept_for(&[("cache-control", "no-store")]).await, MIN_CACHE);
        assert_eq!(
            kept_for(&[("cache-control", "max-age=7200"), ("expires", "Thu, 01 Jan 2099 00:00:00 GMT")])
                .await,
            2 * hour,
            "max-age wins over Expires"
        );
        assert_eq!(
            kept_for(&[
                ("date", "Mon, 02 Mar 2026 10:00:00 GMT"),
                ("expires", "Mon, 02 Mar 2026 13:00:00 GMT")
            ])
            .await,
            3 * hour,
            "Expires less Date"
        );
        assert_eq!(kept_for(&[("expires", "0")]).await, MIN_CACHE, "a bad Expires is expired");
        assert_eq!(
            kept_for(&[("cache-control", "max-age=oops")]).await,
            24 * hour,
            "a bad max-age is ignored"
        );
    }

    #[test]
    fn expires_without_date_counts_from_now() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut headers = HeaderMap::new();
        let expires = httpdate::fmt_http_date(now + Duration::from_secs(5 * 3600));
        headers.insert(http::header::EXPIRES, expires.parse().unwrap());
        assert_eq!(cache_lifetime(&headers, now), Duration::from_secs(5 * 3600));
        assert_eq!(cache_lifetime(&headers, now + Duration::from_secs(6 * 3600)), MIN_CACHE);
    }

    #[tokio::test]
    async fn a_known_delegation_survives_one_passing_failure() {
        let (r, w, _s) = resolver();
        let t0 = Instant::now();
        let day = DEFAULT_CACHE;
        w.delegate("example.org", "matrix.example.org:443", &[]);
        let delegated = dest("matrix.example.org", 443, "matrix.example.org:443", None);
        assert_eq!(resolve(&r, "example.org", t0).await, delegated);

        w.set("example.org", Err(FetchError::Transport("timed out".to_owned())));
        assert_eq!(resolve(&r, "example.org", t0 + day).await, delegated, "kept after a failed refresh");
        assert_eq!(
            resolve(&r, "example.org", t0 + day + ERROR_CACHE - Duration::from_secs(1)).await,
            delegated
        );
        assert_eq!(w.asks(), 2, "for the error hour");
        assert_eq!(
            resolve(&r, "example.org", t0 + day + ERROR_CACHE).await,
            dest("example.org", 8448, "example.org", None),
            "not twice"
        );
        assert_eq!(w.asks(), 3);

        // A definite answer ends a delegation at once.
        let (r, w, _s) = resolver();
        w.delegate("example.org", "matrix.example.org:443", &[]);
        resolve(&r, "example.org", t0).await;
        w.set("example.org", Ok(response(404, &[], b"")));
        assert_eq!(
            resolve(&r, "example.org", t0 + day).await,
            dest("example.org", 8448, "example.org", None)
        );
    }

    #[tokio::test]
    async fn the_cache_is_bounded_and_drops_what_expires_first() {
        let (w, s) = (FakeWellKnown::default(), FakeSrv::default());
        let r = Resolver::with(w.clone(), s, 3);
        let t0 = Instant::now();
        for (i, age) in [(1, 3600 * 5), (2, 3600), (3, 3600 * 3)] {
            w.delegate(&format!("h{i}.example"), "1.2.3.4", &[("cache-control", &format!("max-age={age}"))]);
            resolve(&r, &format!("h{i}.example"), t0).await;
        }
        assert_eq!(r.cached(), 3);
        w.delegate("h4.example", "1.2.3.4", &[]);
        resolve(&r, "h4.example", t0).await;
        assert_eq!(r.cached(), 3);
        assert!(r.cache.lock().unwrap().get("h2.example").is_none(), "the soonest to expire went");
        // Past h3's expiry, a new name first drops what has expired.
        w.delegate("h5.example", "1.2.3.4", &[]);
        resolve(&r, "h5.example", t0 + Duration::from_secs(3600 * 4)).await;
        let cache = r.cache.lock().unwrap();
        let mut keys: Vec<&String> = cache.entries.keys().collect();
        keys.sort();
        assert_eq!(keys, ["h1.example", "h4.example", "h5.example"]);
    }

    #[tokio::test]
    async fn cache_keys_ignore_case() {
        let (r, w, _s) = resolver();
        let t0 = Instant::now();
        w.delegate("Example.org", "1.2.3.4", &[]);
        resolve(&r, "Example.org", t0).await;
        assert_eq!(resolve(&r, "example.ORG", t0).await, dest("1.2.3.4", 8448, "1.2.3.4", None));
        assert_eq!(w.asks(), 1);
    }

    #[test]
    fn redirects_stay_on_https_and_never_loop() {
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let start = vec![url("https://a.example/.well-known/matrix/server")];
        assert_eq!(next_hop(&start, Some("/elsewhere")).unwrap(), url("https://a.example/elsewhere"));
        assert_eq!(
            next_hop(&start, Some("https://b.example/.well-known/matrix/server")).unwrap(),
            url("https://b.example/.well-known/matrix/server")
        );
        for (location, why) in [
            (Some("http://a.example/.well-known/matrix/server"), "off https"),
            (Some("/.well-known/matrix/server"), "loop"),
            (None, "without Location"),
        ] {
            let got = next_hop(&start, location);
            assert!(matches!(&got, Err(FetchError::Invalid(m)) if m.contains(why)), "{location:?}: {got:?}");
        }
        let long: Vec<_> = (0..=MAX_REDIRECTS).map(|i| url(&format!("https://a.example/{i}"))).collect();
        assert!(
            matches!(next_hop(&long, Some("/next")), Err(FetchError::Invalid(m)) if m.contains("redirects"))
        );
    }

    /// A plain HTTP server answering each path with a canned reply; counts
    /// the requests.
    async fn canned_server(replies: Vec<(&'static str, String)>) -> (String, Arc<Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).into_owned();
                let path = text.split_whitespace().nth(1).unwrap_or("").to_owned();
                log.lock().unwrap().push(path.clone());
                let reply = replies
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, r)| r.clone())
                    .unwrap_or_else(|| "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned());
                let _ = socket.write_all(reply.as_bytes()).await;
                let _ = socket.shutdown().await;
            }
        });
        (origin, seen)
    }

    fn reply(status: &str, headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: {}\r\n{headers}\r\n{body}",
            body.len()
        )
    }

    fn loopback_outbound() -> Outbound {
        Outbound::new(vec!["127.0.0.0/8".parse().unwrap()]).unwrap()
    }

    #[tokio::test]
    async fn the_http_fetch_follows_redirects_and_keeps_the_final_headers() {
        let (origin, seen) = canned_server(vec![
            ("/.well-known/matrix/server", reply("301 Moved", "location: /hop1\r\n", "")),
            ("/hop1", reply("307 Temporary Redirect", "location: /final\r\n", "")),
            ("/final", reply("200 OK", "cache-control: max-age=600\r\n", r#"{"m.server": "m.example:443"}"#)),
        ])
        .await;
        let fetcher = HttpWellKnown::at(loopback_outbound(), &origin);
        let got = fetcher.fetch("ignored.example").await.unwrap();
        assert_eq!(got.status, 200);
        assert_eq!(parse_well_known(&got.body).unwrap(), "m.example:443");
        assert_eq!(cache_lifetime(&got.headers, SystemTime::now()), Duration::from_secs(600));
        assert_eq!(*seen.lock().unwrap(), ["/.well-known/matrix/server", "/hop1", "/final"]);
    }

    #[tokio::test]
    async fn the_http_fetch_stops_at_loops_big_bodies_and_refused_addresses() {
        let (origin, seen) = canned_server(vec![
            ("/.well-known/matrix/server", reply("302 Found", "location: /again\r\n", "")),
            ("/again", reply("302 Found", "location: /.well-known/matrix/server\r\n", "")),
        ])
        .await;
        let got = HttpWellKnown::at(loopback_outbound(), &origin).fetch("x").await;
        assert!(matches!(&got, Err(FetchError::Invalid(m)) if m.contains("loop")), "{got:?}");
        assert_eq!(seen.lock().unwrap().len(), 2);

        let big = format!(r#"{{"m.server": "a.example", "pad": "{}"}}"#, "x".repeat(MAX_WELL_KNOWN_BYTES));
        let (origin, _) =
            canned_server(vec![("/.well-known/matrix/server", reply("200 OK", "", &big))]).await;
        let got = HttpWellKnown::at(loopback_outbound(), &origin).fetch("x").await;
        assert!(matches!(&got, Err(FetchError::Invalid(m)) if m.contains("bytes")), "{got:?}");

        // Loopback is refused unless allowed: never connected.
        let (origin, seen) =
            canned_server(vec![("/.well-known/matrix/server", reply("200 OK", "", "{}"))]).await;
        let got = HttpWellKnown::at(Outbound::new(Vec::new()).unwrap(), &origin).fetch("x").await;
        assert!(matches!(&got, Err(FetchError::Transport(m)) if m.contains("not allowed")), "{got:?}");
        assert!(seen.lock().unwrap().is_empty());
        // And a real host name's well-known is asked on 443 of that name,
        // through the checking resolver: localhost is loopback, refused.
        let got = HttpWellKnown::new(Outbound::new(Vec::new()).unwrap()).fetch("localhost").await;
        assert!(matches!(&got, Err(FetchError::Transport(m)) if m.contains("not allowed")), "{got:?}");
    }
}
