//! Where a waited call's time goes on the guest's side (issue 9): with
//! `RGPU_PROFILE_CALLS=1`, a ring channel times the two halves of every
//! call it waits for, writing the command (encoding, room, the copy into
//! the ring, publishing) and waiting for the answer (both cache-line
//! transfers and the host's side) until it is read, and logs their
//! medians (info level: `RGPU_LOG=info`) as the channel closes. Beside the daemon's
//! `--profile-launches` (the worker's read, execute and after) it splits
//! the synchronous round trip. Off, it costs one branch per call.

use std::time::Instant;

use rgpu_proto::stage_samples::StageSamples;

#[derive(Debug, Default)]
pub struct CallProfile {
    calls: u64,
    /// Each call's writing and waiting.
    samples: StageSamples<2>,
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

    /// The medians; `None` before any call.
    pub fn summary(&self) -> Option<String> {
        (self.calls > 0).then(|| {
            format!(
                "{} waited calls; medians: writing {} ns, waiting for the answer and reading it {} ns",
                self.calls,
                self.samples.median(0),
                self.samples.median(1)
            )
        })
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
}
