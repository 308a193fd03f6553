//! The network carrier's stream (ARCHITECTURE.md §6.3): what a remote
//! guest process and the daemon's gateway say to each other over one TLS
//! (or, where the daemon allows it, plain TCP) connection.
//!
//! There is no shared memory across a network, so the stream carries what
//! the ring and the blobs carry locally: the same encoded [`Command`]s,
//! and the bytes of every copy. One connection serves one CUDA context's
//! channel, strictly in order (a call's answer is the next frame from the
//! gateway), plus one connection per process that names the process
//! (the gateway gives its contexts one host process, as locally).
//!
//! A frame is a little-endian `u32` length, then that many bytes: a kind
//! byte and its body. Every length is bounded before anything is allocated.
//!
//! [`Command`]: crate::Command

use crate::wire::{WireReader, WireWriter};
use crate::DecodeError;

/// First bytes of a client's hello: `rgpu` in ASCII, so that a daemon that
/// expects TLS can tell a plaintext client (and say so) from garbage.
pub const HELLO_MAGIC: [u8; 4] = *b"rgpu";
/// Version of this stream (not of the command set, which the capset
/// carries).
pub const REMOTE_VERSION: u32 = 1;
/// Largest piece of copy data in one frame: copies are cut into pieces
/// that pipeline (the gateway stages one while the next travels).
pub const MAX_DATA_PIECE: usize = 4 << 20;
/// Largest frame body: a data piece and its small header, or a command.
pub const MAX_FRAME: usize = MAX_DATA_PIECE + 4096;
/// Largest process or reason text.
pub const MAX_TEXT: usize = 1024;
/// Largest copy from the device in one request (the guest's channel cuts
/// larger ones).
pub const MAX_COPY_FROM_DEVICE: u64 = 1 << 30;
/// Largest module image, all its pieces together.
pub const MAX_IMAGE: usize = 1 << 30;
/// A query's answer when the completion table cannot tell: ask through the
/// channel (behind its queued work).
pub const QUERY_ASK: u32 = u32::MAX;
/// Bytes of the token that ties a channel connection to its process.
pub const TOKEN_BYTES: usize = 16;

/// What a connection is for, said in its hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloRole {
    /// A guest process: the gateway opens its host process and returns a
    /// token and the capset.
    Process { name: String },
    /// A channel (one CUDA context) of the process that got `token`.
    Channel {
        token: [u8; TOKEN_BYTES],
        name: String,
    },
    /// The query connection of that process's channel `ctx_id`: event and
    /// stream queries answered from the host's completion table, never
    /// behind the channel's own calls.
    Query {
        token: [u8; TOKEN_BYTES],
        ctx_id: u32,
    },
    /// A data lane of that process's channel `ctx_id`: large copies travel
    /// on the channel's lanes side by side, each lane's TLS on a core of
    /// its own (see [`Request::CopyToDeviceLanes`]).
    Lane {
        token: [u8; TOKEN_BYTES],
        ctx_id: u32,
    },
}

/// Client to gateway. Bytes are borrowed: from the application's buffers
/// when sent, from the frame when received, so a copy's data is never
/// copied for the stream's sake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Hello {
        version: u32,
        role: HelloRole,
    },
    /// An encoded command that wants no answer (errors come with the next
    /// call's).
    Send {
        command: &'a [u8],
    },
    /// An encoded command; answered by [`Response::Reply`].
    Call {
        command: &'a [u8],
    },
    /// A piece of a copy to device memory at `dst`; with `sync`, answered
    /// by [`Response::Result`] once the copy (and all before it) is done.
    CopyToDevice {
        stream: u32,
        dst: u64,
        sync: bool,
        data: &'a [u8],
    },
    /// A copy of `length` bytes from device memory at `src`: answered by
    /// [`Response::Data`] pieces in order, then a [`Response::Result`].
    CopyFromDevice {
        stream: u32,
        src: u64,
        length: u64,
    },
    /// On a query connection: is event (`stream` false) or stream `handle`
    /// done? `after` is the count of the channel's requests up to the one
    /// that gave it its latest work (its record, for an event): while fewer
    /// have reached the host the answer is NOT_READY, at once. Answered by
    /// [`Response::Result`]: CUDA_SUCCESS, NOT_READY, or [`QUERY_ASK`].
    Query {
        after: u64,
        stream: bool,
        handle: u32,
    },
    /// On a query connection: does the daemon still serve this process's
    /// channel? Answered by [`Response::Result`] (CUDA_SUCCESS) at once,
    /// whatever the channel is doing: a client whose call has waited long
    /// asks, to tell a long kernel from a dead peer.
    Ping,
    /// A piece of the next module image (images can be larger than a
    /// frame); not answered.
    ImagePiece {
        data: &'a [u8],
    },
    /// A module load (`ModuleLoadHashed` encoded with an empty image
    /// range) and the last piece of its image; answered by
    /// [`Response::Reply`].
    LoadModule {
        command: &'a [u8],
        image: &'a [u8],
    },
    /// A copy of `length` bytes to device memory at `dst` whose bytes come
    /// on the channel's first `lanes` lanes: piece `i` ([`MAX_DATA_PIECE`]
    /// bytes, the last one shorter) as a [`Request::LanePiece`] on lane
    /// `i % lanes`. With `sync`, answered by [`Response::Result`] once the
    /// copy (and all before it) is done.
    CopyToDeviceLanes {
        stream: u32,
        dst: u64,
        length: u64,
        sync: bool,
        lanes: u32,
    },
    /// On a lane: the bytes of one piece of a copy to the device.
    LanePiece {
        data: &'a [u8],
    },
    /// A copy of `length` bytes from device memory at `src` whose bytes go
    /// back on the channel's first `lanes` lanes: piece `i` as a
    /// [`Response::Data`] on lane `i % lanes` (an empty one for each piece
    /// left after a failure); then a [`Response::Result`] on the channel.
    CopyFromDeviceLanes {
        stream: u32,
        src: u64,
        length: u64,
        lanes: u32,
    },
}

/// Most lanes a channel may have.
pub const MAX_LANES: u32 = 8;

/// How many bytes piece `index` of a copy of `length` bytes holds (see
/// [`Request::CopyToDeviceLanes`]).
pub fn lane_piece_len(length: u64, index: u64) -> usize {
    let start = index.saturating_mul(MAX_DATA_PIECE as u64);
    length.saturating_sub(start).min(MAX_DATA_PIECE as u64) as usize
}

/// Gateway to client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The hello was accepted: the process's token (a channel connection
    /// gets its process's back), the context id on the host (0 for a
    /// process) and the capset bytes.
    Welcome {
        token: [u8; TOKEN_BYTES],
        ctx_id: u32,
        capset: Vec<u8>,
    },
    /// The connection is refused, and why; the gateway closes it.
    Refused {
        reason: String,
    },
    Reply {
        result: u32,
        payload: Vec<u8>,
    },
    Result {
        result: u32,
    },
    Data {
        data: Vec<u8>,
    },
    /// The host side of the channel failed (its process ended, or the
    /// stream broke): every later request fails too.
    Failed {
        reason: String,
    },
    /// Device printf output, for the application's stdout; comes before
    /// the answer it came with, and answers nothing.
    Console {
        bytes: Vec<u8>,
    },
}

mod kind {
    pub const HELLO: u8 = 1;
    pub const SEND: u8 = 2;
    pub const CALL: u8 = 3;
    pub const COPY_TO_DEVICE: u8 = 4;
    pub const COPY_FROM_DEVICE: u8 = 5;
    pub const LOAD_MODULE: u8 = 6;
    pub const IMAGE_PIECE: u8 = 7;
    pub const QUERY: u8 = 8;
    pub const PING: u8 = 9;
    pub const COPY_TO_DEVICE_LANES: u8 = 10;
    pub const LANE_PIECE: u8 = 11;
    pub const COPY_FROM_DEVICE_LANES: u8 = 12;
    pub const WELCOME: u8 = 0x81;
    pub const REFUSED: u8 = 0x82;
    pub const REPLY: u8 = 0x83;
    pub const RESULT: u8 = 0x84;
    pub const DATA: u8 = 0x85;
    pub const FAILED: u8 = 0x86;
    pub const CONSOLE: u8 = 0x87;
}

const ROLE_PROCESS: u8 = 0;
const ROLE_CHANNEL: u8 = 1;
const ROLE_QUERY: u8 = 2;
const ROLE_LANE: u8 = 3;

/// Starts a frame of `kind` in `w` (its length is patched by [`finish`]).
fn start(kind: u8, capacity: usize) -> WireWriter {
    let mut w = WireWriter::with_capacity(capacity + 5);
    w.u32(0).u8(kind);
    w
}

fn finish(mut w: WireWriter) -> Vec<u8> {
    let body = u32::try_from(w.len() - 4).unwrap_or(u32::MAX);
    w.patch_u32(0, body);
    w.into_bytes()
}

fn text(r: &mut WireReader<'_>) -> Result<String, DecodeError> {
    let bytes = r.bytes_with_len(MAX_TEXT)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::InvalidField {
        field: "text",
        value: bytes.len() as u64,
    })
}

fn token(r: &mut WireReader<'_>) -> Result<[u8; TOKEN_BYTES], DecodeError> {
    let mut token = [0u8; TOKEN_BYTES];
    token.copy_from_slice(r.take(TOKEN_BYTES)?);
    Ok(token)
}

/// A boolean byte (0 or 1) named `field`.
fn flag(r: &mut WireReader<'_>, field: &'static str) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(DecodeError::InvalidField {
            field,
            value: other.into(),
        }),
    }
}

/// The rest of a frame as one piece of copy data: 1 byte to
/// [`MAX_DATA_PIECE`].
fn data_piece<'a>(r: &mut WireReader<'a>) -> Result<&'a [u8], DecodeError> {
    let data = r.take(r.remaining())?;
    if data.is_empty() || data.len() > MAX_DATA_PIECE {
        return Err(DecodeError::LengthOutOfRange {
            length: data.len() as u64,
            limit: MAX_DATA_PIECE as u64,
        });
    }
    Ok(data)
}

/// A copy on lanes: 1 to [`MAX_LANES`] lanes, 1 byte to
/// [`MAX_COPY_FROM_DEVICE`].
fn check_lanes(length: u64, lanes: u32) -> Result<(), DecodeError> {
    if length == 0 || length > MAX_COPY_FROM_DEVICE {
        return Err(DecodeError::LengthOutOfRange {
            length,
            limit: MAX_COPY_FROM_DEVICE,
        });
    }
    if lanes == 0 || lanes > MAX_LANES {
        return Err(DecodeError::InvalidField {
            field: "lanes",
            value: lanes.into(),
        });
    }
    Ok(())
}

/// The body length a frame header announces, refused past [`MAX_FRAME`]
/// (and when empty: every frame has a kind).
pub fn frame_length(header: [u8; 4]) -> Result<usize, DecodeError> {
    let length = u32::from_le_bytes(header) as usize;
    if length == 0 || length > MAX_FRAME {
        return Err(DecodeError::LengthOutOfRange {
            length: length as u64,
            limit: MAX_FRAME as u64,
        });
    }
    Ok(length)
}

/// Frames up to this size are written in one piece (one TLS record, one
/// system call); larger ones as their head, then their bytes.
const WRITE_WHOLE: usize = 64 << 10;

/// Writes a frame whose fixed part is `head` (length word included, to be
/// patched) and whose tail is `tail`.
fn write_frame(
    mut head: WireWriter,
    tail: &[u8],
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    let body = u32::try_from(head.len() - 4 + tail.len()).unwrap_or(u32::MAX);
    head.patch_u32(0, body);
    if tail.len() <= WRITE_WHOLE {
        head.raw(tail);
        out.write_all(head.as_bytes())
    } else {
        out.write_all(head.as_bytes())?;
        out.write_all(tail)
    }
}

impl Request<'_> {
    /// The whole frame, header included.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing to a vector cannot fail.
        let _ = self.write_to(&mut out);
        out
    }

    /// The frame's variable part (a copy's data, a command), which follows
    /// its [`Request::head`].
    pub fn tail(&self) -> &[u8] {
        match self {
            Request::Hello { .. }
            | Request::CopyFromDevice { .. }
            | Request::CopyToDeviceLanes { .. }
            | Request::CopyFromDeviceLanes { .. }
            | Request::Query { .. }
            | Request::Ping => &[],
            Request::LanePiece { data } => data,
            Request::Send { command } | Request::Call { command } => command,
            Request::CopyToDevice { data, .. } | Request::ImagePiece { data } => data,
            Request::LoadModule { image, .. } => image,
        }
    }

    /// The frame up to its [`Request::tail`]: length, kind and fixed fields.
    pub fn head(&self) -> Vec<u8> {
        let (mut head, _) = self.parts();
        let body = u32::try_from(head.len() - 4 + self.tail().len()).unwrap_or(u32::MAX);
        head.patch_u32(0, body);
        head.into_bytes()
    }

    /// Writes the frame to `out` (a copy's data straight from its slice).
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let (head, tail) = self.parts();
        write_frame(head, tail, out)
    }

    fn parts(&self) -> (WireWriter, &[u8]) {
        match self {
            Request::Hello { version, role } => {
                let mut w = start(kind::HELLO, 64);
                w.raw(&HELLO_MAGIC).u32(*version);
                match role {
                    HelloRole::Process { name } => {
                        w.u8(ROLE_PROCESS).bytes_with_len(name.as_bytes());
                    }
                    HelloRole::Channel { token, name } => {
                        w.u8(ROLE_CHANNEL)
                            .raw(token)
                            .bytes_with_len(name.as_bytes());
                    }
                    HelloRole::Query { token, ctx_id } => {
                        w.u8(ROLE_QUERY).raw(token).u32(*ctx_id);
                    }
                    HelloRole::Lane { token, ctx_id } => {
                        w.u8(ROLE_LANE).raw(token).u32(*ctx_id);
                    }
                }
                (w, &[])
            }
            Request::Send { command } => (start(kind::SEND, command.len()), command),
            Request::Call { command } => (start(kind::CALL, command.len()), command),
            Request::CopyToDevice {
                stream,
                dst,
                sync,
                data,
            } => {
                let mut w = start(kind::COPY_TO_DEVICE, 16);
                w.u32(*stream).u64(*dst).u8(u8::from(*sync));
                (w, data)
            }
            Request::CopyFromDevice {
                stream,
                src,
                length,
            } => {
                let mut w = start(kind::COPY_FROM_DEVICE, 20);
                w.u32(*stream).u64(*src).u64(*length);
                (w, &[])
            }
            Request::ImagePiece { data } => (start(kind::IMAGE_PIECE, 0), data),
            Request::Query {
                after,
                stream,
                handle,
            } => {
                let mut w = start(kind::QUERY, 13);
                w.u64(*after).u8(u8::from(*stream)).u32(*handle);
                (w, &[])
            }
            Request::Ping => (start(kind::PING, 0), &[]),
            Request::CopyToDeviceLanes {
                stream,
                dst,
                length,
                sync,
                lanes,
            } => {
                let mut w = start(kind::COPY_TO_DEVICE_LANES, 25);
                w.u32(*stream)
                    .u64(*dst)
                    .u64(*length)
                    .u8(u8::from(*sync))
                    .u32(*lanes);
                (w, &[])
            }
            Request::LanePiece { data } => (start(kind::LANE_PIECE, 0), data),
            Request::CopyFromDeviceLanes {
                stream,
                src,
                length,
                lanes,
            } => {
                let mut w = start(kind::COPY_FROM_DEVICE_LANES, 24);
                w.u32(*stream).u64(*src).u64(*length).u32(*lanes);
                (w, &[])
            }
            Request::LoadModule { command, image } => {
                let mut w = start(kind::LOAD_MODULE, command.len() + 8);
                w.bytes_with_len(command);
                (w, image)
            }
        }
    }
}

impl<'a> Request<'a> {
    /// Decodes a frame body (after its length), borrowing its bytes.
    pub fn decode(body: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = WireReader::new(body);
        let request = match r.u8()? {
            kind::HELLO => {
                let magic = r.take(4)?;
                if magic != HELLO_MAGIC {
                    return Err(DecodeError::BadMagic(u32::from_le_bytes([
                        magic[0], magic[1], magic[2], magic[3],
                    ])));
                }
                let version = r.u32()?;
                let role = match r.u8()? {
                    ROLE_PROCESS => HelloRole::Process {
                        name: text(&mut r)?,
                    },
                    ROLE_CHANNEL => HelloRole::Channel {
                        token: token(&mut r)?,
                        name: text(&mut r)?,
                    },
                    ROLE_QUERY => HelloRole::Query {
                        token: token(&mut r)?,
                        ctx_id: r.u32()?,
                    },
                    ROLE_LANE => HelloRole::Lane {
                        token: token(&mut r)?,
                        ctx_id: r.u32()?,
                    },
                    other => {
                        return Err(DecodeError::InvalidField {
                            field: "role",
                            value: other.into(),
                        })
                    }
                };
                Request::Hello { version, role }
            }
            kind::SEND => Request::Send {
                command: r.take(r.remaining())?,
            },
            kind::CALL => Request::Call {
                command: r.take(r.remaining())?,
            },
            kind::COPY_TO_DEVICE => {
                let stream = r.u32()?;
                let dst = r.u64()?;
                let sync = flag(&mut r, "sync")?;
                let data = data_piece(&mut r)?;
                Request::CopyToDevice {
                    stream,
                    dst,
                    sync,
                    data,
                }
            }
            kind::COPY_FROM_DEVICE => {
                let stream = r.u32()?;
                let src = r.u64()?;
                let length = r.u64()?;
                if length == 0 || length > MAX_COPY_FROM_DEVICE {
                    return Err(DecodeError::LengthOutOfRange {
                        length,
                        limit: MAX_COPY_FROM_DEVICE,
                    });
                }
                Request::CopyFromDevice {
                    stream,
                    src,
                    length,
                }
            }
            kind::IMAGE_PIECE => Request::ImagePiece {
                data: r.take(r.remaining())?,
            },
            kind::PING => Request::Ping,
            kind::QUERY => Request::Query {
                after: r.u64()?,
                stream: flag(&mut r, "query kind")?,
                handle: r.u32()?,
            },
            kind::COPY_TO_DEVICE_LANES => {
                let stream = r.u32()?;
                let dst = r.u64()?;
                let length = r.u64()?;
                let sync = flag(&mut r, "sync")?;
                let lanes = r.u32()?;
                check_lanes(length, lanes)?;
                Request::CopyToDeviceLanes {
                    stream,
                    dst,
                    length,
                    sync,
                    lanes,
                }
            }
            kind::LANE_PIECE => Request::LanePiece {
                data: data_piece(&mut r)?,
            },
            kind::COPY_FROM_DEVICE_LANES => {
                let stream = r.u32()?;
                let src = r.u64()?;
                let length = r.u64()?;
                let lanes = r.u32()?;
                check_lanes(length, lanes)?;
                Request::CopyFromDeviceLanes {
                    stream,
                    src,
                    length,
                    lanes,
                }
            }
            kind::LOAD_MODULE => Request::LoadModule {
                command: r.bytes_with_len(4096)?,
                image: r.take(r.remaining())?,
            },
            other => {
                return Err(DecodeError::InvalidField {
                    field: "request kind",
                    value: other.into(),
                })
            }
        };
        r.finish()?;
        Ok(request)
    }
}

/// The head of a [`Response::Data`] frame of `length` bytes (the bytes
/// follow): a sender writes the head, then the bytes from where they are.
pub fn data_head(length: usize) -> [u8; 5] {
    let body = u32::try_from(length + 1).unwrap_or(u32::MAX).to_le_bytes();
    [body[0], body[1], body[2], body[3], kind::DATA]
}

/// Whether a frame's kind byte says [`Response::Data`] (whose bytes a
/// receiver may read straight into place).
pub fn is_data(kind_byte: u8) -> bool {
    kind_byte == kind::DATA
}

impl Response {
    /// The whole frame, header included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Response::Welcome {
                token,
                ctx_id,
                capset,
            } => {
                let mut w = start(kind::WELCOME, capset.len() + 32);
                w.raw(token).u32(*ctx_id).bytes_with_len(capset);
                finish(w)
            }
            Response::Refused { reason } => {
                let mut w = start(kind::REFUSED, reason.len() + 4);
                w.bytes_with_len(truncated(reason));
                finish(w)
            }
            Response::Reply { result, payload } => {
                let mut w = start(kind::REPLY, payload.len() + 4);
                w.u32(*result).raw(payload);
                finish(w)
            }
            Response::Result { result } => {
                let mut w = start(kind::RESULT, 4);
                w.u32(*result);
                finish(w)
            }
            Response::Data { data } => {
                let mut w = start(kind::DATA, data.len());
                w.raw(data);
                finish(w)
            }
            Response::Failed { reason } => {
                let mut w = start(kind::FAILED, reason.len() + 4);
                w.bytes_with_len(truncated(reason));
                finish(w)
            }
            Response::Console { bytes } => {
                let mut w = start(kind::CONSOLE, bytes.len());
                w.raw(bytes);
                finish(w)
            }
        }
    }

    /// Decodes a frame body (after its length).
    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = WireReader::new(body);
        let response = match r.u8()? {
            kind::WELCOME => Response::Welcome {
                token: token(&mut r)?,
                ctx_id: r.u32()?,
                capset: r.bytes_with_len(MAX_FRAME)?.to_vec(),
            },
            kind::REFUSED => Response::Refused {
                reason: text(&mut r)?,
            },
            kind::REPLY => Response::Reply {
                result: r.u32()?,
                payload: r.take(r.remaining())?.to_vec(),
            },
            kind::RESULT => Response::Result { result: r.u32()? },
            kind::DATA => Response::Data {
                data: r.take(r.remaining())?.to_vec(),
            },
            kind::FAILED => Response::Failed {
                reason: text(&mut r)?,
            },
            kind::CONSOLE => Response::Console {
                bytes: r.take(r.remaining())?.to_vec(),
            },
            other => {
                return Err(DecodeError::InvalidField {
                    field: "response kind",
                    value: other.into(),
                })
            }
        };
        r.finish()?;
        Ok(response)
    }
}

/// At most [`MAX_TEXT`] bytes of `text`, cut at a character boundary.
fn truncated(text: &str) -> &[u8] {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text.as_bytes()[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        let length = frame_length([frame[0], frame[1], frame[2], frame[3]]).unwrap();
        assert_eq!(length, frame.len() - 4);
        &frame[4..]
    }

    #[test]
    fn requests_round_trip() {
        // Past the size written in one piece.
        let big = vec![0x5a; MAX_DATA_PIECE];
        let requests = [
            Request::Hello {
                version: REMOTE_VERSION,
                role: HelloRole::Process {
                    name: "1:python3".into(),
                },
            },
            Request::Hello {
                version: REMOTE_VERSION,
                role: HelloRole::Channel {
                    token: [7; TOKEN_BYTES],
                    name: "1:python3".into(),
                },
            },
            Request::Send {
                command: &[1, 2, 3, 4, 5, 6, 7, 8],
            },
            Request::Call { command: &[9; 24] },
            Request::CopyToDevice {
                stream: 3,
                dst: 0x7f00_0000_1000,
                sync: true,
                data: &[0xab; 4096],
            },
            Request::CopyToDevice {
                stream: 3,
                dst: 0x7f00_0000_1000,
                sync: false,
                data: &big,
            },
            Request::CopyFromDevice {
                stream: 0,
                src: 0x7f00_0000_2000,
                length: 1 << 20,
            },
            Request::ImagePiece { data: &[3; 4096] },
            Request::Query {
                after: 17,
                stream: true,
                handle: 3,
            },
            Request::Ping,
            Request::Hello {
                version: REMOTE_VERSION,
                role: HelloRole::Query {
                    token: [9; TOKEN_BYTES],
                    ctx_id: 4,
                },
            },
            Request::LoadModule {
                command: &[1; 48],
                image: &[2; 100],
            },
            Request::Hello {
                version: REMOTE_VERSION,
                role: HelloRole::Lane {
                    token: [5; TOKEN_BYTES],
                    ctx_id: 2,
                },
            },
            Request::CopyToDeviceLanes {
                stream: 1,
                dst: 0x7f00_0001_0000,
                length: 64 << 20,
                sync: true,
                lanes: 4,
            },
            Request::LanePiece { data: &big },
            Request::CopyFromDeviceLanes {
                stream: 0,
                src: 0x7f00_0002_0000,
                length: (64 << 20) + 1,
                lanes: MAX_LANES,
            },
        ];
        for request in requests {
            let frame = request.encode();
            let mut parts = request.head();
            parts.extend_from_slice(request.tail());
            assert_eq!(parts, frame);
            assert_eq!(Request::decode(body(&frame)), Ok(request));
        }
    }

    #[test]
    fn copies_on_lanes_are_bounded_and_cut_in_pieces() {
        let lanes = |length, lanes| {
            Request::CopyToDeviceLanes {
                stream: 0,
                dst: 0x1000,
                length,
                sync: false,
                lanes,
            }
            .encode()
        };
        for (length, count) in [(1, 1), (MAX_COPY_FROM_DEVICE, MAX_LANES)] {
            assert!(Request::decode(body(&lanes(length, count))).is_ok());
        }
        for (length, count) in [
            (0, 1),
            (MAX_COPY_FROM_DEVICE + 1, 1),
            (1, 0),
            (1, MAX_LANES + 1),
        ] {
            assert!(
                Request::decode(body(&lanes(length, count))).is_err(),
                "{length} bytes on {count} lanes"
            );
        }
        let piece = MAX_DATA_PIECE as u64;
        assert_eq!(lane_piece_len(2 * piece + 5, 0), MAX_DATA_PIECE);
        assert_eq!(lane_piece_len(2 * piece + 5, 2), 5);
        assert_eq!(lane_piece_len(2 * piece + 5, 3), 0);
        assert_eq!(lane_piece_len(u64::MAX, u64::MAX), 0);
        assert!(Request::decode(body(&Request::LanePiece { data: &[] }.encode())).is_err());
    }

    #[test]
    fn responses_round_trip() {
        let responses = [
            Response::Welcome {
                token: [1; TOKEN_BYTES],
                ctx_id: 5,
                capset: vec![3; 40],
            },
            Response::Refused {
                reason: "no tenant".into(),
            },
            Response::Reply {
                result: 0,
                payload: vec![4; 12],
            },
            Response::Result { result: 2 },
            Response::Data {
                data: vec![5; 1000],
            },
            Response::Failed {
                reason: "context lost".into(),
            },
            Response::Console {
                bytes: b"hello from the GPU\n".to_vec(),
            },
        ];
        for response in responses {
            let frame = response.encode();
            assert_eq!(Response::decode(body(&frame)), Ok(response));
        }
    }

    #[test]
    fn bad_frames_are_refused_without_panics() {
        assert!(frame_length([0, 0, 0, 0]).is_err());
        assert!(frame_length(((MAX_FRAME + 1) as u32).to_le_bytes()).is_err());
        // A hello without the magic, a copy of nothing or of too much, a
        // bad sync flag, an unknown kind, trailing bytes.
        assert!(Request::decode(&[kind::HELLO, b'x', b'g', b'p', b'u', 1, 0, 0, 0, 0]).is_err());
        let mut copy = Request::CopyFromDevice {
            stream: 0,
            src: 0,
            length: MAX_COPY_FROM_DEVICE + 1,
        }
        .encode();
        assert!(Request::decode(&copy[4..]).is_err());
        copy = Request::CopyToDevice {
            stream: 0,
            dst: 0,
            sync: false,
            data: &[1],
        }
        .encode();
        copy[4 + 13] = 2;
        assert!(Request::decode(&copy[4..]).is_err());
        assert!(Request::decode(&[0x7f]).is_err());
        let mut result = Response::Result { result: 0 }.encode();
        result.push(0);
        assert!(Response::decode(&result[4..]).is_err());
        // Every prefix of a valid frame fails cleanly.
        let frame = Request::Hello {
            version: 1,
            role: HelloRole::Channel {
                token: [0; TOKEN_BYTES],
                name: "n".into(),
            },
        }
        .encode();
        for end in 0..frame.len() - 4 {
            assert!(Request::decode(&frame[4..4 + end]).is_err());
        }
    }

    #[test]
    fn a_data_head_and_its_bytes_make_a_data_frame() {
        let mut frame = data_head(3).to_vec();
        frame.extend_from_slice(&[7, 8, 9]);
        assert!(is_data(frame[4]));
        assert_eq!(
            Response::decode(body(&frame)),
            Ok(Response::Data {
                data: vec![7, 8, 9]
            })
        );
    }

    #[test]
    fn long_reasons_are_cut_at_a_character_boundary() {
        let reason = "é".repeat(MAX_TEXT);
        let frame = Response::Refused { reason }.encode();
        match Response::decode(body(&frame)) {
            Ok(Response::Refused { reason }) => assert!(reason.len() <= MAX_TEXT),
            other => panic!("{other:?}"),
        }
    }
}
