//! The `/metrics` listener: `GET`/`HEAD /metrics` answers the snapshot its source builds,
//! in the format the scraper's `Accept` asks for; `/health/live` and `/health/ready` answer
//! 200 or 503 from what the source knows (for Kubernetes probes: they are answered by the
//! master, never by whichever worker a connection to the serving port lands on). The master runs it on a thread of its own
//! (a single-threaded runtime beside the supervisor loop, which it never blocks); the
//! development-mode worker runs it on its event loop. Snapshots are built on a blocking
//! thread: they may read NVML and `/proc`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::exposition::{encode, Format, Snapshot};

/// What the listener answers from.
pub trait Source: Send + Sync + 'static {
    /// What a scrape shows.
    fn snapshot(&self) -> Snapshot;
    /// `Ok(detail)` while the process behind the port does its work (the master's loop
    /// runs); `Err(why)` otherwise.
    fn live(&self) -> Result<String, String>;
    /// `Ok(detail)` when a request to the serving port would be answered now (a worker is
    /// ready and the server is not stopping); `Err(why)` otherwise.
    fn ready(&self) -> Result<String, String>;
}

pub type SharedSource = Arc<dyn Source>;

/// How long a scraper may take to send its request head.
const HEADER_READ: Duration = Duration::from_secs(10);

/// `/metrics` behind token auth (`--metrics-api-key-file`): the keys, and the refusals so
/// far by reason. The file is looked at (its modification time, size and inode) at every
/// scrape and read again when it changed, so a changed file counts at the next scrape; a
/// file that no longer loads (emptied, half-written, a FIFO) is logged once per change and
/// the last good keys stay, so a scraper with a valid key is never locked out by a bad
/// write.
#[derive(Default)]
pub struct MetricsAuth {
    pub key_file: Option<std::path::PathBuf>,
    keys: std::sync::Mutex<Option<(Option<crate::files::Stamp>, crate::auth::ApiKeys)>>,
    refused: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl MetricsAuth {
    /// `keys`: the file's keys as the configuration accepted them (`crate::secrets`);
    /// `None` reads the file at the first scrape.
    pub fn new(
        key_file: Option<std::path::PathBuf>,
        keys: Option<crate::auth::ApiKeys>,
    ) -> MetricsAuth {
        MetricsAuth {
            keys: std::sync::Mutex::new(
                keys.map(|k| (key_file.as_deref().and_then(crate::files::stamp), k)),
            ),
            key_file,
            refused: Default::default(),
        }
    }

    /// The keys to check against: the file's when it changed and loads, else the last good.
    fn keys(&self, path: &std::path::Path) -> Option<crate::auth::ApiKeys> {
        let stamp = crate::files::stamp(path);
        let mut held = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_none_or(|(s, _)| *s != stamp) {
            match crate::auth::ApiKeys::load(path) {
                Ok(k) => {
                    if held.is_some() {
                        tracing::info!("metrics: the key file changed; scrapes use its keys now");
                    }
                    *held = Some((stamp, k));
                }
                Err(e) => {
                    tracing::error!("metrics: {e}; keeping the keys read before");
                    if let Some(h) = held.as_mut() {
                        h.0 = stamp;
                    }
                }
            }
        }
        held.as_ref().map(|(_, k)| k.clone())
    }

    /// `Err(answer)` when the scrape may not see the metrics.
    #[allow(clippy::result_large_err)]
    fn check(&self, req: &Request<Incoming>) -> Result<(), Response<Full<Bytes>>> {
        let Some(path) = &self.key_file else {
            return Ok(());
        };
        let keys = self.keys(path).ok_or_else(|| {
            plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the metrics key file cannot be read (see the server's log)".into(),
            )
        })?;
        let given = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        keys.check(given).map_err(|f| {
            *self
                .refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(format!("metrics/{}", f.reason()))
                .or_default() += 1;
            let mut r = plain(StatusCode::UNAUTHORIZED, f.message().into());
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static(f.challenge()));
            r
        })
    }
}

/// Serves scrapes on `listener` until the runtime is dropped, with `/metrics` behind `auth`,
/// over TLS when `tls` is given (the handshake under the same deadline as a request head).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    source: SharedSource,
    auth: Arc<MetricsAuth>,
    tls: Option<Arc<crate::tls::Reloading>>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let source = source.clone();
        let auth = auth.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let Some(tls) = tls else {
                return serve_connection(stream, source, auth).await;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
            match tokio::time::timeout(HEADER_READ, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, source, auth).await,
                Ok(Err(e)) => tracing::debug!("metrics: TLS handshake failed: {e}"),
                Err(_) => tracing::debug!("metrics: TLS handshake not complete in time"),
            }
        });
    }
}

async fn serve_connection<S>(stream: S, source: SharedSource, auth: Arc<MetricsAuth>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| answer(req, source.clone(), auth.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ)
        .serve_connection(TokioIo::new(stream), svc);
    if let Err(e) = conn.await {
        tracing::debug!("metrics connection ended: {e}");
    }
}

/// Runs [`serve_with`] on a thread of its own (the master's way).
pub fn spawn_thread(
    listener: std::net::TcpListener,
    source: SharedSource,
    auth: MetricsAuth,
    tls: Option<Arc<crate::tls::Reloading>>,
) -> std::io::Result<()> {
    let auth = Arc::new(auth);
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("vf-metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve_with(l, source, auth, tls).await,
                    Err(e) => tracing::error!("metrics listener: {e}"),
                }
            })
        })?;
    Ok(())
}

fn plain(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    json(status, serde_json::json!({ "error": msg }))
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

async fn answer(
    req: Request<Incoming>,
    source: SharedSource,
    auth: Arc<MetricsAuth>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    if !matches!(path, "/metrics" | "/health/live" | "/health/ready") {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            format!(
                "{} {path}: not found; this port serves GET /metrics, /health/live and /health/ready",
                req.method()
            ),
        ));
    }
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} {path}: method not allowed (GET, HEAD)", req.method()),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    if path != "/metrics" {
        let check = if path == "/health/live" {
            source.live()
        } else {
            source.ready()
        };
        return Ok(match check {
            Ok(detail) => json(
                StatusCode::OK,
                serde_json::json!({"status": "ok", "detail": detail}),
            ),
            Err(why) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"status": "unavailable", "error": why}),
            ),
        });
    }
    if let Err(refused) = auth.check(&req) {
        return Ok(refused);
    }
    let format = Format::from_accept(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
    let text = tokio::task::spawn_blocking(move || {
        let mut snap = source.snapshot();
        let refused = auth
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (k, n) in refused {
            *snap.traffic.auth_failures.entry(k).or_default() += n;
        }
        encode(&snap, format)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    Ok(match text {
        Ok(text) => {
            let body = if head {
                Bytes::new()
            } else {
                Bytes::from(text)
            };
            let mut r = Response::new(Full::new(body));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            r
        }
        Err(e) => {
            tracing::error!("metrics: cannot encode: {e}");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the metrics: {e}"),
            )
        }
    })
}
