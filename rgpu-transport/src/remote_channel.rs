//! A CUDA context's channel over the network carrier: one connection to
//! the daemon's gateway, which runs a local channel for it on the host
//! (rgpu-proto `remote`). Requests are answered in order, so a call reads
//! its own answer; asynchronous commands and copies to the device are
//! written and not waited for, and large copies travel in pieces that the
//! gateway stages while the next piece is on the wire.

use std::sync::{Mutex, MutexGuard};

use rgpu_proto::remote::{
    HelloRole, Request, Response, MAX_COPY_FROM_DEVICE, MAX_DATA_PIECE, MAX_IMAGE,
};
use rgpu_proto::{BlobRange, Command};

use crate::carrier::remote::{FrameStream, RemoteCarrier};
use crate::carrier::CarrierError;
use crate::channel::Reply;

pub struct RemoteChannel {
    ctx_id: u32,
    /// The connection, or why it is unusable (every later call fails so).
    stream: Mutex<Result<FrameStream, String>>,
}

impl RemoteChannel {
    /// Opens a channel of `carrier`'s process on the daemon.
    pub fn open(carrier: &RemoteCarrier, debug_name: &str) -> Result<Self, CarrierError> {
        let mut stream = carrier.endpoint().connect()?;
        let (_, ctx_id, _) = stream.hello(HelloRole::Channel {
            token: carrier.token(),
            name: debug_name.into(),
        })?;
        Ok(Self {
            ctx_id,
            stream: Mutex::new(Ok(stream)),
        })
    }

    /// The context's id on the host (log lines there name it).
    pub fn ctx_id(&self) -> u32 {
        self.ctx_id
    }

    fn lock(&self) -> MutexGuard<'_, Result<FrameStream, String>> {
        self.stream.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `exchange` on the connection; a failure that leaves the stream
    /// out of step breaks the channel for good.
    fn with_stream<R>(
        &self,
        exchange: impl FnOnce(&mut FrameStream) -> Result<R, CarrierError>,
    ) -> Result<R, CarrierError> {
        let mut guard = self.lock();
        let stream = match guard.as_mut() {
            Ok(stream) => stream,
            Err(reason) => return Err(CarrierError::ContextLost(reason.clone())),
        };
        match exchange(stream) {
            Ok(value) => Ok(value),
            Err(e) => {
                *guard = Err(e.to_string());
                Err(e)
            }
        }
    }

    pub fn send(&self, command: &Command) -> Result<(), CarrierError> {
        let command = command.to_bytes(0);
        self.with_stream(|s| s.send(&Request::Send { command }))
    }

    pub fn call(&self, command: &Command) -> Result<Reply, CarrierError> {
        let command = command.to_bytes(0);
        self.with_stream(|s| {
            s.send(&Request::Call { command })?;
            expect_reply(s.receive()?)
        })
    }

    /// As the ring channel's: pieces of at most [`MAX_DATA_PIECE`] bytes,
    /// only the last one answered when `sync`.
    pub fn copy_to_device(
        &self,
        stream: u32,
        dst: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<u32, CarrierError> {
        if data.is_empty() {
            return Ok(0);
        }
        self.with_stream(|s| {
            let count = data.len().div_ceil(MAX_DATA_PIECE);
            for (i, piece) in data.chunks(MAX_DATA_PIECE).enumerate() {
                s.send(&Request::CopyToDevice {
                    stream,
                    dst: dst.wrapping_add((i * MAX_DATA_PIECE) as u64),
                    sync: sync && i + 1 == count,
                    data: piece.to_vec(),
                })?;
            }
            if !sync {
                return Ok(0);
            }
            match s.receive()? {
                Response::Result { result } => Ok(result),
                other => Err(unexpected(other)),
            }
        })
    }

    /// As the ring channel's: synchronous; the gateway streams the bytes
    /// back in pieces.
    pub fn copy_from_device(
        &self,
        stream: u32,
        dst: &mut [u8],
        src: u64,
    ) -> Result<u32, CarrierError> {
        let request_max = usize::try_from(MAX_COPY_FROM_DEVICE).unwrap_or(usize::MAX);
        for (i, part) in dst.chunks_mut(request_max).enumerate() {
            let part_src = src.wrapping_add((i * request_max) as u64);
            let result = self.with_stream(|s| {
                s.send(&Request::CopyFromDevice {
                    stream,
                    src: part_src,
                    length: part.len() as u64,
                })?;
                let mut filled = 0usize;
                loop {
                    match s.receive()? {
                        Response::Data { data } => {
                            let end = filled.checked_add(data.len()).filter(|e| *e <= part.len());
                            let target =
                                end.and_then(|end| part.get_mut(filled..end))
                                    .ok_or_else(|| {
                                        CarrierError::Protocol(
                                            "the gateway sent more data than asked".into(),
                                        )
                                    })?;
                            target.copy_from_slice(&data);
                            filled += data.len();
                        }
                        Response::Result { result } => {
                            if result == 0 && filled != part.len() {
                                return Err(CarrierError::Protocol(format!(
                                    "the gateway sent {filled} of {} bytes",
                                    part.len()
                                )));
                            }
                            return Ok(result);
                        }
                        other => return Err(unexpected(other)),
                    }
                }
            })?;
            if result != 0 {
                return Ok(result);
            }
        }
        Ok(0)
    }

    /// A module load with its image (the only command that names data),
    /// the image in pieces.
    pub fn call_with_data(
        &self,
        data: &[u8],
        make_command: &dyn Fn(BlobRange) -> Command,
    ) -> Result<Reply, CarrierError> {
        if data.len() > MAX_IMAGE {
            return Err(CarrierError::OutOfMemory(data.len() as u64));
        }
        let command = make_command(BlobRange::default()).to_bytes(0);
        self.with_stream(|s| {
            let mut pieces: Vec<&[u8]> = data.chunks(MAX_DATA_PIECE).collect();
            let last = pieces.pop().unwrap_or_default();
            for piece in pieces {
                s.send(&Request::ImagePiece {
                    data: piece.to_vec(),
                })?;
            }
            s.send(&Request::LoadModule {
                command,
                image: last.to_vec(),
            })?;
            expect_reply(s.receive()?)
        })
    }
}

fn expect_reply(response: Response) -> Result<Reply, CarrierError> {
    match response {
        Response::Reply { result, payload } => Ok(Reply { result, payload }),
        other => Err(unexpected(other)),
    }
}

/// An answer out of step, or the gateway saying the host side failed.
fn unexpected(response: Response) -> CarrierError {
    match response {
        Response::Failed { reason } => CarrierError::ContextLost(reason),
        other => CarrierError::Protocol(format!("unexpected answer from the gateway: {other:?}")),
    }
}
