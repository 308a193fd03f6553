//! Where a waited call's time goes on the guest's side (issue 9): with
//! `RGPU_PROFILE_CALLS=1`, a ring channel times the two halves of every
//! call it waits for, writing the command (encoding, room, the copy into
//! the ring, publishing) and waiting for the answer (both cache-line
//! transfers and the host's side) until it is read, and logs their
//! medians (info level: `RGPU_LOG=info`) as the channel closes. Beside the daemon's
//! `--profile-launches` (the worker's read, execute and after) it splits
//! the synchronous round trip. It also counts the commands written, by
//! name, and every wait for the host by what was waited for (a reply to a
//! named command, room in the ring, a copy's earlier pieces): how often an
//! application stops for the host, and for how long in all. Off, it costs
//! one branch per call.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rgpu_proto::stage_samples::StageSamples;

#[derive(Debug, Default)]
pub struct CallProfile {
    calls: u64,
    /// Each call's writing and waiting.
    samples: StageSamples<2>,
    /// Commands written, by name.
    commands: BTreeMap<&'static str, u64>,
    /// Waits for the host by what was waited for: how many, how long.
    waits: BTreeMap<&'static str, (u64, Duration)>,
}

impl CallProfile {
    /// Whether the environment asks for one (`RGPU_PROFILE_CALLS=1`).
    pub fn wanted() -> bool {
        std::env::var("RGPU_PROFILE_CALLS").is_ok_and(|v| v.trim() == "1")
    }

    /// One call: started at `started`, its command published at
    /// `written`, its answer read at `answered`.
    pub fn add(&mut self, started: Instant, written: Instant, answered: Instant) {
        self.calls += 1;
        self.samples.push([
            written.saturating_duration_since(started),
            answered.saturating_duration_since(written),
        ]);
    }

    /// One command written.
    pub fn add_command(&mut self, name: &'static str) {
        *self.commands.entry(name).or_default() += 1;
    }

    /// One wait for `what`, from `began` until now.
    pub fn add_wait(&mut self, what: &'static str, began: Instant) {
        let (count, total) = self.waits.entry(what).or_default();
        *count += 1;
        *total += began.elapsed();
    }

    /// The medians, the commands and the waits; `None` before any command.
    pub fn summary(&self) -> Option<String> {
        if self.calls == 0 && self.commands.is_empty() {
            return None;
        }
        let mut summary = format!(
            "{} waited calls; medians: writing {} ns, waiting for the answer and reading it {} ns",
            self.calls,
            self.samples.median(0),
            self.samples.median(1)
        );
        if !self.commands.is_empty() {
            let mut commands: Vec<_> = self.commands.iter().collect();
            commands.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let commands: Vec<String> = commands
                .iter()
                .map(|(name, count)| format!("{name} {count}"))
                .collect();
            summary += &format!("; commands: {}", commands.join(", "));
        }
        if !self.waits.is_empty() {
            let mut waits: Vec<_> = self.waits.iter().collect();
            waits.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(b.0)));
            let waits: Vec<String> = waits
                .iter()
                .map(|(what, (count, total))| {
                    format!("{what} {count} ({:.3} ms)", total.as_secs_f64() * 1e3)
                })
                .collect();
            summary += &format!("; waits: {}", waits.join(", "));
        }
        Some(summary)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_summary_gives_each_half_its_median() {
        let mut profile = CallProfile::default();
        assert_eq!(profile.summary(), None);
        let t0 = Instant::now();
        let ns = Duration::from_nanos;
        profile.add(t0, t0 + ns(100), t0 + ns(1100));
        profile.add(t0, t0 + ns(300), t0 + ns(700));
        profile.add(t0, t0 + ns(200), t0 + ns(5200));
        assert_eq!(
            profile.summary().as_deref(),
            Some(
                "3 waited calls; medians: writing 200 ns, waiting for the answer and reading it \
                 1000 ns"
            )
        );
    }

    #[test]
    fn commands_and_waits_are_listed_most_first() {
        let mut profile = CallProfile::default();
        for name in ["LaunchKernel", "CtxSynchronize", "LaunchKernel"] {
            profile.add_command(name);
        }
        let long_ago = Instant::now() - Duration::from_millis(5);
        profile.add_wait("room in the ring", Instant::now());
        profile.add_wait("CtxSynchronize", long_ago);
        let summary = profile.summary().unwrap_or_default();
        assert!(
            summary.contains(
                "; commands: LaunchKernel 2, CtxSynchronize 1; waits: CtxSynchronize 1 ("
            ),
            "{summary}"
        );
        assert!(summary.contains("), room in the ring 1 (0.0"), "{summary}");
    }
}
