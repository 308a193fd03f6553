//! Large copies on a channel's data lanes (rgpu-proto `remote`,
//! `Request::CopyToDeviceLanes`): extra connections of the same channel
//! that carry a copy's pieces side by side, so that each lane's TLS runs
//! on a core of its own (one connection's TLS tops out near 3 GB/s on the
//! H200 host). The channel connection's thread waits until every piece is
//! staged, which keeps the channel's order.

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

use rgpu_proto::cuda_result::CUDA_SUCCESS;
use rgpu_proto::remote::{lane_piece_len, Request, Response, MAX_DATA_PIECE};
use rgpu_transport::Channel;

use super::gateway::Frames;

/// A channel's lanes, in the order they said hello.
pub type Lanes = Arc<Mutex<Vec<Frames>>>;

/// Bytes between one piece's start and the next.
const PIECE: u64 = MAX_DATA_PIECE as u64;

/// The first `count` lanes, taken for one copy (given back by
/// [`give_back`]).
fn take(lanes: &Lanes, count: u32) -> Result<Vec<Frames>, String> {
    let mut held = lanes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let count = count as usize;
    if held.len() < count {
        return Err(format!(
            "a copy on {count} lanes, and the channel has {}",
            held.len()
        ));
    }
    Ok(held.drain(..count).collect())
}

fn give_back(lanes: &Lanes, taken: Vec<Frames>) {
    let mut held = lanes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let rest = std::mem::replace(&mut *held, taken);
    held.extend(rest);
}

/// `CopyToDeviceLanes`: every piece but the last is staged asynchronously
/// by the thread reading its lane; the last is staged after all of them
/// (answered when `sync`), so its reply covers the whole copy. The CUDA
/// result (CUDA_SUCCESS unless `sync`).
#[allow(clippy::too_many_arguments)]
pub fn copy_to_device(
    lanes: &Lanes,
    channel: &Channel,
    stream: u32,
    dst: u64,
    length: u64,
    sync: bool,
    count: u32,
) -> Result<u32, String> {
    let mut taken = take(lanes, count)?;
    let pieces = length.div_ceil(PIECE);
    let lane_count = u64::from(count);
    let read = std::thread::scope(|scope| {
        let readers: Vec<_> = taken
            .iter_mut()
            .enumerate()
            .map(|(lane, frames)| {
                scope.spawn(move || -> Result<Option<Vec<u8>>, String> {
                    let mut body = Vec::new();
                    let mut last = None;
                    let mut index = lane as u64;
                    while index < pieces {
                        let want = lane_piece_len(length, index);
                        let data = match frames.read(&mut body) {
                            Ok(Some(Request::LanePiece { data })) if data.len() == want => data,
                            Ok(Some(_)) => {
                                return Err(format!(
                                    "lane {lane}: expected piece {index} ({want} bytes)"
                                ))
                            }
                            Ok(None) => return Err(format!("lane {lane} closed")),
                            Err(e) => return Err(format!("lane {lane}: read: {e}")),
                        };
                        if index + 1 == pieces {
                            last = Some(data.to_vec());
                        } else {
                            channel
                                .copy_to_device(
                                    stream,
                                    dst.wrapping_add(index * PIECE),
                                    data,
                                    false,
                                )
                                .map_err(|e| format!("the host side failed: {e}"))?;
                        }
                        index += lane_count;
                    }
                    Ok(last)
                })
            })
            .collect();
        let mut last = None;
        for reader in readers {
            match reader.join() {
                Ok(Ok(kept)) => last = last.or(kept),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err("a lane thread panicked".to_owned()),
            }
        }
        last.ok_or_else(|| "no last piece".to_owned())
    });
    give_back(lanes, taken);
    let last = read?;
    let at = dst.wrapping_add((pieces - 1) * PIECE);
    channel
        .copy_to_device(stream, at, &last, sync)
        .map_err(|e| format!("the host side failed: {e}"))
}

/// `CopyFromDeviceLanes`: this thread reads the pieces from the device
/// (the channel's bounce area pipelines them) and hands each to its lane's
/// thread, which sends it while the next is read; after a failure every
/// piece left goes as an empty one, so that the lanes stay in step. Then
/// the result on the channel connection.
pub fn copy_from_device(
    frames: &mut Frames,
    lanes: &Lanes,
    channel: &Channel,
    stream: u32,
    src: u64,
    length: u64,
    count: u32,
) -> Result<(), String> {
    let mut taken = take(lanes, count)?;
    let pieces = length.div_ceil(PIECE);
    let lane_count = u64::from(count);
    let outcome = std::thread::scope(|scope| {
        let (spare_tx, spare_rx) = sync_channel::<Vec<u8>>(2 * taken.len() + 2);
        let mut to_lanes = Vec::with_capacity(taken.len());
        let mut writers = Vec::with_capacity(taken.len());
        for (lane, frames) in taken.iter_mut().enumerate() {
            let (tx, rx) = sync_channel::<Option<Vec<u8>>>(1);
            to_lanes.push(tx);
            let spare = spare_tx.clone();
            writers.push(scope.spawn(move || -> Result<(), String> {
                for piece in rx {
                    let data = piece.as_deref().unwrap_or_default();
                    frames
                        .write_data(data)
                        .map_err(|e| format!("lane {lane}: write: {e}"))?;
                    if let Some(buffer) = piece {
                        let _ = spare.try_send(buffer);
                    }
                }
                Ok(())
            }));
        }
        drop(spare_tx);
        let mut result = CUDA_SUCCESS;
        let mut failed = None;
        for index in 0..pieces {
            let Some(lane) = to_lanes.get((index % lane_count) as usize) else {
                break;
            };
            let piece = if result == CUDA_SUCCESS {
                let mut buffer = spare_rx.try_recv().unwrap_or_default();
                buffer.resize(lane_piece_len(length, index), 0);
                match channel.copy_from_device(stream, &mut buffer, src.wrapping_add(index * PIECE))
                {
                    Ok(CUDA_SUCCESS) => Some(buffer),
                    Ok(code) => {
                        result = code;
                        None
                    }
                    Err(e) => {
                        failed = Some(format!("the host side failed: {e}"));
                        break;
                    }
                }
            } else {
                None
            };
            if lane.send(piece).is_err() {
                break;
            }
        }
        drop(to_lanes);
        for writer in writers {
            match writer.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => failed = failed.or(Some("a lane thread panicked".to_owned())),
            }
        }
        failed.map_or(Ok(result), Err)
    });
    give_back(lanes, taken);
    let result = outcome?;
    frames
        .relay_console(channel)
        .and_then(|()| frames.write(&Response::Result { result }))
        .map_err(|e| format!("write: {e}"))
}
