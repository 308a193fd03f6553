//! The daemon's settings and tenants, from a TOML file (`--config FILE`)
//! or, one setting at a time, from the control socket (`ctl set`, `ctl
//! add`).
//!
//! ```toml
//! [daemon]
//! metrics_listen = "127.0.0.1:9400"
//! control_socket = "/run/rgpu/control.sock"
//!
//! [[tenant]]
//! name = "vm1"
//! socket = "/run/rgpu/vm1.sock"
//! gpu = 0
//! memory_limit = "16GiB"
//! compute_weight = 100       # 1..10000, default 100
//! compute_max = "50%"        # optional, 1%..100%
//! priority = "normal"        # high | normal | low, default normal
//! listen = "0.0.0.0:7450"    # optional: remote clients of this tenant
//! ```
//!
//! Every value is checked here, once, with the same rules for the file and
//! for the control socket; a bad file is refused whole with `FILE:LINE:
//! message`, so that a daemon never starts with half of what was meant.
//! Relative socket paths in a file are relative to the file's folder (the
//! daemon's working folder is rarely the one its config was written for).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;
use toml::Spanned;

/// A tenant's share of contended GPU time when none is given.
pub const DEFAULT_COMPUTE_WEIGHT: u32 = 100;
/// The weights a tenant may have.
pub const COMPUTE_WEIGHTS: std::ops::RangeInclusive<u32> = 1..=10_000;
/// The percentages a hard cap may have.
pub const COMPUTE_MAX_PERCENTS: std::ops::RangeInclusive<u8> = 1..=100;
/// The longest tenant name: it is a label in metrics and a word in the
/// control protocol.
pub const MAX_NAME_BYTES: usize = 64;

/// What a value means when it says "no limit" / "no cap" (`ctl set vm1
/// memory_limit=none`).
const NONE_WORDS: [&str; 2] = ["none", "unlimited"];

/// A size with an optional binary or decimal unit: `4096`, `256MiB`,
/// `16GiB`, `512MB`, `1TB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number of bytes, such as 256MiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `bytes` in the largest binary unit that holds it exactly (`256MiB`,
/// `1536KiB`, `1000B`): what `parse_size` reads back to the same number.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// A memory limit: a size, or `none` / `unlimited`.
pub fn parse_memory_limit(text: &str) -> Result<Option<u64>, String> {
    if NONE_WORDS.contains(&text.trim()) {
        return Ok(None);
    }
    parse_size(text).map(Some)
}

/// A compute weight, 1 to 10000.
pub fn check_compute_weight(weight: i64) -> Result<u32, String> {
    u32::try_from(weight)
        .ok()
        .filter(|w| COMPUTE_WEIGHTS.contains(w))
        .ok_or_else(|| {
            format!(
                "{weight} is out of range: a weight is {} to {}",
                COMPUTE_WEIGHTS.start(),
                COMPUTE_WEIGHTS.end()
            )
        })
}

fn parse_compute_weight(text: &str) -> Result<u32, String> {
    let weight = text
        .trim()
        .parse::<i64>()
        .map_err(|_| format!("{text:?}: expected a whole number such as 100"))?;
    check_compute_weight(weight)
}

/// A hard cap on the GPU time a tenant gets: `1%` to `100%`, or `none`.
pub fn parse_compute_max(text: &str) -> Result<Option<u8>, String> {
    let text = text.trim();
    if NONE_WORDS.contains(&text) {
        return Ok(None);
    }
    let percent = text
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<i64>().ok())
        .ok_or_else(|| format!("{text:?}: expected a percentage such as \"50%\""))?;
    u8::try_from(percent)
        .ok()
        .filter(|p| COMPUTE_MAX_PERCENTS.contains(p))
        .map(Some)
        .ok_or_else(|| format!("{text}: out of range: a cap is 1% to 100%"))
}

/// A tenant name: 1 to 64 of `A-Z a-z 0-9 _ - .`, starting with a letter
/// or digit (a metrics label and a word of the control protocol: nothing
/// to quote or escape).
pub fn check_tenant_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a tenant's name may not be empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("{name:?} is longer than {MAX_NAME_BYTES} bytes"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        // Nor an option to a command line that carries it (`-x`).
        return Err(format!("{name:?}: a name starts with a letter or a digit"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "{name:?}: {bad:?} is not allowed in a name (letters, digits, '_', '-', '.')"
        ));
    }
    Ok(())
}

fn check_socket_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("a socket path may not be empty".into());
    }
    if path.contains(char::is_whitespace) {
        // The control protocol separates words with spaces.
        return Err(format!("{path:?}: a socket path may not hold spaces"));
    }
    Ok(())
}

/// Which work goes first when tenants contend (declared highest first:
/// the derived order ranks them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    pub fn name(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }
}

impl FromStr for Priority {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "high" => Ok(Self::High),
            "normal" => Ok(Self::Normal),
            "low" => Ok(Self::Low),
            other => Err(format!("{other:?}: expected high, normal or low")),
        }
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What may change while a tenant is served (`ctl set`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantSettings {
    /// Device memory of all the tenant's processes together; `None`: no
    /// limit. Enforced.
    pub memory_limit: Option<u64>,
    /// Share of contended GPU time (the scheduler's weight).
    pub compute_weight: u32,
    /// Hard cap on GPU time, percent, even on an idle GPU.
    pub compute_max: Option<u8>,
    /// While a tenant of a higher priority has work, lower ones wait.
    pub priority: Priority,
}

impl Default for TenantSettings {
    fn default() -> Self {
        Self {
            memory_limit: None,
            compute_weight: DEFAULT_COMPUTE_WEIGHT,
            compute_max: None,
            priority: Priority::Normal,
        }
    }
}

/// One change of [`TenantSettings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    MemoryLimit(Option<u64>),
    ComputeWeight(u32),
    ComputeMax(Option<u8>),
    Priority(Priority),
}

/// The keys `ctl set` takes.
pub const LIVE_KEYS: [&str; 4] = ["memory_limit", "compute_weight", "compute_max", "priority"];
/// The keys `ctl add` takes besides those.
pub const START_KEYS: [&str; 3] = ["name", "socket", "gpu"];

impl Setting {
    /// `key=value` as `ctl set` gives it.
    pub fn parse(key: &str, value: &str) -> Result<Self, SettingError> {
        let bad = |problem: String| SettingError::BadValue {
            key: key.to_owned(),
            problem,
        };
        match key {
            "memory_limit" => parse_memory_limit(value)
                .map(Self::MemoryLimit)
                .map_err(bad),
            "compute_weight" => parse_compute_weight(value)
                .map(Self::ComputeWeight)
                .map_err(bad),
            "compute_max" => parse_compute_max(value).map(Self::ComputeMax).map_err(bad),
            "priority" => value.parse().map(Self::Priority).map_err(bad),
            key if START_KEYS.contains(&key) => Err(SettingError::NotLive(key.to_owned())),
            key => Err(SettingError::UnknownKey(key.to_owned())),
        }
    }

    pub fn apply(self, settings: &mut TenantSettings) {
        match self {
            Self::MemoryLimit(limit) => settings.memory_limit = limit,
            Self::ComputeWeight(weight) => settings.compute_weight = weight,
            Self::ComputeMax(max) => settings.compute_max = max,
            Self::Priority(priority) => settings.priority = priority,
        }
    }
}

/// Why a `key=value` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("unknown setting {0:?} (memory_limit, compute_weight, compute_max, priority; add also takes name, socket, gpu)")]
    UnknownKey(String),
    #[error("{key}: {problem}")]
    BadValue { key: String, problem: String },
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{0} is given twice")]
    Repeated(String),
    #[error("{0} cannot change while the tenant is served: remove it and add it again")]
    NotLive(String),
}

/// Everything the daemon serves, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub daemon: DaemonSettings,
    pub tenants: Vec<TenantConfig>,
}

/// The `[daemon]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonSettings {
    /// Where Prometheus scrapes `/metrics`.
    pub metrics_listen: Option<SocketAddr>,
    /// The control socket (`ctl`); `--control-socket` overrides it.
    pub control_socket: Option<PathBuf>,
}

/// One `[[tenant]]`: a socket and what its guests may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantConfig {
    pub name: String,
    pub socket: PathBuf,
    /// Host GPU ordinal; `None`: the daemon's `--gpu`.
    pub gpu: Option<u32>,
    /// A TCP address of the tenant's own for remote clients (with the
    /// daemon's TLS files; a certificate must name this tenant). Read at
    /// start only.
    pub listen: Option<SocketAddr>,
    pub memory_limit: Option<u64>,
    pub compute_weight: u32,
    pub compute_max: Option<u8>,
    pub priority: Priority,
}

impl TenantConfig {
    /// A tenant with default settings (no limits).
    pub fn new(name: impl Into<String>, socket: impl Into<PathBuf>) -> Self {
        let defaults = TenantSettings::default();
        Self {
            name: name.into(),
            socket: socket.into(),
            gpu: None,
            listen: None,
            memory_limit: defaults.memory_limit,
            compute_weight: defaults.compute_weight,
            compute_max: defaults.compute_max,
            priority: defaults.priority,
        }
    }

    pub fn settings(&self) -> TenantSettings {
        TenantSettings {
            memory_limit: self.memory_limit,
            compute_weight: self.compute_weight,
            compute_max: self.compute_max,
            priority: self.priority,
        }
    }

    fn set(&mut self, settings: TenantSettings) {
        self.memory_limit = settings.memory_limit;
        self.compute_weight = settings.compute_weight;
        self.compute_max = settings.compute_max;
        self.priority = settings.priority;
    }

    /// A tenant from `key=value` pairs, as `ctl add` gives them: `name`
    /// and `socket` (an absolute path: the client made it one) are needed,
    /// the rest is optional.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, SettingError> {
        let mut name = None;
        let mut socket = None;
        let mut gpu = None;
        let mut settings = TenantSettings::default();
        let mut seen: Vec<&str> = Vec::new();
        for (key, value) in pairs {
            if seen.contains(&key) {
                return Err(SettingError::Repeated(key.to_owned()));
            }
            seen.push(key);
            let bad = |problem: String| SettingError::BadValue {
                key: key.to_owned(),
                problem,
            };
            match key {
                "name" => {
                    check_tenant_name(value).map_err(bad)?;
                    name = Some(value.to_owned());
                }
                "socket" => {
                    check_socket_path(value).map_err(bad)?;
                    socket = Some(PathBuf::from(value));
                }
                "gpu" => {
                    gpu = Some(value.trim().parse::<u32>().map_err(|_| {
                        bad(format!("{value:?}: expected a GPU ordinal such as 0"))
                    })?);
                }
                key => Setting::parse(key, value)
                    .map_err(|e| match e {
                        // Everything is "live" when a tenant starts.
                        SettingError::NotLive(key) => SettingError::UnknownKey(key),
                        other => other,
                    })?
                    .apply(&mut settings),
            }
        }
        let mut tenant = Self::new(
            name.ok_or(SettingError::Missing("name"))?,
            socket.ok_or(SettingError::Missing("socket"))?,
        );
        tenant.gpu = gpu;
        tenant.set(settings);
        Ok(tenant)
    }
}

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    /// `FILE:LINE: message`, or `FILE: message` where no line is to blame.
    #[error("{file}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        file: String,
        line: Option<usize>,
        message: String,
    },
}

// What the file may hold, before checking: `deny_unknown_fields` turns a
// misspelt key into an error rather than a setting silently ignored, and
// `Spanned` keeps where each value was, for the messages.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileContents {
    #[serde(default)]
    daemon: Option<Spanned<DaemonTable>>,
    #[serde(default)]
    tenant: Vec<Spanned<TenantTable>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DaemonTable {
    metrics_listen: Option<Spanned<String>>,
    control_socket: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantTable {
    name: Spanned<String>,
    socket: Spanned<String>,
    gpu: Option<Spanned<i64>>,
    listen: Option<Spanned<String>>,
    /// A size (`"16GiB"`) or a number of bytes.
    memory_limit: Option<Spanned<toml::Value>>,
    compute_weight: Option<Spanned<i64>>,
    compute_max: Option<Spanned<String>>,
    priority: Option<Spanned<String>>,
}

impl Config {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        // Sockets are listed and logged by path: absolute ones say where.
        let folder = std::path::absolute(path)
            .ok()
            .and_then(|path| path.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        Self::parse(&text, &file, &folder)
    }

    /// Checks `text`, the contents of `file` (named in errors), whose
    /// relative socket paths are relative to `folder`.
    pub fn parse(text: &str, file: &str, folder: &Path) -> Result<Self, ConfigError> {
        let invalid =
            |span: Option<std::ops::Range<usize>>, message: String| ConfigError::Invalid {
                file: file.to_owned(),
                line: span.map(|span| line_of(text, span.start)),
                message,
            };
        let contents: FileContents =
            toml::from_str(text).map_err(|e| invalid(e.span(), e.message().to_owned()))?;

        let mut daemon = DaemonSettings::default();
        if let Some(table) = contents.daemon.map(Spanned::into_inner) {
            if let Some(listen) = table.metrics_listen {
                let address = listen.get_ref().trim().parse::<SocketAddr>().map_err(|_| {
                    invalid(
                        Some(listen.span()),
                        format!(
                            "metrics_listen: {:?} is not an address and port such as \
                             \"127.0.0.1:9400\"",
                            listen.get_ref()
                        ),
                    )
                })?;
                daemon.metrics_listen = Some(address);
            }
            if let Some(socket) = table.control_socket {
                check_socket_path(socket.get_ref())
                    .map_err(|e| invalid(Some(socket.span()), format!("control_socket: {e}")))?;
                daemon.control_socket = Some(folder.join(socket.get_ref()));
            }
        }

        if contents.tenant.is_empty() {
            return Err(invalid(
                None,
                "no tenant: declare at least one [[tenant]] with a name and a socket".into(),
            ));
        }
        let mut tenants: Vec<TenantConfig> = Vec::new();
        for table in contents.tenant {
            let table = table.into_inner();
            let tenant = Self::tenant(table, folder, &invalid)?;
            if tenants
                .iter()
                .any(|t| t.name == tenant.name.get_ref().as_str())
            {
                return Err(invalid(
                    Some(tenant.name.span()),
                    format!(
                        "a tenant named {:?} is declared twice",
                        tenant.name.get_ref()
                    ),
                ));
            }
            let socket = tenant.config.socket.clone();
            if let Some(other) = tenants.iter().find(|t| t.socket == socket) {
                return Err(invalid(
                    Some(tenant.socket_span),
                    format!(
                        "socket {} is tenant {:?}'s already",
                        socket.display(),
                        other.name
                    ),
                ));
            }
            if let Some(listen) = tenant.config.listen {
                if let Some(other) = tenants.iter().find(|t| t.listen == Some(listen)) {
                    return Err(invalid(
                        tenant.listen_span.clone(),
                        format!("listen {listen} is tenant {:?}'s already", other.name),
                    ));
                }
            }
            if daemon.control_socket.as_ref() == Some(&socket) {
                return Err(invalid(
                    Some(tenant.socket_span),
                    format!("socket {} is the control socket", socket.display()),
                ));
            }
            tenants.push(tenant.config);
        }
        Ok(Self { daemon, tenants })
    }

    /// One `[[tenant]]`, checked.
    fn tenant(
        table: TenantTable,
        folder: &Path,
        invalid: &impl Fn(Option<std::ops::Range<usize>>, String) -> ConfigError,
    ) -> Result<CheckedTenant, ConfigError> {
        let at = |span: std::ops::Range<usize>, key: &str, problem: String| {
            invalid(Some(span), format!("{key}: {problem}"))
        };
        check_tenant_name(table.name.get_ref()).map_err(|e| at(table.name.span(), "name", e))?;
        check_socket_path(table.socket.get_ref())
            .map_err(|e| at(table.socket.span(), "socket", e))?;
        let mut config = TenantConfig::new(
            table.name.get_ref().clone(),
            folder.join(table.socket.get_ref()),
        );
        if let Some(gpu) = table.gpu {
            config.gpu = Some(u32::try_from(*gpu.get_ref()).map_err(|_| {
                at(
                    gpu.span(),
                    "gpu",
                    format!("{} is not a GPU ordinal", gpu.get_ref()),
                )
            })?);
        }
        if let Some(listen) = &table.listen {
            config.listen = Some(listen.get_ref().trim().parse::<SocketAddr>().map_err(|_| {
                at(
                    listen.span(),
                    "listen",
                    format!(
                        "{:?} is not an address and port such as \"0.0.0.0:7450\"",
                        listen.get_ref()
                    ),
                )
            })?);
        }
        if let Some(limit) = table.memory_limit {
            let span = limit.span();
            config.memory_limit = match limit.into_inner() {
                toml::Value::String(text) => parse_memory_limit(&text),
                toml::Value::Integer(bytes) => u64::try_from(bytes)
                    .map(Some)
                    .map_err(|_| format!("{bytes} is not a number of bytes")),
                other => Err(format!(
                    "expected a size such as \"16GiB\", not {}",
                    other.type_str()
                )),
            }
            .map_err(|e| at(span, "memory_limit", e))?;
        }
        if let Some(weight) = table.compute_weight {
            config.compute_weight = check_compute_weight(*weight.get_ref())
                .map_err(|e| at(weight.span(), "compute_weight", e))?;
        }
        if let Some(max) = table.compute_max {
            config.compute_max =
                parse_compute_max(max.get_ref()).map_err(|e| at(max.span(), "compute_max", e))?;
        }
        if let Some(priority) = table.priority {
            config.priority = priority
                .get_ref()
                .parse()
                .map_err(|e| at(priority.span(), "priority", e))?;
        }
        Ok(CheckedTenant {
            config,
            name: table.name,
            socket_span: table.socket.span(),
            listen_span: table.listen.map(|l| l.span()),
        })
    }
}

/// A tenant and where its name and socket were, for the checks between
/// tenants.
struct CheckedTenant {
    config: TenantConfig,
    name: Spanned<String>,
    listen_span: Option<std::ops::Range<usize>>,
    socket_span: std::ops::Range<usize>,
}

/// The 1-based line of byte `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let before = text.as_bytes().get(..offset).unwrap_or(text.as_bytes());
    before.iter().filter(|b| **b == b'\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[daemon]
metrics_listen = "127.0.0.1:9400"
control_socket = "/run/rgpu/control.sock"

[[tenant]]
name = "vm1"
socket = "/run/rgpu/vm1.sock"
gpu = 0
memory_limit = "16GiB"
compute_weight = 100       # 1..10000, default 100
compute_max = "50%"        # optional, 1%..100%
priority = "normal"        # high | normal | low, default normal
listen = "0.0.0.0:7450"

[[tenant]]
name = "batch"
socket = "batch.sock"
gpu = 1
memory_limit = 1048576
compute_weight = 10000
priority = "low"

[[tenant]]
name = "free"
socket = "free.sock"
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "rgpu.toml", Path::new("/etc/rgpu"))
    }

    /// The error's text, which must name the file and, where given, the
    /// line.
    fn error(text: &str) -> String {
        match parse(text) {
            Ok(config) => panic!("accepted: {config:?}\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_good_config_is_read_whole() {
        let config = parse(GOOD).expect("a good config");
        assert_eq!(
            config.daemon,
            DaemonSettings {
                metrics_listen: Some("127.0.0.1:9400".parse().unwrap()),
                control_socket: Some("/run/rgpu/control.sock".into()),
            }
        );
        assert_eq!(
            config.tenants,
            [
                TenantConfig {
                    name: "vm1".into(),
                    socket: "/run/rgpu/vm1.sock".into(),
                    gpu: Some(0),
                    listen: Some("0.0.0.0:7450".parse().unwrap()),
                    memory_limit: Some(16 << 30),
                    compute_weight: 100,
                    compute_max: Some(50),
                    priority: Priority::Normal,
                },
                TenantConfig {
                    name: "batch".into(),
                    // Relative to the file's folder.
                    socket: "/etc/rgpu/batch.sock".into(),
                    gpu: Some(1),
                    listen: None,
                    memory_limit: Some(1 << 20),
                    compute_weight: 10_000,
                    compute_max: None,
                    priority: Priority::Low,
                },
                TenantConfig::new("free", "/etc/rgpu/free.sock"),
            ]
        );
        assert_eq!(config.tenants[2].compute_weight, DEFAULT_COMPUTE_WEIGHT);
        assert_eq!(config.tenants[2].priority, Priority::Normal);

        // [daemon] is optional.
        let minimal = parse("[[tenant]]\nname = \"a\"\nsocket = \"/a.sock\"\n").unwrap();
        assert_eq!(minimal.daemon, DaemonSettings::default());
        assert_eq!(minimal.tenants, [TenantConfig::new("a", "/a.sock")]);
    }

    /// Each bad case, the line it must blame and words its message must
    /// hold.
    #[test]
    fn every_bad_config_names_its_line() {
        let tenant = "[[tenant]]\nname = \"vm1\"\nsocket = \"/vm1.sock\"\n";
        let cases: Vec<(String, usize, &[&str])> = vec![
            // Unknown keys, in each table and at the top.
            (
                format!("{tenant}memory_limt = \"1GiB\"\n"),
                4,
                &["memory_limt", "unknown field"],
            ),
            (
                format!("[daemon]\ncontrol = \"/c.sock\"\n{tenant}"),
                2,
                &["control", "unknown field"],
            ),
            (
                format!("{tenant}[extra]\nx = 1\n"),
                4,
                &["extra", "unknown field"],
            ),
            // Bad units and sizes.
            (
                format!("{tenant}memory_limit = \"16GB2\"\n"),
                4,
                &["memory_limit", "unknown unit"],
            ),
            (
                format!("{tenant}memory_limit = \"lots\"\n"),
                4,
                &["memory_limit", "expected a number of bytes"],
            ),
            (
                format!("{tenant}memory_limit = -1\n"),
                4,
                &["memory_limit", "not a number of bytes"],
            ),
            (
                format!("{tenant}memory_limit = 1.5\n"),
                4,
                &["memory_limit", "expected a size"],
            ),
            // Weights and percentages out of range, or not numbers.
            (
                format!("{tenant}compute_weight = 0\n"),
                4,
                &["compute_weight", "out of range"],
            ),
            (
                format!("{tenant}compute_weight = 10001\n"),
                4,
                &["compute_weight", "out of range"],
            ),
            (
                format!("{tenant}compute_weight = \"100\"\n"),
                4,
                &["invalid type"],
            ),
            (
                format!("{tenant}compute_max = \"0%\"\n"),
                4,
                &["compute_max", "out of range"],
            ),
            (
                format!("{tenant}compute_max = \"101%\"\n"),
                4,
                &["compute_max", "out of range"],
            ),
            (
                format!("{tenant}compute_max = \"50\"\n"),
                4,
                &["compute_max", "percentage"],
            ),
            (
                format!("{tenant}priority = \"urgent\"\n"),
                4,
                &["priority", "high, normal or low"],
            ),
            (
                format!("{tenant}gpu = -1\n"),
                4,
                &["gpu", "not a GPU ordinal"],
            ),
            // Names and sockets.
            (
                "[[tenant]]\nname = \"\"\nsocket = \"/a.sock\"\n".into(),
                2,
                &["name", "may not be empty"],
            ),
            (
                "[[tenant]]\nname = \"vm 1\"\nsocket = \"/a.sock\"\n".into(),
                2,
                &["name", "not allowed"],
            ),
            (
                "[[tenant]]\nname = \"-a\"\nsocket = \"/a.sock\"\n".into(),
                2,
                &["name", "starts with a letter"],
            ),
            (
                "[[tenant]]\nname = \"a\"\nsocket = \"\"\n".into(),
                3,
                &["socket", "may not be empty"],
            ),
            (
                format!("{tenant}\n[[tenant]]\nname = \"vm1\"\nsocket = \"/other.sock\"\n"),
                6,
                &["\"vm1\"", "declared twice"],
            ),
            (
                format!("{tenant}\n[[tenant]]\nname = \"vm2\"\nsocket = \"/vm1.sock\"\n"),
                7,
                &["/vm1.sock", "tenant \"vm1\"'s already"],
            ),
            (
                format!("[daemon]\ncontrol_socket = \"/vm1.sock\"\n{tenant}"),
                5,
                &["/vm1.sock", "control socket"],
            ),
            (
                "[[tenant]]\nname = \"a\"\n".into(),
                1,
                &["missing field", "socket"],
            ),
            // Not TOML at all, and daemon settings.
            (format!("{tenant}memory_limit = \n"), 4, &["must be quoted"]),
            (
                format!("[daemon]\nmetrics_listen = \"localhost\"\n{tenant}"),
                2,
                &["metrics_listen", "address and port"],
            ),
            (
                format!("{tenant}listen = \"everywhere\"\n"),
                4,
                &["listen", "address and port"],
            ),
            (
                format!(
                    "{tenant}listen = \"127.0.0.1:7450\"\n[[tenant]]\nname = \"vm2\"\n\
                     socket = \"/vm2.sock\"\nlisten = \"127.0.0.1:7450\"\n"
                ),
                8,
                &["127.0.0.1:7450", "tenant \"vm1\"'s already"],
            ),
        ];
        for (text, line, words) in cases {
            let message = error(&text);
            assert!(
                message.starts_with(&format!("rgpu.toml:{line}: ")),
                "want line {line}: {message}\n{text}"
            );
            for word in words {
                assert!(message.contains(word), "want {word:?}: {message}\n{text}");
            }
        }
    }

    #[test]
    fn a_config_without_tenants_is_refused() {
        for text in ["", "[daemon]\ncontrol_socket = \"/c.sock\"\n"] {
            let message = error(text);
            assert!(message.starts_with("rgpu.toml: no tenant"), "{message}");
        }
    }

    #[test]
    fn a_missing_file_says_so() {
        let missing = Path::new("/nonexistent/rgpu.toml");
        let message = Config::load(missing).unwrap_err().to_string();
        assert!(
            message.starts_with("cannot read /nonexistent/rgpu.toml: "),
            "{message}"
        );
    }

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size(" 1TB "), Ok(1_000_000_000_000));
        for bad in ["", "MiB", "12XB", "-1GiB", "1.5GiB", "99999999999TiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        for bytes in [0, 1, 1000, 1536 << 10, 256 << 20, 16 << 30, 3 << 40] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
        assert_eq!(format_size(256 << 20), "256MiB");
        assert_eq!(format_size(1536 << 10), "1536KiB");
        assert_eq!(format_size(1000), "1000B");
    }

    #[test]
    fn live_settings_parse_like_the_file() {
        assert_eq!(
            Setting::parse("memory_limit", "8GiB"),
            Ok(Setting::MemoryLimit(Some(8 << 30)))
        );
        assert_eq!(
            Setting::parse("memory_limit", "none"),
            Ok(Setting::MemoryLimit(None))
        );
        assert_eq!(
            Setting::parse("compute_weight", "300"),
            Ok(Setting::ComputeWeight(300))
        );
        assert_eq!(
            Setting::parse("compute_max", "25%"),
            Ok(Setting::ComputeMax(Some(25)))
        );
        assert_eq!(
            Setting::parse("priority", "high"),
            Ok(Setting::Priority(Priority::High))
        );
        assert!(matches!(
            Setting::parse("compute_weight", "0"),
            Err(SettingError::BadValue { .. })
        ));
        assert!(matches!(
            Setting::parse("socket", "/x"),
            Err(SettingError::NotLive(_))
        ));
        assert!(matches!(
            Setting::parse("colour", "red"),
            Err(SettingError::UnknownKey(_))
        ));

        let mut settings = TenantSettings::default();
        Setting::ComputeMax(Some(10)).apply(&mut settings);
        Setting::MemoryLimit(Some(1)).apply(&mut settings);
        assert_eq!(settings.compute_max, Some(10));
        assert_eq!(settings.memory_limit, Some(1));
    }

    #[test]
    fn a_tenant_from_pairs() {
        let tenant = TenantConfig::from_pairs([
            ("name", "vm3"),
            ("socket", "/run/vm3.sock"),
            ("gpu", "2"),
            ("memory_limit", "1GiB"),
            ("priority", "high"),
        ])
        .unwrap();
        let mut want = TenantConfig::new("vm3", "/run/vm3.sock");
        want.gpu = Some(2);
        want.memory_limit = Some(1 << 30);
        want.priority = Priority::High;
        assert_eq!(tenant, want);

        let refused =
            |pairs: &[(&str, &str)]| TenantConfig::from_pairs(pairs.iter().copied()).unwrap_err();
        assert_eq!(refused(&[("socket", "/a")]), SettingError::Missing("name"));
        assert_eq!(refused(&[("name", "a")]), SettingError::Missing("socket"));
        assert_eq!(
            refused(&[("name", "a"), ("name", "b")]),
            SettingError::Repeated("name".into())
        );
        assert!(matches!(
            refused(&[("name", ""), ("socket", "/a")]),
            SettingError::BadValue { .. }
        ));
        assert!(matches!(
            refused(&[("name", "a"), ("socket", "/a"), ("colour", "red")]),
            SettingError::UnknownKey(_)
        ));
    }
}
