//! Every HTTP request seqline makes to another host (push gateways,
//! federation) goes through [`Outbound`]: HTTPS with certificate
//! verification (rustls on ring, the platform's trust store), no redirects,
//! no proxies, and no connection to an address in a refused range (loopback,
//! private, link-local, CGNAT, documentation, multicast, ...) unless the
//! operator allows it with `outbound.ip_allow`.
//!
//! The address check holds at connect time: names are resolved by
//! [`CheckedResolver`], which drops refused addresses (a name that resolves
//! only to refused ones fails), and a URL naming an IP address directly is
//! checked before the request is built, since no resolver sees it.
//!
//! A federation request whose destination came from an SRV record goes to
//! the record's target while the URL (and so SNI, the certificate check and
//! the pool key) keeps the name being resolved: those go through a client of
//! their own whose resolver looks up the target recorded for the URL's host
//! ([`SrvRoutes`]), under the same address policy.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Why an outbound request was not made or its answer not read.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// The URL is not an http(s) URL with a host.
    #[error("not an http(s) URL with a host: {0}")]
    BadUrl(String),
    /// The destination address lies in a refused range.
    #[error("{0}: address not allowed for outbound requests")]
    Refused(String),
    /// The answer is longer than the caller accepts.
    #[error("reply over {0} bytes")]
    TooLarge(usize),
    /// The client cannot be built (no CA certificates on the system, say).
    #[error("{0}")]
    Setup(String),
    /// Connecting, TLS, or HTTP failed (a refused name also ends here).
    #[error("{}", with_causes(.0))]
    Http(#[from] reqwest::Error),
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

#[allow(clippy::too_many_arguments)]
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16, f: u16, g: u16, h: u16, len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len)
}

/// IPv4 ranges refused by default: Synapse's `ip_range_blacklist` defaults,
/// plus "this network" and the reserved 240/4 (with the broadcast address).
const REFUSED_V4: &[Ipv4Net] = &[
    v4(127, 0, 0, 0, 8),    // loopback
    v4(10, 0, 0, 0, 8),     // private
    v4(172, 16, 0, 0, 12),  // private
    v4(192, 168, 0, 0, 16), // private
    v4(100, 64, 0, 0, 10),  // carrier-grade NAT
    v4(192, 0, 0, 0, 24),   // IETF protocol assignments
    v4(169, 254, 0, 0, 16), // link-local (cloud metadata services)
    v4(192, 88, 99, 0, 24), // former 6to4 relay anycast
    v4(198, 18, 0, 0, 15),  // benchmarking
    v4(192, 0, 2, 0, 24),   // documentation
    v4(198, 51, 100, 0, 24),
    v4(203, 0, 113, 0, 24),
    v4(224, 0, 0, 0, 4), // multicast
    v4(0, 0, 0, 0, 8),   // "this network"
    v4(240, 0, 0, 0, 4), // reserved, broadcast
];

/// IPv6 ranges refused by default. IPv6 forms that carry an IPv4 address
/// (mapped, compatible, 6to4, NAT64) are also judged by that address.
const REFUSED_V6: &[Ipv6Net] = &[
    v6(0, 0, 0, 0, 0, 0, 0, 1, 128),         // loopback
    v6(0, 0, 0, 0, 0, 0, 0, 0, 128),         // unspecified
    v6(0xfe80, 0, 0, 0, 0, 0, 0, 0, 10),     // link-local
    v6(0xfc00, 0, 0, 0, 0, 0, 0, 0, 7),      // unique local
    v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0, 32), // documentation
    v6(0xff00, 0, 0, 0, 0, 0, 0, 0, 8),      // multicast
    v6(0xfec0, 0, 0, 0, 0, 0, 0, 0, 10),     // site-local (deprecated)
];

/// Which destination addresses outbound requests may connect to.
#[derive(Debug, Clone, Default)]
pub struct IpPolicy {
    allow: Vec<IpNet>,
}

impl IpPolicy {
    /// The default refusals, less what `allow` names.
    pub fn new(allow: Vec<IpNet>) -> Self {
        Self { allow }
    }

    /// Whether a connection to `ip` may be made: allowed explicitly, or in
    /// no refused range.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let embedded = embedded_v4(ip).map(IpAddr::V4);
        let allowed = |a: IpAddr| self.allow.iter().any(|net| net.contains(&a));
        if allowed(ip) || embedded.is_some_and(allowed) {
            return true;
        }
        !refused(ip) && !embedded.is_some_and(refused)
    }
}

fn refused(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => REFUSED_V4.iter().any(|net| net.contains(&a)),
        IpAddr::V6(a) => REFUSED_V6.iter().any(|net| net.contains(&a)),
    }
}

/// The IPv4 address an IPv6 address stands for: IPv4-mapped (::ffff:a.b.c.d),
/// IPv4-compatible (::a.b.c.d), 6to4 (2002:AABB:CCDD::/48) and the NAT64
/// well-known prefix (64:ff9b::a.b.c.d).
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(a) = ip else { return None };
    let s = a.segments();
    let from = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0, 0, hi, lo] => Some(from(hi, lo)),
        [0x2002, hi, lo, ..] => Some(from(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(from(hi, lo)),
        _ => None,
    }
}

/// Host names routed to an SRV target: the URL's host (what the
/// certificate is checked against) -> the host actually connected to.
#[derive(Debug, Default)]
pub struct SrvRoutes {
    targets: Mutex<HashMap<String, String>>,
}

/// Routes remembered at most (one per SRV-delegating host in use); past it
/// an arbitrary other one is forgotten (recorded again on its next request).
const MAX_SRV_ROUTES: usize = 10_000;

impl SrvRoutes {
    fn set(&self, host: &str, target: &str) {
        let mut targets = self.targets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if targets.get(host).is_some_and(|t| t == target) {
            return;
        }
        if !targets.contains_key(host)
            && targets.len() >= MAX_SRV_ROUTES
            && let Some(other) = targets.keys().next().cloned()
        {
            targets.remove(&other);
        }
        targets.insert(host.to_owned(), target.to_owned());
    }

    fn target(&self, host: &str) -> Option<String> {
        self.targets.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(host).cloned()
    }
}

/// A DNS resolver that keeps only the addresses the policy permits. With
/// `routes`, a name is resolved as its SRV target (a name without one is
/// refused: that client serves SRV routes only).
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    policy: Arc<IpPolicy>,
    routes: Option<Arc<SrvRoutes>>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let asked = name.as_str().to_owned();
        let host = match &self.routes {
            None => Some(asked.clone()),
            Some(routes) => routes.target(&asked),
        };
        Box::pin(async move {
            let host = host.ok_or_else(|| {
                Box::new(OutboundError::BadUrl(format!("no SRV target recorded for {asked}")))
                    as Box<dyn std::error::Error + Send + Sync>
            })?;
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let permitted: Vec<SocketAddr> = resolved.filter(|a| policy.permits(a.ip())).collect();
            if permitted.is_empty() {
                return Err(
                    Box::new(OutboundError::Refused(host)) as Box<dyn std::error::Error + Send + Sync>
                );
            }
            Ok(Box::new(permitted.into_iter()) as Addrs)
        })
    }
}

/// The outbound HTTP client. The inner client is private: nothing reaches
/// another host without the URL check of [`Outbound::request`].
#[derive(Debug, Clone)]
pub struct Outbound {
    client: reqwest::Client,
    /// For other homeservers: the same, except that with
    /// `federation.verify_tls = false` it accepts any certificate.
    federation: reqwest::Client,
    /// For other homeservers reached through an SRV record: as `federation`,
    /// connecting to the target recorded in `srv_routes` for the URL's host.
    federation_srv: reqwest::Client,
    srv_routes: Arc<SrvRoutes>,
    policy: Arc<IpPolicy>,
}

impl Outbound {
    /// Builds the client; `allow` lists ranges exempt from the refusals.
    pub fn new(allow: Vec<IpNet>) -> Result<Self, OutboundError> {
        // reqwest's rustls needs a process-wide provider; another caller may
        // have installed the same one first, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let policy = Arc::new(IpPolicy::new(allow));
        let srv_routes = Arc::new(SrvRoutes::default());
        let client = Self::build(&policy, None, false)?;
        let federation = client.clone();
        let federation_srv = Self::build(&policy, Some(&srv_routes), false)?;
        Ok(Self { client, federation, federation_srv, srv_routes, policy })
    }

    /// Makes requests to other homeservers accept any certificate
    /// (`federation.verify_tls = false`: self-signed peers in tests).
    pub fn accepting_any_federation_certificate(mut self) -> Result<Self, OutboundError> {
        self.federation = Self::build(&self.policy, None, true)?;
        self.federation_srv = Self::build(&self.policy, Some(&self.srv_routes), true)?;
        Ok(self)
    }

    fn build(
        policy: &Arc<IpPolicy>,
        routes: Option<&Arc<SrvRoutes>>,
        accept_any_certificate: bool,
    ) -> Result<reqwest::Client, OutboundError> {
        reqwest::Client::builder()
            .dns_resolver(CheckedResolver { policy: policy.clone(), routes: routes.cloned() })
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .user_agent(concat!("seqline/", env!("CARGO_PKG_VERSION")))
            .tls_danger_accept_invalid_certs(accept_any_certificate)
            .build()
            .map_err(|e| OutboundError::Setup(with_causes(&e)))
    }

    /// A request to `url` (http or https), refused when the URL names an IP
    /// address that is not permitted.
    pub fn request(
        &self,
        method: reqwest::Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, OutboundError> {
        Ok(self.client.request(method, self.checked_url(url)?))
    }

    /// A request to another homeserver; checked like [`Outbound::request`].
    pub fn federation_request(
        &self,
        method: reqwest::Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, OutboundError> {
        self.federation_request_via(method, url, None)
    }

    /// A request to another homeserver that, with `connect_to`, connects to
    /// that host (an SRV target) instead of the URL's, whose name the TLS
    /// certificate must still match. The target's addresses are checked by
    /// the same policy when the connection is made.
    pub fn federation_request_via(
        &self,
        method: reqwest::Method,
        url: &str,
        connect_to: Option<&str>,
    ) -> Result<reqwest::RequestBuilder, OutboundError> {
        let url = self.checked_url(url)?;
        let Some(target) = connect_to else { return Ok(self.federation.request(method, url)) };
        // An IP-literal URL is never resolved, so it could not be routed.
        let host = url.domain().ok_or_else(|| OutboundError::BadUrl(url.to_string()))?;
        self.srv_routes.set(host, target);
        Ok(self.federation_srv.request(method, url))
    }

    /// `url` parsed: http(s) with a host, not an IP address the policy refuses.
    fn checked_url(&self, url: &str) -> Result<reqwest::Url, OutboundError> {
        let parsed = reqwest::Url::parse(url).map_err(|_| OutboundError::BadUrl(url.to_owned()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(OutboundError::BadUrl(url.to_owned()));
        }
        let host = parsed.host_str().ok_or_else(|| OutboundError::BadUrl(url.to_owned()))?;
        let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(ip) = literal.parse::<IpAddr>()
            && !self.policy.permits(ip)
        {
            return Err(OutboundError::Refused(host.to_owned()));
        }
        Ok(parsed)
    }

    /// A POST to `url`; see [`Outbound::request`].
    pub fn post(&self, url: &str) -> Result<reqwest::RequestBuilder, OutboundError> {
        self.request(reqwest::Method::POST, url)
    }
}

/// An error with the errors that caused it, outermost first.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Reads a response body of at most `max` bytes; a longer one (by its
/// Content-Length or as it arrives) is abandoned at the limit.
pub async fn read_capped(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, OutboundError> {
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(OutboundError::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > max {
            return Err(OutboundError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_ranges_are_refused_by_default() {
        let policy = IpPolicy::default();
        for bad in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "2001:db8::1",
            "ff02::1",
            "fec0::1",
            // IPv4 in IPv6 clothing.
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "2002:7f00:1::1",
            "2002:c0a8:101::",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!policy.permits(ip(bad)), "{bad} must be refused");
        }
        for good in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.169.0.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "2002:808:808::1",
        ] {
            assert!(policy.permits(ip(good)), "{good} must be permitted");
        }
    }

    #[test]
    fn allowed_ranges_override_the_refusals_and_nothing_else() {
        let allow = vec!["127.0.0.0/8".parse().unwrap(), "fd00:1::/32".parse().unwrap()];
        let policy = IpPolicy::new(allow);
        assert!(policy.permits(ip("127.0.0.1")));
        assert!(policy.permits(ip("::ffff:127.0.0.1")), "the mapped form follows its IPv4 address");
        assert!(policy.permits(ip("fd00:1::5")));
        assert!(!policy.permits(ip("fd00:2::5")));
        assert!(!policy.permits(ip("10.0.0.1")));
        assert!(!policy.permits(ip("::1")), "IPv6 loopback is not in 127.0.0.0/8");
        assert!(policy.permits(ip("8.8.8.8")));
    }

    #[tokio::test]
    async fn literal_addresses_and_bad_urls_are_refused_before_any_request() {
        let outbound = Outbound::new(Vec::new()).unwrap();
        for url in [
            "http://127.0.0.1:8080/_matrix/push/v1/notify",
            "http://[::1]/x",
            "https://[::ffff:7f00:1]/x",
            "http://2130706433/x",
            "http://0x7f.1/x",
            "http://169.254.169.254/latest/meta-data",
        ] {
            assert!(matches!(outbound.post(url), Err(OutboundError::Refused(_))), "{url}");
        }
        for url in ["ftp://example.org/x", "file:///etc/passwd", "not a url", "mailto:a@example.org"] {
            assert!(matches!(outbound.post(url), Err(OutboundError::BadUrl(_))), "{url}");
        }
        assert!(outbound.post("https://push.example.org/_matrix/push/v1/notify").is_ok());
    }

    #[tokio::test]
    async fn names_resolving_to_refused_addresses_fail() {
        let resolver = CheckedResolver { policy: Arc::new(IpPolicy::default()), routes: None };
        let name: Name = "localhost".parse().unwrap();
        assert!(resolver.resolve(name).await.is_err(), "localhost resolves to loopback only");
        let allowing = CheckedResolver {
            policy: Arc::new(IpPolicy::new(vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()])),
            routes: None,
        };
        let name: Name = "localhost".parse().unwrap();
        let addrs: Vec<SocketAddr> = allowing.resolve(name).await.unwrap().collect();
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }

    fn loopback() -> Outbound {
        Outbound::new(vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]).unwrap()
    }

    #[tokio::test]
    async fn srv_routed_requests_connect_to_the_target_and_keep_the_host_header() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before the headers ended");
                request.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await
                .unwrap();
            String::from_utf8(request).unwrap()
        });
        // The URL names a host that does not exist; its recorded target is
        // localhost, where the listener is.
        let url = format!("http://delegated.invalid:{port}/_matrix/federation/v1/version");
        let response = loopback()
            .federation_request_via(reqwest::Method::GET, &url, Some("localhost"))
            .unwrap()
            .header(reqwest::header::HOST, "delegated.invalid")
            .send()
            .await
            .unwrap();
        assert_eq!(response.text().await.unwrap(), "ok");
        let request = server.await.unwrap().to_ascii_lowercase();
        assert!(request.starts_with("get /_matrix/federation/v1/version http/1.1\r\n"), "{request}");
        let hosts: Vec<&str> = request.lines().filter(|l| l.starts_with("host:")).collect();
        assert_eq!(hosts, ["host: delegated.invalid"], "exactly our Host header: {request}");
    }

    #[tokio::test]
    async fn srv_routed_tls_names_the_delegated_host_not_the_target() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), socket);
            let start = acceptor.await.unwrap();
            // No certificate to offer: the handshake ends here, the client fails.
            start.client_hello().server_name().map(str::to_owned)
        });
        let url = format!("https://matrix.delegated.invalid:{port}/_matrix/key/v2/server");
        let sent = loopback()
            .federation_request_via(reqwest::Method::GET, &url, Some("127.0.0.1"))
            .unwrap()
            .send()
            .await;
        assert!(sent.is_err());
        // A guard, not a wait: the client has already given up by now.
        let hello = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("no connection reached the target");
        assert_eq!(
            hello.unwrap().as_deref(),
            Some("matrix.delegated.invalid"),
            "SNI (and so the certificate check) is for the delegated name"
        );
    }

    #[tokio::test]
    async fn srv_targets_are_held_to_the_address_policy() {
        let outbound = Outbound::new(Vec::new()).unwrap();
        let url = "https://delegated.invalid:8448/_matrix/key/v2/server";
        for target in ["localhost", "127.0.0.1", "::1"] {
            let sent = outbound
                .federation_request_via(reqwest::Method::GET, url, Some(target))
                .unwrap()
                .send()
                .await;
            let error = OutboundError::from(sent.unwrap_err()).to_string();
            assert!(error.contains("address not allowed"), "{target}: {error}");
        }
        // An IP-literal URL cannot be routed (nothing resolves it).
        let routed =
            outbound.federation_request_via(reqwest::Method::GET, "https://8.8.8.8/x", Some("a.example"));
        assert!(matches!(routed, Err(OutboundError::BadUrl(_))));
        // The routing client refuses names it has no route for.
        let resolver = CheckedResolver {
            policy: Arc::new(IpPolicy::default()),
            routes: Some(Arc::new(SrvRoutes::default())),
        };
        assert!(resolver.resolve("example.org".parse().unwrap()).await.is_err());
    }
}
