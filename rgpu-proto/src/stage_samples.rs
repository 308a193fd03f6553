//! Stage timings that the diagnostic profiles of both ends keep (issue 9:
//! the daemon's `--profile-launches`, guest-lib's `RGPU_PROFILE_CALLS`):
//! each call's stages in nanoseconds, the first [`MAX_SAMPLES`] calls,
//! and their medians.

use std::time::Duration;

/// Calls kept (3 MiB for three stages).
pub const MAX_SAMPLES: usize = 1 << 18;

#[derive(Debug, Default)]
pub struct StageSamples<const N: usize> {
    samples: Vec<[u32; N]>,
}

impl<const N: usize> StageSamples<N> {
    /// One call's stages; past [`MAX_SAMPLES`] calls, not kept.
    pub fn push(&mut self, stages: [Duration; N]) {
        if self.samples.len() < MAX_SAMPLES {
            self.samples
                .push(stages.map(|d| u32::try_from(d.as_nanos()).unwrap_or(u32::MAX)));
        }
    }

    /// The median of stage `stage` in nanoseconds (0 before any call).
    pub fn median(&self, stage: usize) -> u32 {
        let mut values: Vec<u32> = self
            .samples
            .iter()
            .filter_map(|s| s.get(stage).copied())
            .collect();
        values.sort_unstable();
        values.get(values.len() / 2).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_are_per_stage_and_saturate() {
        let mut samples = StageSamples::<2>::default();
        assert_eq!(samples.median(0), 0);
        let ns = Duration::from_nanos;
        samples.push([ns(5), ns(40)]);
        samples.push([ns(1), ns(10)]);
        samples.push([ns(3), Duration::from_secs(10)]);
        assert_eq!(samples.median(0), 3);
        assert_eq!(samples.median(1), 40);
        samples.push([ns(0), Duration::from_secs(10)]);
        assert_eq!(samples.median(1), u32::MAX);
        assert_eq!(samples.median(2), 0);
    }
}
