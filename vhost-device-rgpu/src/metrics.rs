//! The Prometheus endpoint of the parent process: `http://LISTEN/metrics`
//! answers each tenant's use in the Prometheus text format (version 0.0.4).
//!
//! Every scrape asks a [`MetricsSource`] for one [`TenantSample`] per
//! tenant and builds a fresh registry from them: the numbers live in the
//! daemon's shared pages already, so nothing here keeps state that could
//! drift from them, and a tenant that is removed simply stops appearing.
//!
//! The server is HTTP/1 on a single-threaded tokio runtime, on a thread of
//! its own: the parent is otherwise synchronous, and a scrape is cheap
//! (a few atomics read, a few hundred bytes written).

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use log::{debug, info, warn};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rgpu_session::Counters;

use crate::tenants::Tenants;

/// One tenant's numbers at one moment (the registry's, re-exported here for
/// sources that are not the registry).
pub use crate::tenants::TenantSample;

/// What the endpoint reports: every tenant's sample, taken at scrape time.
pub trait MetricsSource: Send + Sync {
    fn samples(&self) -> Vec<TenantSample>;
}

/// The daemon's tenants: one sample per tenant it serves.
impl MetricsSource for Tenants {
    fn samples(&self) -> Vec<TenantSample> {
        Tenants::samples(self)
    }
}

/// Any closure that returns samples is a source (tests, a single tenant).
impl<F> MetricsSource for F
where
    F: Fn() -> Vec<TenantSample> + Send + Sync,
{
    fn samples(&self) -> Vec<TenantSample> {
        self()
    }
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen for metrics on {listen}: {source}")]
    Bind {
        listen: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the metrics server: {0}")]
    Start(std::io::Error),
}

/// The path the endpoint answers; every other path is a 404.
pub const METRICS_PATH: &str = "/metrics";

/// Connections served at once; more are closed at once. Scrapers need one
/// or two: this only bounds what a misbehaving client can hold.
const MAX_CONNECTIONS: usize = 32;
/// A client must send its request headers within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection (one request: no keep-alive) is closed after this time
/// whatever it is doing, so a client that stops reading holds nothing.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

type TenantLabel = [(&'static str, String); 1];
type GaugeFamily = Family<TenantLabel, Gauge<u64, AtomicU64>>;
type CounterFamily = Family<TenantLabel, Counter<u64, AtomicU64>>;
type SecondsFamily = Family<TenantLabel, Counter<f64, AtomicU64>>;

/// `samples` in the Prometheus text format (version 0.0.4), every series
/// labelled `tenant="NAME"`.
pub fn render(samples: &[TenantSample]) -> Result<String, std::fmt::Error> {
    let memory = GaugeFamily::default();
    let memory_limit = GaugeFamily::default();
    let sessions = GaugeFamily::default();
    let workers = GaugeFamily::default();
    let connections = GaugeFamily::default();
    let commands = CounterFamily::default();
    let command_errors = CounterFamily::default();
    let compute_weight = GaugeFamily::default();
    let gpu_busy = SecondsFamily::default();
    for sample in samples {
        let tenant: TenantLabel = [("tenant", sample.name.clone())];
        let counters = &sample.counters;
        memory.get_or_create(&tenant).set(sample.memory_used);
        // A tenant without a limit has no series: Prometheus has no
        // integer "infinite", and an absent series reads plainly as "none"
        // (`rgpu_tenant_device_memory_limit_bytes` joined on `tenant`).
        if let Some(limit) = sample.memory_limit {
            memory_limit.get_or_create(&tenant).set(limit);
        }
        sessions
            .get_or_create(&tenant)
            .set(Counters::get(&counters.sessions_active));
        workers
            .get_or_create(&tenant)
            .set(Counters::get(&counters.workers_active));
        connections
            .get_or_create(&tenant)
            .set(Counters::get(&counters.connections_active));
        commands
            .get_or_create(&tenant)
            .inc_by(Counters::get(&counters.commands_executed));
        command_errors
            .get_or_create(&tenant)
            .inc_by(Counters::get(&counters.command_errors));
        compute_weight
            .get_or_create(&tenant)
            .set(u64::from(sample.compute_weight));
        gpu_busy
            .get_or_create(&tenant)
            .inc_by(sample.gpu_busy_seconds);
    }

    let mut registry = Registry::default();
    registry.register(
        "rgpu_tenant_device_memory_bytes",
        "Device memory the tenant's guests hold now, in bytes",
        memory,
    );
    registry.register(
        "rgpu_tenant_device_memory_limit_bytes",
        "Device memory the tenant's guests may hold, in bytes (no series: no limit)",
        memory_limit,
    );
    registry.register(
        "rgpu_tenant_sessions",
        "Guest CUDA contexts of the tenant alive now",
        sessions,
    );
    registry.register(
        "rgpu_tenant_workers",
        "Worker processes (one per guest process using the GPU) of the tenant alive now",
        workers,
    );
    registry.register(
        "rgpu_tenant_connections",
        "vhost-user connections (VMs or local processes) of the tenant served now",
        connections,
    );
    // prometheus-client appends `_total` to counters' names.
    registry.register(
        "rgpu_tenant_commands",
        "Commands the tenant's guests have executed since the tenant was started",
        commands,
    );
    registry.register(
        "rgpu_tenant_command_errors",
        "Commands of the tenant's guests that failed (error replies and sticky asynchronous errors)",
        command_errors,
    );
    registry.register(
        "rgpu_tenant_compute_weight",
        "The tenant's share of contended GPU time, relative to the other tenants' weights",
        compute_weight,
    );
    registry.register(
        "rgpu_tenant_gpu_busy_seconds",
        "GPU time of the tenant's work (from submission until its fence completed), in seconds",
        gpu_busy,
    );
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

/// The running endpoint. Dropping it stops the server and joins its thread.
pub struct MetricsServer {
    local_addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl MetricsServer {
    /// The address bound (the real port when `listen` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // The thread may have ended already; then there is no one to tell.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                warn!("the metrics thread panicked");
            }
        }
    }
}

/// Serves `http://LISTEN/metrics` from a thread of its own until the
/// returned server is dropped. The socket is bound before this returns, so
/// a bad or busy address is reported here, at start-up.
pub fn serve(
    listen: SocketAddr,
    source: Arc<dyn MetricsSource>,
) -> Result<MetricsServer, MetricsError> {
    let bind_error = |source| MetricsError::Bind { listen, source };
    let listener = TcpListener::bind(listen).map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(MetricsError::Start)?;
    let (shutdown, shutdown_requested) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("rgpu-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                // Entered the runtime: the listener can join its reactor.
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(e) => {
                        warn!("metrics endpoint stopped: {e}");
                        return;
                    }
                };
                tokio::spawn(accept_loop(listener, source));
                // Sender dropped or fired alike: stop. Dropping the runtime
                // then cancels the accept loop and every connection.
                let _ = shutdown_requested.await;
            });
        })
        .map_err(MetricsError::Start)?;
    info!("metrics on http://{local_addr}{METRICS_PATH}");
    Ok(MetricsServer {
        local_addr,
        shutdown: Some(shutdown),
        thread: Some(thread),
    })
}

async fn accept_loop(listener: tokio::net::TcpListener, source: Arc<dyn MetricsSource>) {
    let open_connections = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: pause rather than spin.
                warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if open_connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open_connections.fetch_sub(1, Ordering::AcqRel);
            debug!("metrics endpoint: {peer} refused, {MAX_CONNECTIONS} connections open");
            continue;
        }
        let source = Arc::clone(&source);
        let open = Arc::clone(&open_connections);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = answer(&request, source.as_ref());
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!("metrics endpoint: {peer}: {e}"),
                Err(_) => debug!("metrics endpoint: {peer}: closed after {CONNECTION_TIMEOUT:?}"),
            }
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// The response to one request: the metrics for `GET /metrics` (and
/// `HEAD`), an error status for anything else.
fn answer(request: &Request<Incoming>, source: &dyn MetricsSource) -> Response<String> {
    if request.uri().path() != METRICS_PATH {
        return plain(StatusCode::NOT_FOUND, format!("try {METRICS_PATH}\n"));
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, String::new());
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match render(&source.samples()) {
        Ok(text) => {
            let mut response = Response::new(text);
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(prometheus_text::CONTENT_TYPE),
            );
            response
        }
        Err(e) => {
            warn!("metrics endpoint: cannot render the metrics: {e}");
            plain(StatusCode::INTERNAL_SERVER_ERROR, String::new())
        }
    }
}

fn plain(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn sample(name: &str, memory_used: u64, memory_limit: Option<u64>) -> TenantSample {
        let counters = Counters::default();
        Counters::add(&counters.sessions_active, 2);
        Counters::add(&counters.workers_active, 1);
        Counters::add(&counters.connections_active, 3);
        Counters::add(&counters.commands_executed, 12345);
        Counters::add(&counters.command_errors, 7);
        TenantSample {
            name: name.into(),
            counters,
            memory_used,
            memory_limit,
            compute_weight: 100,
            compute_max: None,
            priority: "normal",
            gpu_busy_seconds: 1.5,
        }
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn every_series_is_labelled_with_its_tenant() {
        let text = render(&[
            sample("vm-a", 268_435_456, Some(1 << 30)),
            sample("say \"hi\"\\", 0, None),
        ])
        .expect("render");
        let lines = lines(&text);
        for expected in [
            "# TYPE rgpu_tenant_device_memory_bytes gauge",
            "rgpu_tenant_device_memory_bytes{tenant=\"vm-a\"} 268435456",
            "rgpu_tenant_device_memory_limit_bytes{tenant=\"vm-a\"} 1073741824",
            "rgpu_tenant_sessions{tenant=\"vm-a\"} 2",
            "rgpu_tenant_workers{tenant=\"vm-a\"} 1",
            "rgpu_tenant_connections{tenant=\"vm-a\"} 3",
            "# TYPE rgpu_tenant_commands_total counter",
            "rgpu_tenant_commands_total{tenant=\"vm-a\"} 12345",
            "# TYPE rgpu_tenant_command_errors_total counter",
            "rgpu_tenant_command_errors_total{tenant=\"vm-a\"} 7",
            "rgpu_tenant_compute_weight{tenant=\"vm-a\"} 100",
            "# TYPE rgpu_tenant_gpu_busy_seconds_total counter",
            "rgpu_tenant_gpu_busy_seconds_total{tenant=\"vm-a\"} 1.5",
            // Label values are escaped as the format asks.
            "rgpu_tenant_device_memory_bytes{tenant=\"say \\\"hi\\\"\\\\\"} 0",
        ] {
            assert!(lines.contains(&expected), "{expected:?} missing:\n{text}");
        }
        // No limit, no series.
        let limits: Vec<_> = lines
            .iter()
            .filter(|l| l.starts_with("rgpu_tenant_device_memory_limit_bytes{"))
            .collect();
        assert_eq!(limits.len(), 1, "{text}");
    }

    #[test]
    fn no_tenants_renders_no_samples() {
        let text = render(&[]).expect("render");
        assert!(
            text.lines().all(|l| l.starts_with('#')),
            "samples without tenants:\n{text}"
        );
    }

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        stream.write_all(request.as_bytes()).expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
    }

    #[test]
    fn serves_metrics_over_http_and_stops_on_drop() {
        let source = Arc::new(|| vec![sample("default", 4096, Some(8192))]);
        let server = serve("127.0.0.1:0".parse().expect("addr"), source).expect("serve");
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);

        let ok = get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        );
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{ok}"
        );
        assert!(
            ok.lines()
                .any(|l| l == "rgpu_tenant_device_memory_bytes{tenant=\"default\"} 4096"),
            "{ok}"
        );
        let missing = get(addr, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
        assert!(
            missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{missing}"
        );
        let post = get(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{post}"
        );

        // A second server on the same address cannot bind: said at once.
        let busy = serve(addr, Arc::new(Vec::<TenantSample>::new)).expect_err("the port is taken");
        assert!(matches!(busy, MetricsError::Bind { .. }), "{busy}");

        drop(server);
        assert!(
            TcpStream::connect(addr).is_err(),
            "still listening after drop"
        );
    }
}
