//! Starting and stopping the server: load settings, open the database, load
//! or generate the signing key, serve until SIGINT/SIGTERM, then let in-flight
//! requests finish and close the database cleanly.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::signing_key;
use crate::state::AppState;
use crate::storage::Db;

/// Opens everything the server needs, in start-up order.
pub async fn open(settings: Settings) -> Result<AppState> {
    std::fs::create_dir_all(&settings.data_dir).map_err(|e| {
        Error::Internal(format!("data_dir {}: cannot create: {e}", settings.data_dir.display()))
    })?;
    let key = signing_key::load_or_generate(&settings.signing_key_path).map_err(Error::Internal)?;
    let db = Db::connect(&settings.database_url, settings.sqlite_synchronous).await?;
    let last_stream = crate::storage::account_data::max_stream(&db).await?;
    let pusher_users = crate::storage::account_data::pusher_users(&db).await?.into_iter().collect();
    let outbound = crate::outbound::Outbound::new(settings.outbound_ip_allow.clone())
        .and_then(|o| {
            if settings.federation_verify_tls { Ok(o) } else { o.accepting_any_federation_certificate() }
        })
        .map_err(|e| {
            Error::Internal(format!("outbound HTTP client: {e} (HTTPS needs the system's CA certificates)"))
        })?;
    let erased = crate::storage::users::erased(&db).await?;
    let state = AppState::new(settings, db, key, last_stream, pusher_users, outbound);
    state.erased.write().unwrap_or_else(|e| e.into_inner()).extend(erased);
    Ok(state)
}

/// Binds the listener, opens the server and serves the client API until a
/// shutdown signal arrives.
pub async fn run(mut settings: Settings) -> Result<()> {
    let addr = settings.client_listen;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Internal(format!("listen.client {addr}: cannot listen: {e}")))?;
    let local = listener.local_addr().map_err(|e| Error::Internal(e.to_string()))?;
    settings.public_baseurl.get_or_insert_with(|| format!("http://{local}/"));
    // Bound before the client listener is announced: once that line is out, both accept.
    let federation = match settings.federation.clone() {
        Some(fed) => {
            let listener = TcpListener::bind(fed.addr).await.map_err(|e| {
                Error::Internal(format!("listen.federation {}: cannot listen: {e}", fed.addr))
            })?;
            let local = listener.local_addr().map_err(|e| Error::Internal(e.to_string()))?;
            Some((listener, local, tokio_rustls::TlsAcceptor::from(fed.tls)))
        }
        None => None,
    };
    let state = open(settings).await?;
    if let Some((_, local, _)) = &federation {
        tracing::info!("federation listening on https://{local}");
        crate::federation::sender::resume(&state).await;
    }
    tracing::info!(
        server_name = %state.settings.server_name,
        key_id = %state.signing_key.key_id(),
        "seqline is listening on http://{local}"
    );
    let sweeper = tokio::spawn(expire_typing_every_second(state.clone()));
    let media_sweeper = tokio::spawn(expire_media_hourly(state.clone()));
    let app = crate::api::router(state.clone());
    let timeout = state.settings.header_read_timeout;
    match federation {
        Some((fed_listener, _, acceptor)) => {
            let fed_app = crate::api::federation::router(state.clone());
            tokio::join!(
                serve(listener, app, timeout, None),
                serve(fed_listener, fed_app, timeout, Some(acceptor))
            );
        }
        None => serve(listener, app, timeout, None).await,
    }
    sweeper.abort();
    media_sweeper.abort();
    tracing::info!("shutting down: requests finished, closing the database");
    state.db.close().await;
    Ok(())
}

/// Accepts connections and serves each over HTTP/1.1 until a shutdown signal,
/// then waits for the requests in flight. A client that does not finish
/// sending a request's headers within `header_read_timeout` (a new
/// connection's first request included) has its connection closed. With
/// `tls`, each connection first completes a TLS handshake, within the same
/// timeout.
async fn serve(
    listener: TcpListener,
    app: axum::Router,
    header_read_timeout: std::time::Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_read_timeout).keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors, say: wait a little instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = tower::ServiceExt::map_request(
            app.clone(),
            move |mut req: http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(axum::extract::ConnectInfo::<SocketAddr>(remote));
                req
            },
        );
        let service = hyper_util::service::TowerToHyperService::new(service);
        match &tls {
            None => {
                let connection =
                    graceful.watch(http.serve_connection(hyper_util::rt::TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(%remote, "connection ended: {e}");
                    }
                });
            }
            Some(acceptor) => {
                let (acceptor, http, watcher) = (acceptor.clone(), http.clone(), graceful.watcher());
                tokio::spawn(async move {
                    let stream =
                        match tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(e)) => return tracing::debug!(%remote, "TLS handshake failed: {e}"),
                            Err(_) => return tracing::debug!(%remote, "TLS handshake timed out"),
                        };
                    let connection =
                        watcher.watch(http.serve_connection(hyper_util::rt::TokioIo::new(stream), service));
                    if let Err(e) = connection.await {
                        tracing::debug!(%remote, "connection ended: {e}");
                    }
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for ctrl-c: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// Media with an expiry (URL previews' images) is deleted once it passed:
/// at start-up, then every hour.
async fn expire_media_hourly(state: AppState) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        tick.tick().await;
        match crate::media::expire(&state, crate::storage::now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "expired media deleted"),
            Err(e) => tracing::warn!("media expiry failed: {e}"),
        }
    }
}

/// Typing notices end by themselves; this makes their end reach /sync.
async fn expire_typing_every_second(state: AppState) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        if let Err(e) = crate::sync::writes::expire_typing(&state).await {
            tracing::warn!("typing expiry failed: {e}");
        }
    }
}
