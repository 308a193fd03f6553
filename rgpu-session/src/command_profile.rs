//! Where a session's time goes, for finding the gaps against native CUDA
//! (issue 9): with the daemon's `--profile-launches`
//! (`RGPU_PROFILE_LAUNCHES=1`), each session times the stages of every
//! kernel launch and of every `cuCtxSynchronize` the guest waits for (the
//! synchronous round trip), and logs the averages and medians of each
//! (info level) when it ends. Off, it costs one branch per command.

use std::time::{Duration, Instant};

use rgpu_proto::stage_samples::StageSamples;

/// The stages of one kind of command: read and decode from the ring,
/// execute (the handle lookups and the driver's call), and the bookkeeping
/// after it (the reply included).
#[derive(Debug)]
pub struct CommandProfile {
    /// What is counted, plural ("launches").
    kind: &'static str,
    commands: u64,
    read: Duration,
    execute: Duration,
    after: Duration,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Each command's stages (read, execute, after), for medians: the
    /// averages of synchronizations mix the idle round trips with those
    /// behind launch bursts.
    samples: StageSamples<3>,
}

impl CommandProfile {
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            commands: 0,
            read: Duration::ZERO,
            execute: Duration::ZERO,
            after: Duration::ZERO,
            first: None,
            last: None,
            samples: StageSamples::default(),
        }
    }

    /// One command: read from `read_at` to `execute_at`, executed until
    /// `executed_at`, its bookkeeping done at `done_at`.
    pub fn add(
        &mut self,
        read_at: Instant,
        execute_at: Instant,
        executed_at: Instant,
        done_at: Instant,
    ) {
        self.commands += 1;
        let read = execute_at.saturating_duration_since(read_at);
        let execute = executed_at.saturating_duration_since(execute_at);
        let after = done_at.saturating_duration_since(executed_at);
        self.read += read;
        self.execute += execute;
        self.after += after;
        self.samples.push([read, execute, after]);
        self.first.get_or_insert(read_at);
        self.last = Some(done_at);
    }

    /// The averages and medians, in nanoseconds per command; `None` before
    /// any.
    pub fn summary(&self) -> Option<String> {
        let (first, last) = (self.first?, self.last?);
        let per = |d: Duration| d.as_nanos() / u128::from(self.commands.max(1));
        let span = last.saturating_duration_since(first);
        let busy = self.read + self.execute + self.after;
        Some(format!(
            "{} {} in {:.1} ms, {} ns each: read {} ns, execute {} ns, after {} ns, \
             other commands and waiting {} ns; medians: read {} ns, execute {} ns, after {} ns",
            self.commands,
            self.kind,
            span.as_secs_f64() * 1e3,
            per(span),
            per(self.read),
            per(self.execute),
            per(self.after),
            per(span.saturating_sub(busy)),
            self.samples.median(0),
            self.samples.median(1),
            self.samples.median(2),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_averages_each_stage() {
        let mut profile = CommandProfile::new("launches");
        assert_eq!(profile.summary(), None);
        let t0 = Instant::now();
        let us = Duration::from_micros;
        profile.add(t0, t0 + us(1), t0 + us(4), t0 + us(5));
        profile.add(t0 + us(10), t0 + us(12), t0 + us(16), t0 + us(17));
        profile.add(t0 + us(20), t0 + us(23), t0 + us(33), t0 + us(36));
        let summary = profile.summary().unwrap();
        assert_eq!(
            summary,
            "3 launches in 0.0 ms, 12000 ns each: read 2000 ns, execute 5666 ns, after 1666 ns, \
             other commands and waiting 2666 ns; medians: read 2000 ns, execute 4000 ns, \
             after 1000 ns"
        );
    }
}
