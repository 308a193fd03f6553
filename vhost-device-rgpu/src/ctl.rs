//! `vhost-device-rgpu ctl`: tenants of a running daemon, listed and changed
//! live through its control socket ([`crate::control`] has the protocol).
//!
//! ```text
//! vhost-device-rgpu ctl --control-socket /run/rgpu/control.sock list
//! vhost-device-rgpu ctl --control-socket ... set vm1 memory_limit=8GiB compute_weight=300
//! vhost-device-rgpu ctl --control-socket ... add name=vm3 socket=/run/rgpu/vm3.sock memory_limit=4GiB
//! vhost-device-rgpu ctl --control-socket ... remove vm3
//! ```
//!
//! A refusal (unknown tenant, bad value) is printed on stderr and the exit
//! status is 1.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::format_size;
use crate::control::{self, Answer, ControlError, Request, TenantEntry};

/// Arguments of `vhost-device-rgpu ctl`.
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The daemon's control socket (its --control-socket, or
    /// `control_socket` in its config).
    #[arg(long, value_name = "PATH")]
    control_socket: PathBuf,
    /// Print the daemon's answer as it came (one line of JSON).
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CtlCommand {
    /// Every tenant: its socket, GPU, memory limit and use, compute weight
    /// and cap, priority, live connections and sessions, and the GPU time
    /// its work has taken.
    List,
    /// Change a tenant's settings live: memory_limit=SIZE|none,
    /// compute_weight=1..10000, compute_max=1%..100%|none,
    /// priority=high|normal|low. A memory limit lowered below what the
    /// tenant holds refuses new allocations and takes nothing away.
    Set {
        /// The tenant.
        name: String,
        #[arg(value_name = "KEY=VALUE", required = true)]
        settings: Vec<String>,
    },
    /// Start serving a new tenant: name=NAME socket=PATH, and optionally
    /// gpu=N and any setting `set` takes.
    Add {
        #[arg(value_name = "KEY=VALUE", required = true)]
        settings: Vec<String>,
    },
    /// Stop serving a tenant: its socket is closed and removed, its
    /// processes end (its guests lose the GPU).
    Remove {
        /// The tenant.
        name: String,
    },
}

/// `KEY=VALUE` words as pairs.
fn pairs(words: &[String]) -> Result<Vec<(String, String)>, ControlError> {
    words
        .iter()
        .map(|word| match word.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(ControlError::BadRequest(format!(
                "{word:?} is not KEY=VALUE"
            ))),
        })
        .collect()
}

fn request(command: &CtlCommand) -> Result<Request, ControlError> {
    Ok(match command {
        CtlCommand::List => Request::List,
        CtlCommand::Set { name, settings } => Request::Set {
            name: name.clone(),
            settings: pairs(settings)?,
        },
        CtlCommand::Add { settings } => {
            let mut settings = pairs(settings)?;
            // The daemon's working folder is not ours: a relative socket
            // is relative to where ctl runs.
            for (key, value) in &mut settings {
                if key == "socket" && PathBuf::from(&*value).is_relative() && !value.is_empty() {
                    let here = std::env::current_dir().map_err(|e| {
                        ControlError::BadRequest(format!(
                            "socket {value:?} is relative and the current folder is unknown: {e}"
                        ))
                    })?;
                    *value = here.join(&*value).display().to_string();
                }
            }
            Request::Add { settings }
        }
        CtlCommand::Remove { name } => Request::Remove { name: name.clone() },
    })
}

/// The tenants as a table, one line each.
pub fn table(entries: &[TenantEntry]) -> String {
    let header = [
        "NAME",
        "SOCKET",
        "GPU",
        "MEMORY_LIMIT",
        "MEMORY_USED",
        "WEIGHT",
        "CAP",
        "PRIORITY",
        "CONNECTIONS",
        "SESSIONS",
        "GPU_SECONDS",
    ];
    let rows: Vec<[String; 11]> = entries
        .iter()
        .map(|t| {
            [
                t.name.clone(),
                t.socket.clone(),
                t.gpu.to_string(),
                t.memory_limit
                    .map_or_else(|| "none".to_owned(), format_size),
                format_size(t.memory_used),
                t.compute_weight.to_string(),
                t.compute_max
                    .map_or_else(|| "none".to_owned(), |p| format!("{p}%")),
                t.priority.clone(),
                t.connections.to_string(),
                t.sessions.to_string(),
                format!("{:.3}", t.gpu_busy_ms as f64 / 1e3),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut text = line(header.to_vec());
    for row in &rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

pub fn run(args: CtlArgs) -> ExitCode {
    let result = request(&args.command).and_then(|request| {
        let entries = control::ask(&args.control_socket, &request)?;
        Ok((request, entries))
    });
    match result {
        Ok((request, entries)) => {
            if args.json {
                let answer = Answer {
                    ok: true,
                    error: None,
                    tenants: entries,
                };
                match serde_json::to_string(&answer) {
                    Ok(line) => println!("{line}"),
                    Err(e) => {
                        eprintln!("vhost-device-rgpu ctl: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else if let Request::Remove { name } = request {
                println!("removed {name}");
            } else {
                print!("{}", table(&entries));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vhost-device-rgpu ctl: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lines_up_and_says_none() {
        let entry = |name: &str, limit, max| TenantEntry {
            name: name.into(),
            socket: format!("/run/{name}.sock"),
            gpu: 0,
            memory_limit: limit,
            memory_used: 160 << 20,
            compute_weight: 300,
            compute_max: max,
            priority: "high".into(),
            connections: 1,
            sessions: 2,
            gpu_busy_ms: 1500,
        };
        let text = table(&[
            entry("vm1", Some(128 << 20), Some(50)),
            entry("unlimited", None, None),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "NAME       SOCKET               GPU  MEMORY_LIMIT  MEMORY_USED  WEIGHT  CAP   \
                 PRIORITY  CONNECTIONS  SESSIONS  GPU_SECONDS",
                "vm1        /run/vm1.sock        0    128MiB        160MiB       300     50%   \
                 high      1            2         1.500",
                "unlimited  /run/unlimited.sock  0    none          160MiB       300     none  \
                 high      1            2         1.500",
            ]
        );
    }

    #[test]
    fn words_must_be_key_value() {
        assert!(pairs(&["memory_limit=1GiB".into()]).is_ok());
        assert!(pairs(&["memory_limit".into()]).is_err());
        assert!(pairs(&["=1".into()]).is_err());
    }
}
