//! The GPU-time scheduler (ARCHITECTURE.md §5a): one thread in the parent
//! that grants tenants their turns on each GPU through their tenant pages.
//!
//! - A tenant alone on its GPU, uncapped, runs unarbitrated
//!   ([`GRANT_FREE`]): work-conserving, and its sessions only sample fences.
//! - As soon as two tenants have work (or one is capped), one tenant at a
//!   time holds the GPU ([`GRANT_FENCED`]: its sessions fence every
//!   submission and keep few ahead) and the rest wait. The holder keeps it
//!   until its virtual time (GPU time divided by `compute_weight`) is a
//!   [`QUANTUM`] of its own ahead of a waiting tenant's, then hands it to
//!   the tenant with the least virtual time, after draining:
//!   its sessions wait for their own fences, and the time that takes is
//!   charged to it. So contended GPU time follows the weights.
//! - `compute_max` is a token bucket: GPU time refills it at the cap's rate
//!   and a tenant whose bucket is empty waits, even on an idle GPU.
//! - `priority`: only tenants of the highest priority present may hold the
//!   GPU. A tenant is present while it has work, and for [`HOLD`] after its
//!   last submission or work, so a latency-bound tenant that synchronizes after each
//!   kernel keeps the lower ones off between its kernels.
//!
//! GPU time is what the tenants' sessions measure (from a submission until
//! its fence completes, [`crate::tenant_page::TenantPage::compute_use`]); while the scheduler
//! arbitrates only one tenant runs at a time, so it is the tenant's own.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::config::Priority;
use crate::tenant_page::{monotonic_ns, ComputeUse, GRANT_FENCED, GRANT_FREE, GRANT_WAIT};
use crate::tenants::Tenants;

/// How far (in its own GPU time) a holder may run ahead of a waiting
/// tenant's virtual time before it hands over.
pub const QUANTUM: Duration = Duration::from_millis(10);
/// How long after its last submission or work a tenant still counts as
/// present (for priority, and for whether tenants contend at all).
pub const HOLD: Duration = Duration::from_millis(3);
/// A holder without work for this long gives the GPU to one that has some
/// (shorter gaps are a guest between a synchronization and its next
/// launch).
const IDLE_GRACE: Duration = Duration::from_millis(1);
/// A tenant without work for longer than this comes back level with the
/// others (shorter gaps keep the credit its weight earned).
const REJOIN: Duration = Duration::from_millis(100);
/// How often the scheduler looks while guests hold contexts: a tenant
/// starts unarbitrated, and what it queues before the scheduler sees a
/// second one is beyond its turns (the driver time-slices it).
const TICK: Duration = Duration::from_micros(200);
/// How often it looks while no guest holds a context.
const IDLE_TICK: Duration = Duration::from_millis(5);
/// A capped tenant's bucket holds at most this long at its cap's rate.
const CAP_BURST: Duration = Duration::from_millis(20);
/// A drain that takes longer (a kernel that never ends, with no kernel
/// watchdog) no longer keeps every other tenant off the GPU.
const DRAIN_MAX: Duration = Duration::from_secs(2);

fn ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A tenant as the policy sees it at one step.
#[derive(Debug, Clone)]
pub struct TenantView {
    pub name: String,
    pub usage: ComputeUse,
    pub weight: u32,
    /// `compute_max` in percent.
    pub max_percent: Option<u8>,
    pub priority: Priority,
}

impl TenantView {
    fn has_work(&self) -> bool {
        self.usage.busy_sessions > 0 || self.usage.waiting_sessions > 0
    }
}

/// What the policy remembers of a tenant between steps.
#[derive(Debug, Default)]
struct Account {
    /// GPU time seen at the last step.
    seen_busy_ns: u64,
    /// Added to the tenant's virtual time (so that one returning from idle
    /// does not bank its idle time as credit).
    vtime_offset: f64,
    /// `compute_max`'s bucket, in nanoseconds of GPU time.
    tokens_ns: f64,
    /// The last step that saw it with work.
    last_work_ns: u64,
}

#[derive(Debug, Clone, PartialEq)]
enum Turn {
    /// Nobody contends: every uncapped tenant runs freely.
    Open,
    /// Arbitrating, and nobody holds the GPU.
    Idle,
    Holding {
        tenant: String,
    },
    /// The former holder's work finishes before anyone else's starts.
    Draining {
        tenant: String,
        since: u64,
    },
}

/// One step's decision.
#[derive(Debug, PartialEq)]
pub struct Decision {
    /// A `GRANT_` value per tenant, in the order of the views.
    pub grants: Vec<u32>,
    /// Look again after this long at the latest.
    pub next: Duration,
    /// The tenant being drained (wake on its last busy session).
    pub draining: Option<String>,
}

/// The scheduling policy of one GPU, free of clocks and pages (tested on
/// its own).
#[derive(Debug)]
pub struct Policy {
    accounts: HashMap<String, Account>,
    turn: Turn,
    last_step: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            accounts: HashMap::new(),
            turn: Turn::Open,
            last_step: None,
        }
    }
}

impl Policy {
    fn vtime(&self, view: &TenantView) -> f64 {
        let offset = self
            .accounts
            .get(&view.name)
            .map_or(0.0, |a| a.vtime_offset);
        view.usage.busy_ns as f64 / f64::from(view.weight.max(1)) + offset
    }

    fn capped_out(&self, view: &TenantView) -> bool {
        view.max_percent.is_some()
            && self
                .accounts
                .get(&view.name)
                .is_some_and(|a| a.tokens_ns <= 0.0)
    }

    /// Whether the tenant had work, or submitted, within `window` of `now`
    /// (a tenant between a synchronization and its next launch has no work
    /// for a moment and is still running).
    fn active_within(&self, view: &TenantView, now: u64, window: Duration) -> bool {
        let last_work = self.accounts.get(&view.name).map_or(0, |a| a.last_work_ns);
        view.has_work()
            || now.saturating_sub(view.usage.last_submit_ns.max(last_work)) <= ns(window)
    }

    /// Decides every tenant's grant at time `now` (nanoseconds).
    pub fn step(&mut self, now: u64, views: &[TenantView]) -> Decision {
        let elapsed = self.last_step.map_or(0, |t| now.saturating_sub(t));
        self.last_step = Some(now);
        self.accounts
            .retain(|name, _| views.iter().any(|v| &v.name == name));
        // Bill GPU time; refill caps.
        let mut rejoining = Vec::new();
        for view in views {
            let rate = view.max_percent.map(|percent| f64::from(percent) / 100.0);
            let burst = rate.map_or(0.0, |rate| ns(CAP_BURST) as f64 * rate);
            // A tenant met for the first time starts with a full bucket and
            // all its GPU time so far already billed.
            let account = self
                .accounts
                .entry(view.name.clone())
                .or_insert_with(|| Account {
                    seen_busy_ns: view.usage.busy_ns,
                    tokens_ns: burst,
                    ..Account::default()
                });
            let used = view.usage.busy_ns.saturating_sub(account.seen_busy_ns);
            account.seen_busy_ns = view.usage.busy_ns;
            account.tokens_ns = match rate {
                Some(rate) => (account.tokens_ns + elapsed as f64 * rate - used as f64).min(burst),
                None => 0.0,
            };
            if view.has_work() {
                if now.saturating_sub(account.last_work_ns) > ns(REJOIN) {
                    rejoining.push(view.name.clone());
                }
                account.last_work_ns = now;
            }
        }
        // A tenant back from idle starts level with the least-served of the
        // others with work, not with the credit of its idle time.
        for name in rejoining {
            let floor = views
                .iter()
                .filter(|o| o.name != name && o.has_work())
                .map(|o| self.vtime(o))
                .reduce(f64::min);
            let Some(view) = views.iter().find(|v| v.name == name) else {
                continue;
            };
            let vtime_now = self.vtime(view);
            if let (Some(floor), Some(account)) = (floor, self.accounts.get_mut(&name)) {
                if floor > vtime_now {
                    account.vtime_offset += floor - vtime_now;
                }
            }
        }
        let present: Vec<bool> = views
            .iter()
            .map(|v| self.active_within(v, now, HOLD))
            .collect();
        let top = views
            .iter()
            .zip(&present)
            .filter(|(_, p)| **p)
            .map(|(v, _)| v.priority)
            .min();
        let eligible: Vec<bool> = views
            .iter()
            .zip(&present)
            .map(|(v, p)| *p && Some(v.priority) == top && !self.capped_out(v))
            .collect();
        let vtimes: Vec<f64> = views.iter().map(|v| self.vtime(v)).collect();
        let capped_out: Vec<bool> = views.iter().map(|v| self.capped_out(v)).collect();
        let present_count = present.iter().filter(|p| **p).count();
        let contended = present_count >= 2
            || views
                .iter()
                .zip(&present)
                .any(|(v, p)| *p && v.max_percent.is_some());
        let draining = matches!(self.turn, Turn::Draining { .. });

        if !contended && !draining {
            self.turn = Turn::Open;
            let grants = views
                .iter()
                .zip(&capped_out)
                .map(|(v, capped_out)| match (v.max_percent, capped_out) {
                    (None, _) => GRANT_FREE,
                    (Some(_), true) => GRANT_WAIT,
                    (Some(_), false) => GRANT_FENCED,
                })
                .collect();
            let next = if present_count == 0 { IDLE_TICK } else { TICK };
            return Decision {
                grants,
                next,
                draining: None,
            };
        }

        let index_of = |name: &str| views.iter().position(|v| v.name == name);
        // Tenants with work that may hold the GPU, with their virtual time.
        let candidates: Vec<(usize, f64)> = (0..views.len())
            .filter(|&i| eligible[i] && views[i].has_work())
            .map(|i| (i, vtimes[i]))
            .collect();
        let idle: Vec<bool> = views
            .iter()
            .map(|v| !self.active_within(v, now, IDLE_GRACE))
            .collect();
        self.turn = match std::mem::replace(&mut self.turn, Turn::Idle) {
            Turn::Open | Turn::Idle => Turn::Idle,
            Turn::Holding { tenant } => match index_of(&tenant) {
                None => Turn::Idle,
                Some(h) => {
                    let mut others = candidates.iter().filter(|(i, _)| *i != h);
                    // A quantum of the holder's own GPU time ahead of
                    // another tenant with work: its turn is over.
                    let quantum = ns(QUANTUM) as f64 / f64::from(views[h].weight.max(1));
                    let revoke = !eligible[h]
                        || (idle[h] && others.clone().next().is_some())
                        || others.any(|(_, vtime)| *vtime + quantum < vtimes[h]);
                    match (revoke, views[h].usage.busy_sessions > 0) {
                        (false, _) => Turn::Holding { tenant },
                        (true, true) => Turn::Draining { tenant, since: now },
                        (true, false) => Turn::Idle,
                    }
                }
            },
            Turn::Draining { tenant, since } => match index_of(&tenant) {
                Some(i)
                    if views[i].usage.busy_sessions > 0
                        && now.saturating_sub(since) < ns(DRAIN_MAX) =>
                {
                    Turn::Draining { tenant, since }
                }
                _ => Turn::Idle,
            },
        };
        if self.turn == Turn::Idle {
            let least =
                candidates
                    .iter()
                    .copied()
                    .reduce(|best, next| if next.1 < best.1 { next } else { best });
            if let Some((i, _)) = least {
                self.turn = Turn::Holding {
                    tenant: views[i].name.clone(),
                };
            }
        }
        let (holder, draining) = match &self.turn {
            Turn::Holding { tenant, .. } => (Some(tenant.as_str()), None),
            Turn::Draining { tenant, .. } => (None, Some(tenant.clone())),
            Turn::Open | Turn::Idle => (None, None),
        };
        let grants = views
            .iter()
            .map(|v| {
                if Some(v.name.as_str()) == holder {
                    GRANT_FENCED
                } else {
                    GRANT_WAIT
                }
            })
            .collect();
        Decision {
            grants,
            next: TICK,
            draining,
        }
    }
}

/// Runs the scheduler over `tenants` until they are gone (the daemon
/// exits). One policy per GPU.
pub fn run(tenants: Weak<Tenants>) {
    let mut policies: HashMap<u32, Policy> = HashMap::new();
    while let Some(served) = tenants.upgrade() {
        let list = served.list();
        drop(served);
        let now = monotonic_ns();
        let mut next = IDLE_TICK;
        let mut drains = Vec::new();
        let mut any_sessions = false;
        let mut gpus: Vec<u32> = list.iter().map(|t| t.gpu).collect();
        gpus.sort_unstable();
        gpus.dedup();
        policies.retain(|gpu, _| gpus.contains(gpu));
        for gpu in gpus {
            let on_gpu: Vec<_> = list.iter().filter(|t| t.gpu == gpu).collect();
            let views: Vec<TenantView> = on_gpu
                .iter()
                .map(|t| {
                    let settings = t.settings();
                    TenantView {
                        name: t.name.clone(),
                        usage: t.budget.compute_use(),
                        weight: settings.compute_weight,
                        max_percent: settings.compute_max,
                        priority: settings.priority,
                    }
                })
                .collect();
            let with_sessions: Vec<bool> =
                on_gpu.iter().map(|t| t.supervisor.has_sessions()).collect();
            for (i, tenant) in on_gpu.iter().enumerate() {
                let others = with_sessions
                    .iter()
                    .enumerate()
                    .any(|(j, has)| j != i && *has);
                tenant.budget.set_neighbours(others);
            }
            any_sessions |= with_sessions.iter().any(|has| *has);
            let decision = policies.entry(gpu).or_default().step(now, &views);
            log::trace!("scheduler: at {now}: {views:?} -> {decision:?}");
            for (tenant, grant) in on_gpu.iter().zip(&decision.grants) {
                if tenant.budget.grant() != *grant {
                    log::trace!("scheduler: tenant {} grant {grant}", tenant.name);
                    tenant.budget.set_grant(*grant);
                }
            }
            next = next.min(decision.next);
            if let Some(name) = decision.draining {
                drains.extend(
                    on_gpu
                        .iter()
                        .find(|t| t.name == name)
                        .map(|t| Arc::clone(t)),
                );
            }
        }
        if any_sessions {
            next = next.min(TICK);
        }
        match drains.as_slice() {
            // Wake as soon as the drained tenant's last session is done.
            [one] => one.budget.wait_until_idle(next),
            _ => std::thread::sleep(next),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn view(name: &str, weight: u32) -> TenantView {
        TenantView {
            name: name.into(),
            usage: ComputeUse {
                busy_ns: 0,
                busy_sessions: 0,
                waiting_sessions: 0,
                last_submit_ns: 0,
            },
            weight,
            max_percent: None,
            priority: Priority::Normal,
        }
    }

    /// Simulates tenants that always have work, for `total` ns in steps of
    /// `tick`: the holder's GPU time grows while it holds (or drains, one
    /// tick), the others wait. Returns each one's GPU time.
    fn saturate(policy: &mut Policy, views: &mut [TenantView], total: u64, tick: u64) -> Vec<u64> {
        let start = policy.last_step.unwrap_or(10 * MS);
        let mut now = start;
        let mut draining_for = 0;
        while now < total + start {
            for v in views.iter_mut() {
                v.usage.last_submit_ns = now;
            }
            let decision = policy.step(now, views);
            for (v, grant) in views.iter_mut().zip(&decision.grants) {
                let runs = *grant != GRANT_WAIT || decision.draining.as_deref() == Some(&v.name);
                if runs {
                    v.usage.busy_ns += tick;
                }
                v.usage.busy_sessions = u32::from(runs);
                v.usage.waiting_sessions = u32::from(!runs);
            }
            // A drain lasts one tick.
            if let Some(name) = &decision.draining {
                draining_for += 1;
                if draining_for >= 1 {
                    if let Some(v) = views.iter_mut().find(|v| &v.name == name) {
                        v.usage.busy_sessions = 0;
                        v.usage.waiting_sessions = 1;
                    }
                    draining_for = 0;
                }
            }
            now += tick;
        }
        views.iter().map(|v| v.usage.busy_ns).collect()
    }

    #[test]
    fn a_lone_tenant_runs_unarbitrated() {
        let mut policy = Policy::default();
        let mut alone = view("a", 100);
        alone.usage.busy_sessions = 1;
        alone.usage.last_submit_ns = 5 * MS;
        let idle = view("b", 100);
        let decision = policy.step(5 * MS, &[alone, idle]);
        assert_eq!(decision.grants, vec![GRANT_FREE, GRANT_FREE]);
    }

    #[test]
    fn contended_time_follows_the_weights() {
        let mut policy = Policy::default();
        let mut views = vec![view("w3", 300), view("w1", 100)];
        let times = saturate(&mut policy, &mut views, 4000 * MS, MS / 4);
        let share = times[0] as f64 / (times[0] + times[1]) as f64;
        assert!((share - 0.75).abs() < 0.02, "w3's share {share}");
    }

    #[test]
    fn equal_weights_share_equally() {
        let mut policy = Policy::default();
        let mut views: Vec<TenantView> = (0..8).map(|i| view(&format!("t{i}"), 100)).collect();
        let times = saturate(&mut policy, &mut views, 2000 * MS, MS / 4);
        let (min, max) = (times.iter().min().unwrap(), times.iter().max().unwrap());
        assert!(*max as f64 / *min as f64 <= 1.1, "{times:?}");
    }

    #[test]
    fn compute_max_caps_a_lone_tenant() {
        let mut policy = Policy::default();
        let mut capped = view("capped", 100);
        capped.max_percent = Some(30);
        let mut views = vec![capped];
        let times = saturate(&mut policy, &mut views, 3000 * MS, MS / 4);
        let share = times[0] as f64 / (3000 * MS) as f64;
        assert!((0.27..=0.33).contains(&share), "capped share {share}");
    }

    #[test]
    fn a_high_priority_tenant_keeps_lower_ones_off_between_its_kernels() {
        let mut policy = Policy::default();
        let mut low = view("low", 100);
        low.priority = Priority::Low;
        low.usage.busy_sessions = 1;
        low.usage.last_submit_ns = 10 * MS;
        let mut high = view("high", 100);
        high.priority = Priority::High;
        // Alone, the low tenant runs.
        let d = policy.step(10 * MS, &[low.clone(), high.clone()]);
        assert_eq!(d.grants, vec![GRANT_FREE, GRANT_FREE]);
        // The high one asks: it holds the GPU at once (what the low one
        // queued unarbitrated finishes under the driver's time slicing).
        high.usage.waiting_sessions = 1;
        high.usage.last_submit_ns = 11 * MS;
        let d = policy.step(11 * MS, &[low.clone(), high.clone()]);
        assert_eq!(d.grants, vec![GRANT_WAIT, GRANT_FENCED]);
        low.usage.busy_sessions = 0;
        low.usage.waiting_sessions = 1;
        let d = policy.step(12 * MS, &[low.clone(), high.clone()]);
        assert_eq!(d.grants, vec![GRANT_WAIT, GRANT_FENCED]);
        // Between its kernels (no work for a moment) it keeps the GPU, for
        // however long the low one waits.
        high.usage.waiting_sessions = 0;
        for t in 13..40 {
            high.usage.last_submit_ns = t * MS;
            let d = policy.step(t * MS + MS / 2, &[low.clone(), high.clone()]);
            assert_eq!(d.grants, vec![GRANT_WAIT, GRANT_FENCED], "at {t} ms");
        }
        // Once it has been quiet for longer than HOLD, the low one runs.
        let d = policy.step(40 * MS + ns(HOLD) + 1, &[low.clone(), high.clone()]);
        let d2 = policy.step(41 * MS + ns(HOLD) + 1, &[low, high]);
        assert!(
            d.grants == vec![GRANT_FREE, GRANT_FREE] || d2.grants[0] != GRANT_WAIT,
            "{d:?} {d2:?}"
        );
    }

    #[test]
    fn the_next_holder_waits_until_the_last_one_drained() {
        let mut policy = Policy::default();
        let mut a = view("a", 100);
        let mut b = view("b", 100);
        for v in [&mut a, &mut b] {
            v.usage.waiting_sessions = 1;
            v.usage.last_submit_ns = 10 * MS;
        }
        let d = policy.step(10 * MS, &[a.clone(), b.clone()]);
        assert_eq!(d.grants, vec![GRANT_FENCED, GRANT_WAIT]);
        a.usage.waiting_sessions = 0;
        a.usage.busy_sessions = 1;
        a.usage.busy_ns = 11 * MS;
        a.usage.last_submit_ns = 21 * MS;
        // Its quantum is over and b has less GPU time: a drains first.
        let d = policy.step(21 * MS, &[a.clone(), b.clone()]);
        assert_eq!(d.grants, vec![GRANT_WAIT, GRANT_WAIT]);
        assert_eq!(d.draining.as_deref(), Some("a"));
        let d = policy.step(22 * MS, &[a.clone(), b.clone()]);
        assert_eq!(d.grants, vec![GRANT_WAIT, GRANT_WAIT], "still draining");
        a.usage.busy_sessions = 0;
        let d = policy.step(23 * MS, &[a, b]);
        assert_eq!(d.grants, vec![GRANT_WAIT, GRANT_FENCED]);
        assert_eq!(d.draining, None);
    }

    #[test]
    fn a_tenant_back_from_idle_banks_no_credit() {
        let mut policy = Policy::default();
        let mut busy = view("busy", 100);
        busy.usage.busy_sessions = 1;
        busy.usage.busy_ns = 1000 * MS;
        busy.usage.last_submit_ns = 1000 * MS;
        let mut back = view("back", 100);
        policy.step(1000 * MS, &[busy.clone(), back.clone()]);
        back.usage.waiting_sessions = 1;
        back.usage.last_submit_ns = 1001 * MS;
        policy.step(1001 * MS, &[busy.clone(), back.clone()]);
        let mut views = vec![busy, back];
        let times = saturate(&mut policy, &mut views, 1000 * MS, MS / 4);
        let gained = times[1] as f64 / (times[0] - 1000 * MS + times[1]) as f64;
        assert!(
            gained < 0.6,
            "the returning tenant took {gained} of the GPU"
        );
    }
}
