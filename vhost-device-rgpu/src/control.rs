//! The control socket (`--control-socket`, or `control_socket` in the
//! config): tenants listed, changed, added and removed while the daemon
//! runs. `vhost-device-rgpu ctl` is its client ([`crate::ctl`]).
//!
//! The protocol: a client connects, sends one request line, reads one
//! answer line, and the daemon closes the connection.
//!
//! Requests are words separated by spaces (so no value may hold one):
//!
//! ```text
//! list
//! set NAME KEY=VALUE...      memory_limit=SIZE|none compute_weight=1..10000
//!                            compute_max=1%..100%|none priority=high|normal|low
//! add name=NAME socket=/ABSOLUTE/PATH [gpu=N] [KEY=VALUE of set...]
//! remove NAME
//! ```
//!
//! The answer is one line of JSON: `{"ok":true,"tenants":[...]}` (every
//! tenant for `list`; the tenant changed or added for `set` and `add`;
//! none for `remove`), or `{"ok":false,"error":"why","tenants":[]}`. A
//! tenant:
//!
//! ```text
//! {"name":"vm1","socket":"/run/rgpu/vm1.sock","gpu":0,
//!  "memory_limit":17179869184,"memory_used":0,"compute_weight":100,
//!  "compute_max":50,"priority":"normal","connections":1,"sessions":2,
//!  "gpu_busy_ms":1234}
//! ```
//!
//! (`memory_limit` and `compute_max` are `null` when there is none.) A
//! change takes effect at once: the memory budget at the next allocation,
//! the compute settings at the scheduler's next step. The socket is created for the daemon's user alone (mode 0600): a
//! tenant's VMM, which may share the daemon's group to reach its own
//! socket, must not change its limits.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use log::{debug, info, warn};
use serde::{Deserialize, Serialize};

use crate::config::{Setting, TenantConfig};
use crate::tenants::{ServedTenant, Tenants};

/// The longest request line read.
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;
/// How long the daemon waits for a client's request. Requests are served
/// one at a time, so a silent client must not hold the others up long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for the answer: an `add` waits for the new
/// tenant's first process to start its executor, a `remove` for the
/// tenant's processes to end.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    List,
    /// Changes tenant `name`'s settings, given as `(key, value)`.
    Set {
        name: String,
        settings: Vec<(String, String)>,
    },
    /// Starts a tenant from `(key, value)` pairs.
    Add {
        settings: Vec<(String, String)>,
    },
    Remove {
        name: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("cannot connect to the control socket {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("talking to the daemon: {0}")]
    Exchange(io::Error),
    #[error("the daemon's answer is not understood: {0}")]
    BadAnswer(String),
    /// The daemon refused the request, saying why.
    #[error("{0}")]
    Refused(String),
}

fn bad(message: impl Into<String>) -> ControlError {
    ControlError::BadRequest(message.into())
}

/// `word` as `(key, value)`.
fn key_value(word: &str) -> Result<(String, String), ControlError> {
    match word.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(bad(format!("{word:?} is not KEY=VALUE"))),
    }
}

impl Request {
    /// Reads one request line (without its newline).
    pub fn parse(line: &str) -> Result<Self, ControlError> {
        let mut words = line.split_ascii_whitespace();
        let verb = words
            .next()
            .ok_or_else(|| bad("empty request (list, set, add, remove)"))?;
        let rest: Vec<&str> = words.collect();
        match (verb, rest.as_slice()) {
            ("list", []) => Ok(Self::List),
            ("set", [name, settings @ ..]) if !settings.is_empty() => Ok(Self::Set {
                name: (*name).to_owned(),
                settings: settings
                    .iter()
                    .map(|w| key_value(w))
                    .collect::<Result<_, _>>()?,
            }),
            ("add", settings) if !settings.is_empty() => Ok(Self::Add {
                settings: settings
                    .iter()
                    .map(|w| key_value(w))
                    .collect::<Result<_, _>>()?,
            }),
            ("remove", [name]) => Ok(Self::Remove {
                name: (*name).to_owned(),
            }),
            ("list", _) => Err(bad("list takes nothing")),
            ("set", _) => Err(bad("set NAME KEY=VALUE...")),
            ("add", _) => Err(bad("add name=NAME socket=PATH [KEY=VALUE...]")),
            ("remove", _) => Err(bad("remove NAME")),
            (verb, _) => Err(bad(format!(
                "unknown request {verb:?} (list, set, add, remove)"
            ))),
        }
    }

    /// The request as a line (with its newline); refuses words that the
    /// line could not carry (empty, or holding spaces).
    pub fn line(&self) -> Result<String, ControlError> {
        let pair = |(key, value): &(String, String)| format!("{key}={value}");
        let words: Vec<String> = match self {
            Self::List => vec!["list".into()],
            Self::Set { name, settings } => ["set".to_owned(), name.clone()]
                .into_iter()
                .chain(settings.iter().map(pair))
                .collect(),
            Self::Add { settings } => std::iter::once("add".to_owned())
                .chain(settings.iter().map(pair))
                .collect(),
            Self::Remove { name } => vec!["remove".into(), name.clone()],
        };
        for word in &words {
            if word.is_empty() || word.contains(char::is_whitespace) {
                return Err(bad(format!(
                    "{word:?}: names and values may not be empty or hold spaces"
                )));
            }
        }
        Ok(words.join(" ") + "\n")
    }
}

/// One tenant as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantEntry {
    pub name: String,
    /// Its socket's path, or `fd N` for an inherited one.
    pub socket: String,
    pub gpu: u32,
    /// Bytes; `None`: no limit.
    pub memory_limit: Option<u64>,
    /// Bytes held by all its processes now.
    pub memory_used: u64,
    pub compute_weight: u32,
    /// Percent; `None`: no cap.
    pub compute_max: Option<u8>,
    pub priority: String,
    /// Connections served now (VMs or local processes).
    pub connections: u64,
    /// Guest CUDA contexts now.
    pub sessions: u64,
    /// GPU time of the tenant's work so far, in milliseconds.
    #[serde(default)]
    pub gpu_busy_ms: u64,
}

impl From<&ServedTenant> for TenantEntry {
    fn from(tenant: &ServedTenant) -> Self {
        let sample = tenant.sample();
        Self {
            name: sample.name,
            socket: tenant.endpoint.to_string(),
            gpu: tenant.gpu,
            memory_limit: sample.memory_limit,
            memory_used: sample.memory_used,
            compute_weight: sample.compute_weight,
            compute_max: sample.compute_max,
            priority: sample.priority.to_owned(),
            connections: rgpu_session::Counters::get(&sample.counters.connections_active),
            sessions: rgpu_session::Counters::get(&sample.counters.sessions_active),
            gpu_busy_ms: (sample.gpu_busy_seconds * 1e3) as u64,
        }
    }
}

/// The answer line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub tenants: Vec<TenantEntry>,
}

impl Answer {
    fn tenants(tenants: Vec<TenantEntry>) -> Self {
        Self {
            ok: true,
            error: None,
            tenants,
        }
    }

    fn error(why: impl std::fmt::Display) -> Self {
        Self {
            ok: false,
            error: Some(why.to_string()),
            tenants: Vec::new(),
        }
    }
}

/// Carries out one request line.
pub fn answer(tenants: &Tenants, line: &str) -> Answer {
    let request = match Request::parse(line) {
        Ok(request) => request,
        Err(e) => return Answer::error(e),
    };
    if request != Request::List {
        info!("control socket: {}", line.trim());
    }
    let outcome = match request {
        Request::List => Ok(tenants
            .list()
            .iter()
            .map(|t| TenantEntry::from(t.as_ref()))
            .collect()),
        Request::Set { name, settings } => settings
            .iter()
            .map(|(key, value)| Setting::parse(key, value))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
            .and_then(|changes| tenants.set(&name, &changes).map_err(|e| e.to_string()))
            .map(|tenant| vec![TenantEntry::from(tenant.as_ref())]),
        Request::Add { settings } => {
            TenantConfig::from_pairs(settings.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .map_err(|e| e.to_string())
                .and_then(|config| {
                    if config.socket.is_relative() {
                        // Relative to what? The daemon's folder is not the
                        // client's.
                        return Err(format!(
                            "socket: {} is not an absolute path",
                            config.socket.display()
                        ));
                    }
                    tenants.add(config).map_err(|e| e.to_string())
                })
                .map(|tenant| vec![TenantEntry::from(tenant.as_ref())])
        }
        Request::Remove { name } => tenants
            .remove(&name)
            .map(|()| Vec::new())
            .map_err(|e| e.to_string()),
    };
    match outcome {
        Ok(entries) => Answer::tenants(entries),
        Err(why) => {
            info!("control socket: refused: {why}");
            Answer::error(why)
        }
    }
}

/// Answers the control socket from a thread of its own, for the life of
/// the process, one client at a time.
pub fn spawn(listener: UnixListener, tenants: Arc<Tenants>) -> io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("rgpu-control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        // A client that went away is its own problem.
                        if let Err(e) = serve_client(stream, &tenants) {
                            debug!("control socket: {e}");
                        }
                    }
                    Err(e) => warn!("control socket: accept failed: {e}"),
                }
            }
        })
}

fn serve_client(stream: UnixStream, tenants: &Tenants) -> io::Result<()> {
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST_BYTES)).read_line(&mut line)?;
    let answer = if line.ends_with('\n') {
        self::answer(tenants, &line)
    } else {
        Answer::error(bad(format!(
            "a request is one line of at most {MAX_REQUEST_BYTES} bytes, ended by a newline"
        )))
    };
    let mut text = serde_json::to_string(&answer).map_err(io::Error::other)?;
    text.push('\n');
    (&stream).write_all(text.as_bytes())
}

/// The client's side: sends `request` to the daemon's control socket at
/// `path` and returns its answer; a refusal is an error with the daemon's
/// reason.
pub fn ask(path: &Path, request: &Request) -> Result<Vec<TenantEntry>, ControlError> {
    let line = request.line()?;
    let stream = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_owned(),
        source,
    })?;
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(ControlError::Exchange)?;
    (&stream)
        .write_all(line.as_bytes())
        .map_err(ControlError::Exchange)?;
    let mut text = String::new();
    BufReader::new(&stream)
        .read_line(&mut text)
        .map_err(ControlError::Exchange)?;
    let answer: Answer = serde_json::from_str(&text)
        .map_err(|e| ControlError::BadAnswer(format!("{e}: {text:?}")))?;
    if answer.ok {
        Ok(answer.tenants)
    } else {
        Err(ControlError::Refused(
            answer
                .error
                .unwrap_or_else(|| "refused, no reason given".into()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_through_their_line() {
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        for request in [
            Request::List,
            Request::Set {
                name: "vm1".into(),
                settings: pairs(&[("memory_limit", "8GiB"), ("compute_weight", "300")]),
            },
            Request::Add {
                settings: pairs(&[("name", "vm3"), ("socket", "/run/vm3.sock")]),
            },
            Request::Remove { name: "vm3".into() },
        ] {
            let line = request.line().unwrap();
            assert!(line.ends_with('\n'));
            assert_eq!(Request::parse(&line).unwrap(), request, "{line}");
        }
        assert_eq!(
            Request::parse("set vm1 memory_limit=8GiB compute_weight=300").unwrap(),
            Request::Set {
                name: "vm1".into(),
                settings: pairs(&[("memory_limit", "8GiB"), ("compute_weight", "300")]),
            }
        );
    }

    #[test]
    fn bad_requests_say_why() {
        for (line, words) in [
            ("", "empty request"),
            ("frobnicate", "unknown request"),
            ("list all", "list takes nothing"),
            ("set vm1", "set NAME"),
            ("set vm1 weight", "not KEY=VALUE"),
            ("set vm1 =3", "not KEY=VALUE"),
            ("add", "add name="),
            ("remove", "remove NAME"),
            ("remove a b", "remove NAME"),
        ] {
            let error = Request::parse(line).unwrap_err().to_string();
            assert!(error.contains(words), "{line:?}: {error}");
        }
        let spaced = Request::Add {
            settings: vec![("socket".into(), "/a b".into())],
        };
        assert!(spaced.line().is_err());
    }

    #[test]
    fn answers_are_one_json_line() {
        let answer = Answer::error("unknown tenant \"x\"");
        let text = serde_json::to_string(&answer).unwrap();
        assert_eq!(
            text,
            r#"{"ok":false,"error":"unknown tenant \"x\"","tenants":[]}"#
        );
        assert_eq!(serde_json::from_str::<Answer>(&text).unwrap(), answer);
        let entry = TenantEntry {
            name: "vm1".into(),
            socket: "/run/vm1.sock".into(),
            gpu: 0,
            memory_limit: None,
            memory_used: 0,
            compute_weight: 100,
            compute_max: Some(50),
            priority: "normal".into(),
            connections: 1,
            sessions: 2,
            gpu_busy_ms: 1234,
        };
        let text = serde_json::to_string(&Answer::tenants(vec![entry.clone()])).unwrap();
        assert!(!text.contains('\n'));
        assert!(text.contains(r#""memory_limit":null"#), "{text}");
        assert_eq!(
            serde_json::from_str::<Answer>(&text).unwrap().tenants,
            [entry]
        );
    }
}
