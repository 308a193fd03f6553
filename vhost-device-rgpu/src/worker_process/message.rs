//! The messages between a connection process and its worker processes, one
//! definition each, encoded with rgpu-proto's wire cursors (one message per
//! SEQPACKET datagram: [`super::link`]).

use rgpu_proto::wire::{DecodeError, WireReader, WireWriter};

/// Largest message either side sends; a longer datagram is an error.
pub const MAX_MESSAGE_BYTES: usize = 128 << 10;
/// Blob runs per `BlobRuns` message (20 bytes each, well inside the limit).
pub const RUNS_PER_MESSAGE: usize = 4096;
/// Largest `SUBMIT_3D` payload forwarded (the batch rides in one message).
pub const MAX_SUBMIT_PAYLOAD: usize = MAX_MESSAGE_BYTES - 64;
/// Longest context debug name forwarded.
const MAX_NAME_BYTES: usize = 256;

/// A piece of a blob: `len` bytes at `offset` of guest-memory file `file`
/// (a number the connection gave the file in a `File` message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRun {
    pub file: u32,
    pub offset: u64,
    pub len: u64,
}

/// Connection process to worker. A `token` other than 0 asks for a `Done`
/// with it once the request has taken full effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToWorker {
    /// Guest memory file number `file` for the next `MapBlob`; the
    /// descriptor rides along.
    File {
        file: u32,
    },
    /// More runs of a blob that a `MapBlob` will complete.
    BlobRuns {
        resource_id: u32,
        runs: Vec<FileRun>,
    },
    /// Map the runs sent for `resource_id` (`size` bytes in all) and
    /// register them for DMA; at `address` if that is not 0 and still free
    /// (the guest process's own address of the blob: kernels then reach it
    /// by the guest's pointer).
    MapBlob {
        resource_id: u32,
        size: u64,
        address: u64,
    },
    CreateSession {
        ctx_id: u32,
        name: String,
    },
    Attach {
        ctx_id: u32,
        resource_id: u32,
    },
    /// Done once the context's queued GPU work can no longer touch the blob.
    Detach {
        ctx_id: u32,
        resource_id: u32,
        token: u64,
    },
    /// Done once the blob is unregistered and unmapped in the worker.
    ForgetBlob {
        resource_id: u32,
        token: u64,
    },
    /// A `SUBMIT_3D` batch; done when the session has executed up to its
    /// doorbell (a fenced submission).
    Submit {
        ctx_id: u32,
        token: u64,
        payload: Vec<u8>,
    },
    /// Done once the session and everything it held are gone.
    DestroySession {
        ctx_id: u32,
        token: u64,
    },
}

/// Worker to connection process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromWorker {
    Done { token: u64 },
}

const FILE: u8 = 1;
const BLOB_RUNS: u8 = 2;
const MAP_BLOB: u8 = 3;
const CREATE_SESSION: u8 = 4;
const ATTACH: u8 = 5;
const DETACH: u8 = 6;
const FORGET_BLOB: u8 = 7;
const SUBMIT: u8 = 8;
const DESTROY_SESSION: u8 = 9;
const DONE: u8 = 64;

impl ToWorker {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = WireWriter::new();
        match self {
            ToWorker::File { file } => {
                w.u8(FILE).u32(*file);
            }
            ToWorker::BlobRuns { resource_id, runs } => {
                w.u8(BLOB_RUNS).u32(*resource_id).u32(runs.len() as u32);
                for run in runs {
                    w.u32(run.file).u64(run.offset).u64(run.len);
                }
            }
            ToWorker::MapBlob {
                resource_id,
                size,
                address,
            } => {
                w.u8(MAP_BLOB).u32(*resource_id).u64(*size).u64(*address);
            }
            ToWorker::CreateSession { ctx_id, name } => {
                let name = name.as_bytes();
                let name = name.get(..MAX_NAME_BYTES).unwrap_or(name);
                w.u8(CREATE_SESSION).u32(*ctx_id).bytes_with_len(name);
            }
            ToWorker::Attach {
                ctx_id,
                resource_id,
            } => {
                w.u8(ATTACH).u32(*ctx_id).u32(*resource_id);
            }
            ToWorker::Detach {
                ctx_id,
                resource_id,
                token,
            } => {
                w.u8(DETACH).u32(*ctx_id).u32(*resource_id).u64(*token);
            }
            ToWorker::ForgetBlob { resource_id, token } => {
                w.u8(FORGET_BLOB).u32(*resource_id).u64(*token);
            }
            ToWorker::Submit {
                ctx_id,
                token,
                payload,
            } => {
                w.u8(SUBMIT)
                    .u32(*ctx_id)
                    .u64(*token)
                    .bytes_with_len(payload);
            }
            ToWorker::DestroySession { ctx_id, token } => {
                w.u8(DESTROY_SESSION).u32(*ctx_id).u64(*token);
            }
        }
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<ToWorker, DecodeError> {
        let mut r = WireReader::new(bytes);
        let message = match r.u8()? {
            FILE => ToWorker::File { file: r.u32()? },
            BLOB_RUNS => {
                let resource_id = r.u32()?;
                let count = r.u32()? as usize;
                if count > RUNS_PER_MESSAGE {
                    return Err(DecodeError::LengthOutOfRange {
                        length: count as u64,
                        limit: RUNS_PER_MESSAGE as u64,
                    });
                }
                let mut runs = Vec::with_capacity(count);
                for _ in 0..count {
                    runs.push(FileRun {
                        file: r.u32()?,
                        offset: r.u64()?,
                        len: r.u64()?,
                    });
                }
                ToWorker::BlobRuns { resource_id, runs }
            }
            MAP_BLOB => ToWorker::MapBlob {
                resource_id: r.u32()?,
                size: r.u64()?,
                address: r.u64()?,
            },
            CREATE_SESSION => ToWorker::CreateSession {
                ctx_id: r.u32()?,
                name: String::from_utf8_lossy(r.bytes_with_len(MAX_NAME_BYTES)?).into_owned(),
            },
            ATTACH => ToWorker::Attach {
                ctx_id: r.u32()?,
                resource_id: r.u32()?,
            },
            DETACH => ToWorker::Detach {
                ctx_id: r.u32()?,
                resource_id: r.u32()?,
                token: r.u64()?,
            },
            FORGET_BLOB => ToWorker::ForgetBlob {
                resource_id: r.u32()?,
                token: r.u64()?,
            },
            SUBMIT => ToWorker::Submit {
                ctx_id: r.u32()?,
                token: r.u64()?,
                payload: r.bytes_with_len(MAX_SUBMIT_PAYLOAD)?.to_vec(),
            },
            DESTROY_SESSION => ToWorker::DestroySession {
                ctx_id: r.u32()?,
                token: r.u64()?,
            },
            other => {
                return Err(DecodeError::InvalidField {
                    field: "worker message",
                    value: other.into(),
                })
            }
        };
        r.finish()?;
        Ok(message)
    }
}

impl FromWorker {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = WireWriter::new();
        match self {
            FromWorker::Done { token } => {
                w.u8(DONE).u64(*token);
            }
        }
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<FromWorker, DecodeError> {
        let mut r = WireReader::new(bytes);
        let message = match r.u8()? {
            DONE => FromWorker::Done { token: r.u64()? },
            other => {
                return Err(DecodeError::InvalidField {
                    field: "worker reply",
                    value: other.into(),
                })
            }
        };
        r.finish()?;
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips_and_truncations_are_errors() {
        let messages = [
            ToWorker::File { file: 3 },
            ToWorker::BlobRuns {
                resource_id: 9,
                runs: vec![
                    FileRun {
                        file: 1,
                        offset: 0x1000,
                        len: 0x2000,
                    };
                    3
                ],
            },
            ToWorker::MapBlob {
                resource_id: 9,
                size: 0x6000,
                address: 0x7f00_1234_5000,
            },
            ToWorker::CreateSession {
                ctx_id: 4,
                name: "python3".into(),
            },
            ToWorker::Attach {
                ctx_id: 4,
                resource_id: 9,
            },
            ToWorker::Detach {
                ctx_id: 4,
                resource_id: 9,
                token: 77,
            },
            ToWorker::ForgetBlob {
                resource_id: 9,
                token: 78,
            },
            ToWorker::Submit {
                ctx_id: 4,
                token: 0,
                payload: vec![1, 2, 3],
            },
            ToWorker::DestroySession {
                ctx_id: 4,
                token: 79,
            },
        ];
        for message in messages {
            let bytes = message.encode();
            assert_eq!(ToWorker::decode(&bytes), Ok(message.clone()));
            for cut in 0..bytes.len() {
                assert!(
                    ToWorker::decode(&bytes[..cut]).is_err(),
                    "{message:?} cut at {cut}"
                );
            }
        }
        let done = FromWorker::Done { token: 5 };
        assert_eq!(FromWorker::decode(&done.encode()), Ok(done));
        assert!(ToWorker::decode(&[200]).is_err());
        assert!(FromWorker::decode(&[1, 0]).is_err());
    }
}
