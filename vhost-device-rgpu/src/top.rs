//! `vhost-device-rgpu top`: each tenant's use, refreshed in place.
//!
//! It reads the daemon's Prometheus endpoint ([`crate::metrics`]), so it
//! needs nothing but the address the daemon was given with
//! `--metrics-listen`, and shows exactly what a Prometheus server would
//! scrape. A plain HTTP/1.1 GET over a `TcpStream` is all it takes: one
//! request a refresh, no runtime needed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::metrics::METRICS_PATH;

/// Arguments of `vhost-device-rgpu top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// The daemon's metrics endpoint: the address it was given with
    /// --metrics-listen.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9400")]
    pub metrics: String,
    /// Time between refreshes, in milliseconds.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub interval_ms: u64,
    /// Print one table and exit (commands per second need two readings:
    /// they show as `-`).
    #[arg(long)]
    pub once: bool,
}

/// How long connecting, sending and reading may each take.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// A larger answer is not the daemon's (a few hundred bytes a tenant).
const MAX_RESPONSE_BYTES: u64 = 16 << 20;
const MIB: f64 = (1u64 << 20) as f64;
/// Moves the cursor home and clears the screen: the table is redrawn in
/// place.
const CLEAR_SCREEN: &str = "\x1b[H\x1b[2J";

/// Why a reading failed.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("{address:?} is not an address (HOST:PORT): {source}")]
    Address {
        address: String,
        source: std::io::Error,
    },
    #[error(
        "cannot reach the daemon's metrics at http://{address}{METRICS_PATH}: {source} \
         (is it running with --metrics-listen {address}?)"
    )]
    Unreachable {
        address: String,
        source: std::io::Error,
    },
    #[error("http://{address}{METRICS_PATH} answered {status:?}")]
    Status { address: String, status: String },
    #[error("http://{address}{METRICS_PATH} answered something that is not HTTP: {what}")]
    Malformed { address: String, what: &'static str },
}

/// One tenant's row, from the `rgpu_tenant_*` series labelled with it.
/// A series the endpoint did not send stays 0 (`None` for the limit).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TenantRow {
    pub sessions: u64,
    pub workers: u64,
    pub connections: u64,
    pub memory_used: u64,
    pub memory_limit: Option<u64>,
    pub commands_total: u64,
    pub command_errors_total: u64,
    pub compute_weight: u64,
    pub gpu_busy_seconds: f64,
}

/// Every tenant's row by name (so by name in order).
pub type Tenants = BTreeMap<String, TenantRow>;

/// The `rgpu_tenant_*` samples of a Prometheus text exposition, by tenant.
/// Other series, comments and lines that do not parse are skipped: the
/// endpoint may grow series this `top` does not know.
pub fn parse_metrics(text: &str) -> Tenants {
    let mut tenants = Tenants::new();
    for line in text.lines() {
        let Some(sample) = parse_sample(line) else {
            continue;
        };
        let Some(name) = sample.name.strip_prefix("rgpu_tenant_") else {
            continue;
        };
        let Some(tenant) = sample.tenant else {
            continue;
        };
        let row = tenants.entry(tenant).or_default();
        let seconds = sample.value;
        // `as` saturates: +Inf and anything past u64::MAX become u64::MAX.
        let value = sample.value as u64;
        match name {
            "sessions" => row.sessions = value,
            "workers" => row.workers = value,
            "connections" => row.connections = value,
            "device_memory_bytes" => row.memory_used = value,
            "device_memory_limit_bytes" => row.memory_limit = Some(value),
            "commands_total" => row.commands_total = value,
            "command_errors_total" => row.command_errors_total = value,
            "compute_weight" => row.compute_weight = value,
            "gpu_busy_seconds_total" => row.gpu_busy_seconds = seconds,
            _ => {}
        }
    }
    tenants
}

/// One sample line: `name{label="value",…} value [timestamp]`.
struct Sample {
    name: String,
    tenant: Option<String>,
    value: f64,
}

fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_end);
    let mut tenant = None;
    if let Some(labels) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(labels)?;
        tenant = parsed
            .into_iter()
            .find(|(key, _)| key == "tenant")
            .map(|(_, value)| value);
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    Some(Sample {
        name: name.to_owned(),
        tenant,
        value: parse_value(value)?,
    })
}

/// The labels after a `{`, up to its `}`, and what follows it. Values are
/// unescaped (`\\`, `\"`, `\n`).
fn parse_labels(text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let equals = rest.find('=')?;
        let key = rest[..equals].trim().to_owned();
        rest = rest[equals + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key, value));
        rest = &rest[end + 1..];
    }
}

/// A sample value (`1e+06`, `2.5`, `+Inf`); negative and NaN values are
/// neither counts nor seconds and are skipped.
fn parse_value(text: &str) -> Option<f64> {
    let value: f64 = text.parse().ok()?;
    (value >= 0.0).then_some(value)
}

/// What changed per second between two readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub commands_per_second: f64,
    /// GPU time per wall time, in percent.
    pub gpu_percent: f64,
}

/// The table: one row per tenant. `rates` holds each tenant's rates, for
/// those with a previous reading.
pub fn render_table(tenants: &Tenants, rates: &BTreeMap<String, Rates>) -> String {
    let mut table = format!(
        "{:<20} {:>8} {:>8} {:>6} {:>10} {:>10} {:>10} {:>6} {:>8}\n",
        "TENANT", "SESSIONS", "WORKERS", "CONNS", "MEM MiB", "LIMIT MiB", "CMD/S", "GPU%", "ERRORS"
    );
    if tenants.is_empty() {
        table.push_str("(no tenants)\n");
    }
    for (name, row) in tenants {
        let limit = row.memory_limit.map_or_else(
            || "-".to_owned(),
            |bytes| format!("{:.1}", bytes as f64 / MIB),
        );
        let (rate, gpu) = rates.get(name).map_or_else(
            || ("-".to_owned(), "-".to_owned()),
            |r| {
                (
                    format!("{:.0}", r.commands_per_second),
                    format!("{:.0}", r.gpu_percent),
                )
            },
        );
        table.push_str(&format!(
            "{:<20} {:>8} {:>8} {:>6} {:>10.1} {:>10} {:>10} {:>6} {:>8}\n",
            name,
            row.sessions,
            row.workers,
            row.connections,
            row.memory_used as f64 / MIB,
            limit,
            rate,
            gpu,
            row.command_errors_total
        ));
    }
    table
}

/// The rates of each tenant present in both readings, taken `elapsed`
/// apart. A counter that went down (the tenant was re-created, or the
/// daemon restarted) has no rate.
pub fn rates(before: &Tenants, now: &Tenants, elapsed: Duration) -> BTreeMap<String, Rates> {
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return BTreeMap::new();
    }
    now.iter()
        .filter_map(|(name, row)| {
            let earlier = before.get(name)?;
            let done = row.commands_total.checked_sub(earlier.commands_total)?;
            let busy = row.gpu_busy_seconds - earlier.gpu_busy_seconds;
            (busy >= 0.0).then(|| {
                let rates = Rates {
                    commands_per_second: done as f64 / seconds,
                    gpu_percent: 100.0 * busy / seconds,
                };
                (name.clone(), rates)
            })
        })
        .collect()
}

/// The body of `GET http://ADDRESS/metrics`.
pub fn fetch_metrics(address: &str) -> Result<String, TopError> {
    let unreachable = |source| TopError::Unreachable {
        address: address.to_owned(),
        source,
    };
    let malformed = |what| TopError::Malformed {
        address: address.to_owned(),
        what,
    };
    let targets: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|source| TopError::Address {
            address: address.to_owned(),
            source,
        })?
        .collect();
    let mut last_error = std::io::Error::other("the name resolved to no address");
    let mut connected = None;
    for target in targets {
        match TcpStream::connect_timeout(&target, IO_TIMEOUT) {
            Ok(stream) => {
                connected = Some(stream);
                break;
            }
            Err(e) => last_error = e,
        }
    }
    let mut stream = connected.ok_or_else(|| unreachable(last_error))?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(unreachable)?;
    let request = format!(
        "GET {METRICS_PATH} HTTP/1.1\r\nHost: {address}\r\nAccept: text/plain\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(unreachable)?;
    let mut response = Vec::new();
    stream
        .take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut response)
        .map_err(unreachable)?;

    let header_end = find(&response, b"\r\n\r\n").ok_or_else(|| malformed("no end of headers"))?;
    let head = std::str::from_utf8(&response[..header_end])
        .map_err(|_| malformed("headers are not text"))?;
    let mut head_lines = head.split("\r\n");
    let status_line = head_lines.next().unwrap_or_default();
    let mut status_words = status_line.splitn(3, ' ');
    if !status_words
        .next()
        .is_some_and(|v| v.starts_with("HTTP/1."))
    {
        return Err(malformed("no HTTP/1 status line"));
    }
    if status_words.next() != Some("200") {
        return Err(TopError::Status {
            address: address.to_owned(),
            status: status_line.to_owned(),
        });
    }
    let chunked = head_lines.any(|header| {
        header.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = &response[header_end + 4..];
    let body = if chunked {
        dechunk(body).ok_or_else(|| malformed("a broken chunked body"))?
    } else {
        body.to_vec()
    };
    String::from_utf8(body).map_err(|_| malformed("a body that is not UTF-8"))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// A `Transfer-Encoding: chunked` body, joined.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut joined = Vec::new();
    loop {
        let line_end = find(body, b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        // Chunk extensions (`;name=value`) carry nothing we need.
        let size_text = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(joined);
        }
        joined.extend_from_slice(body.get(..size)?);
        body = body.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

pub fn run(args: TopArgs) -> ExitCode {
    match watch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vhost-device-rgpu top: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the table once, or redraws it every interval until the daemon
/// cannot be read any more (or the user interrupts).
fn watch(args: &TopArgs) -> Result<(), TopError> {
    let interval = Duration::from_millis(args.interval_ms);
    let mut previous: Option<(Tenants, Instant)> = None;
    loop {
        let tenants = parse_metrics(&fetch_metrics(&args.metrics)?);
        let now = Instant::now();
        let rates = previous
            .as_ref()
            .map(|(before, at)| rates(before, &tenants, now.duration_since(*at)))
            .unwrap_or_default();
        let table = render_table(&tenants, &rates);
        let mut stdout = std::io::stdout().lock();
        // A closed stdout (`top | head`) ends the tool quietly.
        let written = if args.once {
            stdout.write_all(table.as_bytes())
        } else {
            write!(
                stdout,
                "{CLEAR_SCREEN}rgpu top: http://{}{METRICS_PATH} every {} ms\n\n{table}",
                args.metrics, args.interval_ms
            )
        };
        if written.and_then(|()| stdout.flush()).is_err() || args.once {
            return Ok(());
        }
        drop(stdout);
        previous = Some((tenants, now));
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# HELP rgpu_tenant_device_memory_bytes Device memory the tenant's guests hold now, in bytes.
# TYPE rgpu_tenant_device_memory_bytes gauge
rgpu_tenant_device_memory_bytes{tenant=\"default\"} 268435456
rgpu_tenant_device_memory_bytes{tenant=\"a \\\"quoted\\\" \\\\ name\"} 1e+06
rgpu_tenant_device_memory_limit_bytes{tenant=\"default\"} 268435456
rgpu_tenant_sessions{tenant=\"default\"} 2
rgpu_tenant_workers{tenant=\"default\"} 1
rgpu_tenant_connections{tenant=\"default\"} 1
rgpu_tenant_commands_total{tenant=\"default\"} 1500 1700000000000
rgpu_tenant_command_errors_total{tenant=\"default\"} 3
rgpu_tenant_compute_weight{tenant=\"default\"} 100
rgpu_tenant_gpu_busy_seconds_total{tenant=\"default\"} 2.5
rgpu_tenant_future_series{tenant=\"default\"} 5
rgpu_tenant_sessions{tenant=\"default\",kind=\"other\"} -1
process_open_fds 12
not a sample
";

    #[test]
    fn parses_each_tenants_series() {
        let tenants = parse_metrics(EXPOSITION);
        assert_eq!(tenants.len(), 2, "{tenants:?}");
        assert_eq!(
            tenants["default"],
            TenantRow {
                sessions: 2,
                workers: 1,
                connections: 1,
                memory_used: 268_435_456,
                memory_limit: Some(268_435_456),
                commands_total: 1500,
                command_errors_total: 3,
                compute_weight: 100,
                gpu_busy_seconds: 2.5,
            }
        );
        let quoted = &tenants["a \"quoted\" \\ name"];
        assert_eq!(quoted.memory_used, 1_000_000);
        assert_eq!(quoted.memory_limit, None);
    }

    #[test]
    fn values_and_labels_parse_as_the_format_writes_them() {
        assert_eq!(parse_value("18446744073709551615"), Some(u64::MAX as f64));
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_value("2.5"), Some(2.5));
        assert_eq!(parse_value("NaN"), None);
        assert_eq!(parse_value("-3"), None);
        let (labels, rest) = parse_labels("a=\"x,}y\", b=\"line\\nbreak\"} 7").expect("labels");
        assert_eq!(
            labels,
            [
                ("a".to_owned(), "x,}y".to_owned()),
                ("b".to_owned(), "line\nbreak".to_owned())
            ]
        );
        assert_eq!(rest, " 7");
        assert!(parse_labels("a=\"unterminated").is_none());
    }

    #[test]
    fn table_shows_one_row_per_tenant() {
        let mut before = parse_metrics(EXPOSITION);
        let mut now = before.clone();
        if let Some(row) = now.get_mut("default") {
            row.commands_total += 500;
            row.gpu_busy_seconds += 0.125;
        }
        // This one appeared since the last reading.
        before.remove("a \"quoted\" \\ name");
        let rates = rates(&before, &now, Duration::from_millis(500));
        assert_eq!(
            rates.get("default"),
            Some(&Rates {
                commands_per_second: 1000.0,
                gpu_percent: 25.0
            })
        );
        let table = render_table(&now, &rates);
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0][0], "TENANT");
        assert!(
            rows.contains(&vec![
                "default", "2", "1", "1", "256.0", "256.0", "1000", "25", "3"
            ]),
            "{table}"
        );
        // A tenant without a limit, and without a previous reading.
        assert!(
            table.lines().any(|l| l.starts_with("a \"quoted\" \\ name")
                && l.split_whitespace().rev().take(5).collect::<Vec<_>>()
                    == ["0", "-", "-", "-", "1.0"]),
            "{table}"
        );
        assert_eq!(
            render_table(&Tenants::new(), &BTreeMap::new())
                .lines()
                .nth(1),
            Some("(no tenants)")
        );
    }

    #[test]
    fn a_counter_that_went_down_has_no_rate() {
        let before = parse_metrics(EXPOSITION);
        let mut now = before.clone();
        if let Some(row) = now.get_mut("default") {
            row.commands_total = 10;
        }
        let rates = rates(&before, &now, Duration::from_secs(1));
        assert_eq!(rates.get("default"), None);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk(b"4\r\nrgpu\r\n6;ext=1\r\n_top\n!\r\n0\r\n\r\n").as_deref(),
            Some(&b"rgpu_top\n!"[..])
        );
        assert!(dechunk(b"ff\r\nshort\r\n").is_none());
    }

    #[test]
    fn an_absent_daemon_is_reported_as_unreachable() {
        // A port that was free a moment ago: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let error = fetch_metrics(&format!("127.0.0.1:{port}")).expect_err("nothing listens");
        assert!(matches!(error, TopError::Unreachable { .. }), "{error}");
        assert!(error.to_string().contains("cannot reach"), "{error}");
    }
}
