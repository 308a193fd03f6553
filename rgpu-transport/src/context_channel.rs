//! What a CUDA context talks to the host through: a ring in shared memory
//! ([`Channel`], local and VM mode) or a network connection
//! ([`RemoteChannel`]); the CUDA API above sees one interface.

use std::sync::Arc;

use rgpu_proto::channel::CompletionKind;
use rgpu_proto::{BlobRange, Command};

use crate::carrier::{Carrier, CarrierError};
use crate::channel::{Channel, ChannelConfig, Completion, Reply};
use crate::remote_channel::RemoteChannel;

pub enum ContextChannel {
    /// Boxed: a ring channel is several times the size of a remote one.
    Ring(Box<Channel>),
    Remote(RemoteChannel),
}

impl ContextChannel {
    /// A new channel (a new host session) on `carrier`.
    pub fn open(carrier: Arc<dyn Carrier>, debug_name: &str) -> Result<Self, CarrierError> {
        Self::open_with_config(carrier, debug_name, ChannelConfig::from_env())
    }

    /// [`ContextChannel::open`] with a ring of `config`'s sizes (a remote
    /// channel has no ring: it ignores them).
    pub fn open_with_config(
        carrier: Arc<dyn Carrier>,
        debug_name: &str,
        config: ChannelConfig,
    ) -> Result<Self, CarrierError> {
        if carrier.remote().is_some() {
            Ok(Self::Remote(RemoteChannel::open(carrier, debug_name)?))
        } else {
            let ring = Channel::open_with_config(carrier, debug_name, config)?;
            Ok(Self::Ring(Box::new(ring)))
        }
    }

    pub fn ctx_id(&self) -> u32 {
        match self {
            Self::Ring(c) => c.ctx_id(),
            Self::Remote(c) => c.ctx_id(),
        }
    }

    /// Queues a command that needs no reply (errors surface at the next call).
    pub fn send(&self, command: &Command) -> Result<(), CarrierError> {
        match self {
            Self::Ring(c) => c.send(command),
            Self::Remote(c) => c.send(command),
        }
    }

    /// Sends a command and waits for its reply.
    pub fn call(&self, command: &Command) -> Result<Reply, CarrierError> {
        match self {
            Self::Ring(c) => c.call(command),
            Self::Remote(c) => c.call(command),
        }
    }

    /// Copies `data` to device memory at `dst`; with `sync`, waits and
    /// returns the CUDA result.
    pub fn copy_to_device(
        &self,
        stream: u32,
        dst: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<u32, CarrierError> {
        match self {
            Self::Ring(c) => c.copy_to_device(stream, dst, data, sync),
            Self::Remote(c) => c.copy_to_device(stream, dst, data, sync),
        }
    }

    /// Copies device memory at `src` into `dst`; synchronous.
    pub fn copy_from_device(
        &self,
        stream: u32,
        dst: &mut [u8],
        src: u64,
    ) -> Result<u32, CarrierError> {
        match self {
            Self::Ring(c) => c.copy_from_device(stream, dst, src),
            Self::Remote(c) => c.copy_from_device(stream, dst, src),
        }
    }

    /// A command that names `data` (a module image), and its reply.
    pub fn call_with_data(
        &self,
        data: &[u8],
        make_command: &dyn Fn(BlobRange) -> Command,
    ) -> Result<Reply, CarrierError> {
        match self {
            Self::Ring(c) => c.call_with_data(data, make_command),
            Self::Remote(c) => c.call_with_data(data, make_command),
        }
    }

    /// What the host's completion table says, without waiting behind the
    /// channel's work (a remote channel asks on its query connection).
    pub fn completion(&self, kind: CompletionKind, handle: u32) -> Completion {
        match self {
            Self::Ring(c) => c.completion(kind, handle),
            Self::Remote(c) => c.completion(kind, handle),
        }
    }

    /// Ends the host session.
    pub fn close(self) -> Result<(), CarrierError> {
        match self {
            Self::Ring(c) => c.close(),
            // Closing the connection ends the session.
            Self::Remote(_) => Ok(()),
        }
    }
}
