//! The daemon's stats socket: one line of flat JSON per connection, e.g.
//! `{"executor":"sim","connections_active":1,"sessions_active":1,...}`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One answer of the stats socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub executor: String,
    numbers: BTreeMap<String, u64>,
}

impl Stats {
    /// Connects, reads the line and parses it.
    pub fn read(socket: &Path) -> Result<Self, String> {
        let stream = UnixStream::connect(socket)
            .map_err(|e| format!("connect to stats socket {}: {e}", socket.display()))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(stream)
            .read_line(&mut line)
            .map_err(|e| format!("read stats: {e}"))?;
        Self::parse(&line)
    }

    /// Parses a flat JSON object whose values are numbers or strings without
    /// commas or quotes (all the stats socket sends).
    pub fn parse(line: &str) -> Result<Self, String> {
        let body = line
            .trim()
            .strip_prefix('{')
            .and_then(|s| s.strip_suffix('}'))
            .ok_or_else(|| format!("stats line is not a JSON object: {line:?}"))?;
        let mut stats = Stats::default();
        for field in body.split(',').filter(|f| !f.trim().is_empty()) {
            let (key, value) = field
                .split_once(':')
                .ok_or_else(|| format!("bad stats field {field:?}"))?;
            let key = key.trim().trim_matches('"').to_string();
            let value = value.trim();
            if let Some(text) = value.strip_prefix('"') {
                if key == "executor" {
                    stats.executor = text.trim_end_matches('"').to_string();
                }
            } else {
                let number = value
                    .parse::<u64>()
                    .map_err(|e| format!("stats field {key}: {value:?}: {e}"))?;
                stats.numbers.insert(key, number);
            }
        }
        Ok(stats)
    }

    /// A numeric field; panics naming the field when the daemon did not send
    /// it (a test expecting it must fail loudly).
    pub fn get(&self, key: &str) -> u64 {
        match self.numbers.get(key) {
            Some(v) => *v,
            None => panic!("stats have no field {key:?}: {self:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_line() {
        let s = Stats::parse(
            "{\"executor\":\"sim\",\"connections_active\":2,\"sessions_active\":1,\"staged_bytes\":4096}\n",
        )
        .unwrap();
        assert_eq!(s.executor, "sim");
        assert_eq!(s.get("connections_active"), 2);
        assert_eq!(s.get("sessions_active"), 1);
        assert_eq!(s.get("staged_bytes"), 4096);
    }

    #[test]
    fn rejects_garbage() {
        assert!(Stats::parse("not json").is_err());
        assert!(Stats::parse("{\"a\":x}").is_err());
    }
}
