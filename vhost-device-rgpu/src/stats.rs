//! The stats socket: every connection gets one line of JSON with the
//! daemon's counters, then the socket is closed.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::thread;

use log::{debug, warn};
use rgpu_session::Counters;

/// One JSON line: the executor kind and every field of [`Counters`].
pub fn stats_line(executor: &str, counters: &Counters) -> String {
    let mut line = format!("{{\"executor\":\"{}\"", json_escape(executor));
    for (name, _, value) in counters.fields() {
        line.push_str(&format!(",\"{name}\":{}", Counters::get(value)));
    }
    line.push_str("}\n");
    line
}

fn json_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c if c.is_control() => format!("\\u{:04x}", u32::from(c)).chars().collect(),
            c => vec![c],
        })
        .collect()
}

/// Answers connections on `listener` from a thread of its own, for the life
/// of the process, with the counters `snapshot` returns at that moment.
pub fn spawn(
    listener: UnixListener,
    executor: &'static str,
    snapshot: impl Fn() -> Counters + Send + 'static,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("rgpu-stats".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(mut stream) => {
                        // A reader that went away is its own problem.
                        if let Err(e) =
                            stream.write_all(stats_line(executor, &snapshot()).as_bytes())
                        {
                            debug!("stats socket: {e}");
                        }
                    }
                    Err(e) => warn!("stats socket: accept failed: {e}"),
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    #[test]
    fn line_has_every_counter() {
        let counters = Counters::default();
        Counters::add(&counters.connections_total, 3);
        Counters::add(&counters.zero_copy_bytes, 1 << 40);
        let line = stats_line("sim", &counters);
        assert_eq!(
            line,
            "{\"executor\":\"sim\",\"connections_active\":0,\"connections_total\":3,\
             \"sessions_active\":0,\"sessions_total\":0,\"device_memory_bytes\":0,\
             \"commands_executed\":0,\"command_errors\":0,\"zero_copy_bytes\":1099511627776,\
             \"staged_bytes\":0,\"host_cpu_copy_bytes\":0,\"dma_registered_bytes\":0,\
             \"unregistered_copy_bytes\":0,\"module_cache_hits\":0,\"workers_active\":0,\
             \"workers_total\":0,\"gpu_busy_sessions\":0,\"gpu_waiting_sessions\":0,\
             \"wake_word_wakeups\":0,\"doorbell_wakeups\":0}\n"
        );
        assert_eq!(json_escape("a\"b\n"), "a\\\"b\\u000a");
    }

    #[test]
    fn socket_answers_one_line_per_connection() {
        let path = std::env::temp_dir().join(format!("rgpu-stats-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = asked.clone();
        spawn(UnixListener::bind(&path).unwrap(), "sim", move || {
            let counters = Counters::default();
            Counters::add(&counters.sessions_total, Counters::get(&seen) + 1);
            Counters::add(&seen, 1);
            counters
        })
        .unwrap();
        for expected in 1..=2 {
            let mut answer = String::new();
            UnixStream::connect(&path)
                .unwrap()
                .read_to_string(&mut answer)
                .unwrap();
            assert!(
                answer.contains(&format!("\"sessions_total\":{expected},")),
                "{answer}"
            );
            assert!(answer.ends_with("}\n"));
        }
        std::fs::remove_file(&path).unwrap();
    }
}
