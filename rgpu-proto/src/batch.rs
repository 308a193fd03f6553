//! A batch: the payload of one `SUBMIT_3D`, a versioned header followed by
//! back-to-back control commands (CUDA commands travel in the ring).

use crate::command::{decode_all, ControlCommand, Decoded};
use crate::wire::{DecodeError, WireReader, WireWriter};
use crate::PROTOCOL_VERSION;

/// "RGPU" little-endian.
pub const BATCH_MAGIC: u32 = 0x5550_4752;
pub const BATCH_HEADER_SIZE: usize = 16;
/// Largest SUBMIT_3D payload the host accepts.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Encodes control commands (each with its reply number) into a batch.
pub fn encode_batch(commands: &[(u64, ControlCommand)]) -> Vec<u8> {
    let mut w = WireWriter::new();
    w.u32(BATCH_MAGIC).u32(PROTOCOL_VERSION).u32(0).u32(0);
    for (seq, command) in commands {
        command.encode(*seq, &mut w);
    }
    let len = w.len() as u32;
    w.patch_u32(8, len);
    w.into_bytes()
}

/// Checks the batch header and returns the command bytes it covers.
pub fn batch_commands(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    let mut r = WireReader::new(bytes);
    let magic = r.u32()?;
    if magic != BATCH_MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = r.u32()?;
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let length = r.u32()? as usize;
    let _reserved = r.u32()?;
    if length < BATCH_HEADER_SIZE || length > bytes.len() || length > MAX_BATCH_BYTES {
        return Err(DecodeError::LengthOutOfRange {
            length: length as u64,
            limit: bytes.len().min(MAX_BATCH_BYTES) as u64,
        });
    }
    bytes
        .get(BATCH_HEADER_SIZE..length)
        .ok_or(DecodeError::Truncated {
            offset: BATCH_HEADER_SIZE,
            needed: length,
            available: bytes.len(),
        })
}

/// Decodes a whole batch; the first bad command fails the batch (a ring
/// command among them too).
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<Decoded<ControlCommand>>, DecodeError> {
    decode_all(batch_commands(bytes)?).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;

    #[test]
    fn batch_round_trip() {
        let commands = vec![
            (0, ControlCommand::Doorbell { until: 4096 }),
            (
                7,
                ControlCommand::PlaceNextBlob {
                    address: 0x7000_0000,
                    size: 1 << 20,
                },
            ),
        ];
        let bytes = encode_batch(&commands);
        let decoded = decode_batch(&bytes).expect("valid batch");
        assert_eq!(decoded.len(), 2);
        for ((seq, command), d) in commands.iter().zip(&decoded) {
            assert_eq!(*seq, d.reply_seq);
            assert_eq!(command, &d.command);
        }
    }

    #[test]
    fn batch_rejects_bad_header() {
        let mut bytes = encode_batch(&[(0, ControlCommand::Doorbell { until: 1 })]);
        let mut wrong_version = bytes.clone();
        wrong_version[4] = 99;
        assert_eq!(
            decode_batch(&wrong_version),
            Err(DecodeError::UnsupportedVersion(99))
        );
        bytes[0] ^= 0xff;
        assert!(matches!(
            decode_batch(&bytes),
            Err(DecodeError::BadMagic(_))
        ));
        let short = encode_batch(&[(0, ControlCommand::Doorbell { until: 1 })]);
        assert!(decode_batch(&short[..short.len() - 3]).is_err());
    }

    #[test]
    fn a_ring_command_is_no_control_command() {
        let mut w = WireWriter::new();
        w.u32(BATCH_MAGIC).u32(PROTOCOL_VERSION).u32(0).u32(0);
        Command::CtxSynchronize.encode(1, &mut w);
        let len = w.len() as u32;
        w.patch_u32(8, len);
        assert_eq!(
            decode_batch(&w.into_bytes()),
            Err(DecodeError::UnknownOpcode(0x0100))
        );
    }
}
