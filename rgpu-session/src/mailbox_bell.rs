//! What a session's mailbox senders share with its worker thread besides
//! the mailbox: whether a `Wake` is already queued, and the wake word of a
//! channel whose guest wakes the worker by futex (rgpu-proto `channel`),
//! which every sender bumps and wakes after posting, since the worker,
//! asleep on that word, does not wait on the mailbox itself.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::blob::SharedWord;

#[derive(Debug, Default)]
pub struct MailboxBell {
    /// A `Wake` is in the mailbox and not yet taken by the worker.
    pub(crate) wake_queued: AtomicBool,
    wake_word: Mutex<Option<SharedWord<AtomicU32>>>,
}

impl MailboxBell {
    /// Wakes the worker if it sleeps on a wake word: called after each post
    /// (the worker reads the word before it looks at the mailbox, so a post
    /// it missed has moved the word and its futex wait returns at once).
    pub fn ring(&self) {
        let word = self
            .wake_word
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(word) = word.as_ref() {
            word.fetch_add(1, Ordering::SeqCst);
            rgpu_proto::futex::wake(word);
        }
    }

    /// The wake word the worker sleeps on from now on (`None`: it waits on
    /// the mailbox). Holding it keeps the channel's blob mapped.
    pub(crate) fn hang(&self, word: Option<SharedWord<AtomicU32>>) {
        *self
            .wake_word
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = word;
    }
}
