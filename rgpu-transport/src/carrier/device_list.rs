//! `RGPU_DEVICES`: several carriers in one process, one CUDA device each
//! (ARCHITECTURE.md §6).
//!
//! The value is a comma-separated list; each entry is one of
//! - a local daemon's socket: a path with a `/` in it (`/run/rgpu.sock`,
//!   `./rgpu.sock`) or `unix:PATH`;
//! - `drm`: the render node of the virtio-gpu device (VM mode);
//! - `tls://HOST:PORT` or `tcp://HOST:PORT`: a remote daemon.
//!
//! Spaces around entries are ignored; paths cannot contain commas.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{drm, local, remote, Carrier, CarrierError};

/// The environment variable this module reads.
pub const VARIABLE: &str = "RGPU_DEVICES";

/// One entry of the list, parsed but not opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarrierSpec {
    /// A local daemon's socket.
    Socket(PathBuf),
    /// The render node of the virtio-gpu device that offers the rgpu capset.
    Drm,
    /// A remote daemon: the URL as given (`tls://` or `tcp://`).
    Remote(String),
}

impl std::fmt::Display for CarrierSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Socket(path) => write!(f, "{}", path.display()),
            Self::Drm => f.write_str("drm"),
            Self::Remote(url) => f.write_str(url),
        }
    }
}

/// What a valid entry looks like, for error messages.
const EXPECTED: &str = "give a socket path (/path/daemon.sock or unix:PATH), drm, \
                        tls://HOST:PORT or tcp://HOST:PORT";

fn bad_entry(index: usize, entry: &str, reason: impl Into<String>) -> CarrierError {
    CarrierError::BadDeviceEntry {
        index,
        entry: entry.to_owned(),
        reason: reason.into(),
    }
}

/// Parses an `RGPU_DEVICES` value; the error names the first bad entry
/// (counted from 0, as the devices are).
pub fn parse(list: &str) -> Result<Vec<CarrierSpec>, CarrierError> {
    list.split(',')
        .enumerate()
        .map(|(index, raw)| parse_entry(index, raw.trim()))
        .collect()
}

fn parse_entry(index: usize, entry: &str) -> Result<CarrierSpec, CarrierError> {
    if entry.is_empty() {
        return Err(bad_entry(index, entry, format!("empty entry: {EXPECTED}")));
    }
    if entry == "drm" {
        return Ok(CarrierSpec::Drm);
    }
    if let Some(path) = entry.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(bad_entry(index, entry, "unix: needs a socket path"));
        }
        return Ok(CarrierSpec::Socket(PathBuf::from(path)));
    }
    if let Some((scheme, address)) = entry.split_once("://") {
        if scheme != "tls" && scheme != "tcp" {
            return Err(bad_entry(
                index,
                entry,
                format!("unknown scheme {scheme}://: {EXPECTED}"),
            ));
        }
        // The address is checked here so that a typo is named before any
        // carrier is opened; the remote carrier parses it again.
        let address = address.trim_end_matches('/');
        let valid = address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid {
            return Err(bad_entry(
                index,
                entry,
                format!("the address needs a host and a port: {scheme}://HOST:PORT"),
            ));
        }
        return Ok(CarrierSpec::Remote(entry.to_owned()));
    }
    // A bare word is more likely a misspelt keyword than a socket in the
    // current directory: sockets need a slash.
    if entry.contains('/') {
        return Ok(CarrierSpec::Socket(PathBuf::from(entry)));
    }
    Err(bad_entry(
        index,
        entry,
        format!("not a carrier: {EXPECTED}"),
    ))
}

/// Opens one entry; `dri_dir` is where `drm` looks for render nodes.
pub fn open(spec: &CarrierSpec, dri_dir: &Path) -> Result<Arc<dyn Carrier>, CarrierError> {
    Ok(match spec {
        CarrierSpec::Socket(path) => Arc::new(local::LocalCarrier::connect(path)?),
        CarrierSpec::Drm => Arc::new(drm::DrmCarrier::open_in(dri_dir)?),
        CarrierSpec::Remote(url) => {
            let name = crate::process_tag::process_name();
            Arc::new(remote::RemoteCarrier::connect(url, &name)?)
        }
    })
}

/// Opens every entry, in order; the error names the entry that failed.
pub fn open_all(
    specs: &[CarrierSpec],
    dri_dir: &Path,
) -> Result<Vec<Arc<dyn Carrier>>, CarrierError> {
    specs
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            open(spec, dri_dir).map_err(|source| CarrierError::DeviceEntry {
                index,
                entry: spec.to_string(),
                source: Box::new(source),
            })
        })
        .collect()
}

/// The list `RGPU_DEVICES` holds: `None` when it is unset or empty.
pub fn from_env() -> Result<Option<Vec<CarrierSpec>>, CarrierError> {
    match std::env::var(VARIABLE) {
        Ok(list) if !list.trim().is_empty() => parse(&list).map(Some),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(CarrierError::BadDeviceList("not valid UTF-8".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_text(list: &str) -> String {
        match parse(list) {
            Ok(specs) => panic!("{list:?} parsed as {specs:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_kind_of_entry_parses_in_order() {
        let specs = parse(
            "/run/a.sock, unix:/run/b.sock,drm,tls://gpu1.example:7300,tcp://[::1]:7301/,./c.sock",
        )
        .unwrap();
        assert_eq!(
            specs,
            vec![
                CarrierSpec::Socket("/run/a.sock".into()),
                CarrierSpec::Socket("/run/b.sock".into()),
                CarrierSpec::Drm,
                CarrierSpec::Remote("tls://gpu1.example:7300".into()),
                CarrierSpec::Remote("tcp://[::1]:7301/".into()),
                CarrierSpec::Socket("./c.sock".into()),
            ]
        );
        assert_eq!(parse("unix:rel.sock").unwrap()[0].to_string(), "rel.sock");
    }

    #[test]
    fn bad_entries_are_named_with_their_position() {
        let text = error_text("/run/a.sock,drn");
        assert!(text.contains("RGPU_DEVICES entry 1 (\"drn\")"), "{text}");
        assert!(text.contains("not a carrier"), "{text}");

        let text = error_text("/run/a.sock,,drm");
        assert!(text.contains("entry 1 (\"\")"), "{text}");
        assert!(text.contains("empty entry"), "{text}");

        let text = error_text("drm,");
        assert!(text.contains("entry 1"), "{text}");

        let text = error_text("http://host:80");
        assert!(text.contains("entry 0 (\"http://host:80\")"), "{text}");
        assert!(text.contains("unknown scheme http://"), "{text}");

        for bad in [
            "tls://host",
            "tls://:7300",
            "tcp://host:port",
            "tls://host:70000",
        ] {
            let text = error_text(&format!("drm,{bad}"));
            assert!(text.contains(&format!("entry 1 (\"{bad}\")")), "{text}");
            assert!(text.contains("host and a port"), "{text}");
        }

        let text = error_text("unix:");
        assert!(text.contains("unix: needs a socket path"), "{text}");
    }

    #[test]
    fn an_entry_that_cannot_be_opened_is_named() {
        let missing =
            std::env::temp_dir().join(format!("rgpu-transport-{}-absent.sock", std::process::id()));
        let specs = vec![CarrierSpec::Socket(missing.clone())];
        let err = match open_all(&specs, Path::new("/nonexistent-dri")) {
            Ok(_) => panic!("an absent socket opened"),
            Err(e) => e,
        };
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "RGPU_DEVICES entry 0 ({:?}): ",
                missing.display().to_string()
            )),
            "{text}"
        );
        assert!(matches!(err.root(), CarrierError::Connect { .. }), "{text}");
    }
}
