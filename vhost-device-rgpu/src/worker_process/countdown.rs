//! One deferred response that waits for several completions (a resource's
//! unref waits for every worker that mapped it).

use std::sync::{Arc, Mutex, PoisonError};

use rgpu_session::Completion;

struct State {
    outstanding: usize,
    then: Option<Box<dyn Completion>>,
}

/// Completes `then` once every part made from it has completed and the
/// countdown itself was dropped.
pub struct Countdown {
    state: Arc<Mutex<State>>,
}

/// One of the things a [`Countdown`] waits for.
pub struct Part {
    state: Arc<Mutex<State>>,
}

impl Countdown {
    pub fn new(then: Box<dyn Completion>) -> Countdown {
        Countdown {
            state: Arc::new(Mutex::new(State {
                outstanding: 1,
                then: Some(then),
            })),
        }
    }

    /// A completion the countdown waits for too.
    pub fn part(&self) -> Box<dyn Completion> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.outstanding += 1;
        Box::new(Part {
            state: Arc::clone(&self.state),
        })
    }
}

fn count_down(state: &Mutex<State>) {
    let then = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        state.outstanding = state.outstanding.saturating_sub(1);
        if state.outstanding == 0 {
            state.then.take()
        } else {
            None
        }
    };
    if let Some(then) = then {
        then.complete();
    }
}

impl Drop for Countdown {
    fn drop(&mut self) {
        count_down(&self.state);
    }
}

impl Completion for Part {
    fn complete(self: Box<Self>) {
        count_down(&self.state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(Arc<AtomicUsize>);
    impl Completion for Count {
        fn complete(self: Box<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn completes_once_after_every_part_and_the_countdown() {
        let done = Arc::new(AtomicUsize::new(0));
        let countdown = Countdown::new(Box::new(Count(done.clone())));
        let a = countdown.part();
        let b = countdown.part();
        drop(countdown);
        a.complete();
        assert_eq!(done.load(Ordering::SeqCst), 0);
        b.complete();
        assert_eq!(done.load(Ordering::SeqCst), 1);

        let countdown = Countdown::new(Box::new(Count(done.clone())));
        drop(countdown);
        assert_eq!(done.load(Ordering::SeqCst), 2);
    }
}
