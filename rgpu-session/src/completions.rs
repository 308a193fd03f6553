//! Queries that never wait (rgpu_proto::channel, the completion table): the
//! session watches the events it recorded and the streams it gave work,
//! looks at them between commands, while idle and before answering any
//! command that may have waited for the GPU, and publishes each one it finds
//! complete with the ring position it had reached. The guest answers
//! `cuEventQuery` and `cuStreamQuery` from that table.

use std::time::{Duration, Instant};

use rgpu_executor::ContextExecutor;
use rgpu_proto::channel::{completion_tag, CompletionKind, COMPLETION_FAILED};
use rgpu_proto::cuda_result::CUDA_ERROR_NOT_READY;
use rgpu_proto::Command;

use crate::channel::Channel;
use crate::handles::Handles;

/// Items watched at most (events and streams the guest created are bounded
/// by the session's handle limits; this bounds a pass's cost further: past
/// it, the oldest is published as unknown, which sends the guest to ask
/// through the ring).
const MAX_WATCHED: usize = 1024;

#[derive(Debug)]
pub(crate) struct Completions {
    /// Guest handles of recorded events not yet seen complete.
    events: Vec<u32>,
    /// Guest handles of streams with work not yet seen complete.
    streams: Vec<u32>,
    last_look: Option<Instant>,
    /// How often a look is due while commands keep coming.
    every: Duration,
}

impl Completions {
    pub(crate) fn looking_every(every: Duration) -> Self {
        Self {
            events: Vec::new(),
            streams: Vec::new(),
            last_look: None,
            every,
        }
    }

    /// How often a look is due.
    pub(crate) fn every(&self) -> Duration {
        self.every
    }

    pub(crate) fn watching(&self) -> bool {
        !self.events.is_empty() || !self.streams.is_empty()
    }

    /// Notes what a command that ran changes.
    pub(crate) fn ran(&mut self, command: &Command, channel: Option<&Channel>) {
        for event in command.events_recorded() {
            watch(&mut self.events, event, channel, CompletionKind::Event);
        }
        match command {
            Command::EventDestroy { event } => self.events.retain(|e| e != event),
            Command::StreamDestroy { stream } => self.streams.retain(|s| s != stream),
            _ => {}
        }
        if let Some(stream) = command.queued_on() {
            watch(&mut self.streams, stream, channel, CompletionKind::Stream);
        }
    }

    /// Whether a look is due at `now` (commands keep coming).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.watching()
            && self
                .last_look
                .is_none_or(|t| now.saturating_duration_since(t) >= self.every)
    }

    /// The whole context synchronized: every watched item is complete up
    /// to `position`, published without asking the driver.
    pub(crate) fn all_done(&mut self, channel: &Channel, position: u64) {
        self.last_look = Some(Instant::now());
        for event in self.events.drain(..) {
            channel.publish_completion(completion_tag(CompletionKind::Event, event), position);
        }
        for stream in self.streams.drain(..) {
            channel.publish_completion(completion_tag(CompletionKind::Stream, stream), position);
        }
    }

    /// Looks at every watched item and publishes those complete, with
    /// `position`: the end of the last command the session ran.
    pub(crate) fn look(
        &mut self,
        ctx: &mut dyn ContextExecutor,
        handles: &Handles,
        channel: &Channel,
        position: u64,
    ) {
        self.last_look = Some(Instant::now());
        self.events.retain(|&event| {
            let result = handles.event(event).and_then(|e| ctx.event_query(e));
            publish(channel, CompletionKind::Event, event, result, position)
        });
        self.streams.retain(|&stream| {
            let result = handles.stream(stream).and_then(|s| ctx.stream_query(s));
            publish(channel, CompletionKind::Stream, stream, result, position)
        });
    }
}

/// Adds `handle` to `list` unless it is there; past [`MAX_WATCHED`], the
/// oldest goes, published as unknown.
fn watch(list: &mut Vec<u32>, handle: u32, channel: Option<&Channel>, kind: CompletionKind) {
    if list.contains(&handle) {
        return;
    }
    if list.len() >= MAX_WATCHED {
        let oldest = list.remove(0);
        if let Some(channel) = channel {
            channel.publish_completion(completion_tag(kind, oldest), COMPLETION_FAILED);
        }
    }
    list.push(handle);
}

/// Publishes one look's result; true keeps the item watched.
fn publish(
    channel: &Channel,
    kind: CompletionKind,
    handle: u32,
    result: Result<(), u32>,
    position: u64,
) -> bool {
    let tag = completion_tag(kind, handle);
    match result {
        Err(CUDA_ERROR_NOT_READY) => true,
        Ok(()) => {
            channel.publish_completion(tag, position);
            false
        }
        // The guest asks through the ring and gets the error from there.
        Err(_) => {
            channel.publish_completion(tag, COMPLETION_FAILED);
            false
        }
    }
}
