//! Talks to a running daemon through the local carrier (`RGPU_SOCKET=PATH`):
//! prints the capset, opens a channel, round-trips data through device
//! memory, times a few calls, and closes. `rgpu_probe [CALLS]`.

use std::error::Error;
use std::time::Instant;

use rgpu_proto::cuda_result::CUDA_SUCCESS;
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::Command;
use rgpu_transport::carrier::open_from_env;
use rgpu_transport::Channel;

fn main() -> Result<(), Box<dyn Error>> {
    let carrier = open_from_env()?;
    let capset = carrier.capset();
    println!(
        "capset: protocol {}, driver {}, executor {:?}, {} device(s)",
        capset.protocol_version,
        capset.driver_version,
        capset.executor,
        capset.devices.len()
    );
    for d in &capset.devices {
        println!("  {} ({} MiB)", d.name, d.total_mem >> 20);
    }

    let channel = Channel::open(carrier.clone(), "rgpu-probe")?;
    println!("channel bound: context {}", channel.ctx_id());

    let size = 3 << 20;
    let reply = channel.call(&Command::MemAlloc { size })?;
    if reply.result != CUDA_SUCCESS {
        return Err(format!("MemAlloc failed: {}", reply.result).into());
    }
    let [device_ptr] = decode_u64s::<1>(&reply.payload)?;
    let data: Vec<u8> = (0..size as usize)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let start = Instant::now();
    let result = channel.copy_to_device(0, device_ptr, &data, true)?;
    let up = start.elapsed();
    let mut back = vec![0u8; data.len()];
    let start = Instant::now();
    let result_back = channel.copy_from_device(0, &mut back, device_ptr)?;
    let down = start.elapsed();
    println!(
        "copy {} bytes: to device {result} in {up:?}, back {result_back} in {down:?}, equal: {}",
        data.len(),
        back == data
    );

    // An argument sets the number of timed calls (long runs let a test kill
    // the daemon underneath).
    let calls: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let start = Instant::now();
    for _ in 0..calls {
        channel.call(&Command::MemGetInfo)?;
    }
    println!(
        "{calls} MemGetInfo calls: {:?} each",
        start.elapsed() / calls
    );

    let reply = channel.call(&Command::MemFree { device_ptr })?;
    println!("MemFree: {}", reply.result);
    channel.close()?;
    println!("closed");
    if back != data {
        return Err("data read back differs".into());
    }
    Ok(())
}
