//! A small host-memory executor for the session tests: allocations, copies,
//! memset, streams, events and one kernel (`rgpu_fill_index`), plus
//! bookkeeping the tests check (live contexts, registered host memory).
//!
//! Like NVIDIA's driver with unified addressing, every context of the
//! executor (of the host process) can reach every allocation of every other
//! one: the sessions must check pointers themselves.
//!
//! CUDA IPC: a memory handle names an allocation by its address, and
//! opening it (from any context: one address space) maps that same memory
//! at that same address; an event handle opens as a new event.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rgpu_executor::{ContextExecutor, CuResult, DeviceStatus, Executor, HostRun, StreamRef};
use rgpu_proto::capset::{DeviceInfo, ATTRIBUTE_SLOTS, ATTRIBUTE_UNSUPPORTED};
use rgpu_proto::command::{IpcHandle, IPC_HANDLE_BYTES};
use rgpu_proto::cuda_result::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND,
};
use rgpu_proto::reply::{FunctionInfo, ParamSlot};

/// What the tests observe from outside the worker thread.
#[derive(Debug, Default)]
pub struct FakeState {
    pub live_contexts: usize,
    /// Contexts ever created.
    pub contexts_created: usize,
    /// Make the next context creations fail with this CUDA error.
    pub fail_create: Option<u32>,
    pub registered_bytes: usize,
    pub launches: usize,
    /// IPC opens of memory not closed yet (a context's end closes its own).
    pub ipc_opens: usize,
}

pub struct FakeExecutor {
    pub state: Arc<Mutex<FakeState>>,
    memory: Arc<Mutex<FakeMemory>>,
}

/// The device memory of all contexts: one address space.
struct FakeMemory {
    blocks: BTreeMap<u64, Vec<u8>>,
    next_ptr: u64,
}

impl FakeExecutor {
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(FakeState::default())),
            memory: Arc::new(Mutex::new(FakeMemory {
                blocks: BTreeMap::new(),
                next_ptr: 0x7f00_0000_0000,
            })),
        }
    }
}

pub const FAKE_TOTAL_MEM: u64 = 1 << 30;

fn lock<T>(state: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The device bytes at `ptr..ptr + len`, inside one allocation.
fn span(blocks: &mut BTreeMap<u64, Vec<u8>>, ptr: u64, len: u64) -> CuResult<&mut [u8]> {
    let (base, bytes) = blocks
        .range_mut(..=ptr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let start = (ptr - base) as usize;
    bytes
        .get_mut(start..start + len as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

impl Executor for FakeExecutor {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn driver_version(&self) -> i32 {
        13000
    }
    fn devices(&self) -> Vec<DeviceInfo> {
        vec![DeviceInfo {
            name: "fake".into(),
            uuid: [1; 16],
            total_mem: FAKE_TOTAL_MEM,
            host_ordinal: 0,
            attributes: vec![ATTRIBUTE_UNSUPPORTED; ATTRIBUTE_SLOTS],
        }]
    }
    fn create_context(&self, device: u32) -> CuResult<Box<dyn ContextExecutor>> {
        if device != 0 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let mut state = lock(&self.state);
        if let Some(code) = state.fail_create {
            return Err(code);
        }
        state.live_contexts += 1;
        state.contexts_created += 1;
        drop(state);
        Ok(Box::new(FakeContext {
            state: self.state.clone(),
            memory: self.memory.clone(),
            owned: HashSet::new(),
            next_handle: 1,
            modules: HashMap::new(),
            functions: HashMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            ipc_opens: HashMap::new(),
        }))
    }
    fn register_host_memory(&self, run: HostRun) -> CuResult<()> {
        lock(&self.state).registered_bytes += run.len;
        Ok(())
    }
    fn unregister_host_memory(&self, run: HostRun) {
        lock(&self.state).registered_bytes -= run.len;
    }
    fn device_status(&self, device: u32) -> CuResult<DeviceStatus> {
        if device != 0 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        Ok(DeviceStatus {
            free: FAKE_TOTAL_MEM / 2,
            total: FAKE_TOTAL_MEM,
            gpu_utilization: Some(50),
            memory_utilization: None,
            driver_version: "580.1".into(),
        })
    }
}

struct FakeContext {
    state: Arc<Mutex<FakeState>>,
    memory: Arc<Mutex<FakeMemory>>,
    /// Allocations this context made: freed with it.
    owned: HashSet<u64>,
    next_handle: u64,
    modules: HashMap<u64, ()>,
    functions: HashMap<u64, ()>,
    streams: HashMap<u64, ()>,
    events: HashMap<u64, f32>,
    /// Memory opened through IPC, with how often.
    ipc_opens: HashMap<u64, u32>,
}

const FAKE_IPC_MEM: &[u8; 8] = b"fake-mem";
const FAKE_IPC_EVENT: &[u8; 8] = b"fake-evt";

fn fake_handle(magic: &[u8; 8], object: u64) -> IpcHandle {
    let mut handle = [0u8; IPC_HANDLE_BYTES];
    handle[..8].copy_from_slice(magic);
    handle[8..16].copy_from_slice(&object.to_le_bytes());
    handle
}

fn fake_object(magic: &[u8; 8], handle: &IpcHandle) -> CuResult<u64> {
    if &handle[..8] != magic || handle[16..].iter().any(|b| *b != 0) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let mut object = [0u8; 8];
    object.copy_from_slice(&handle[8..16]);
    Ok(u64::from_le_bytes(object))
}

impl Drop for FakeContext {
    fn drop(&mut self) {
        let mut memory = lock(&self.memory);
        for ptr in self.owned.drain() {
            memory.blocks.remove(&ptr);
        }
        let mut state = lock(&self.state);
        state.live_contexts -= 1;
        state.ipc_opens -= self.ipc_opens.values().map(|n| *n as usize).sum::<usize>();
    }
}

impl FakeContext {
    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    fn check_stream(&self, stream: StreamRef) -> CuResult<()> {
        match stream {
            StreamRef::Created(s) if !self.streams.contains_key(&s) => {
                Err(CUDA_ERROR_INVALID_HANDLE)
            }
            _ => Ok(()),
        }
    }
}

fn total(runs: &[HostRun]) -> u64 {
    runs.iter().map(|r| r.len as u64).sum()
}

impl ContextExecutor for FakeContext {
    fn synchronize(&mut self) -> CuResult<()> {
        Ok(())
    }
    fn get_limit(&mut self, limit: u32) -> CuResult<u64> {
        Ok(u64::from(limit) * 100)
    }
    fn set_limit(&mut self, _limit: u32, _value: u64) -> CuResult<()> {
        Ok(())
    }
    fn mem_alloc(&mut self, size: u64) -> CuResult<u64> {
        if size == 0 || size > 1 << 30 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut memory = lock(&self.memory);
        let ptr = memory.next_ptr;
        memory.next_ptr += size.next_multiple_of(0x1000);
        memory.blocks.insert(ptr, vec![0; size as usize]);
        self.owned.insert(ptr);
        Ok(ptr)
    }
    fn mem_free(&mut self, device_ptr: u64) -> CuResult<()> {
        self.owned.remove(&device_ptr);
        lock(&self.memory)
            .blocks
            .remove(&device_ptr)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }
    fn mem_get_info(&mut self) -> CuResult<(u64, u64)> {
        let used: u64 = lock(&self.memory)
            .blocks
            .values()
            .map(|v| v.len() as u64)
            .sum();
        Ok(((1 << 30) - used, 1 << 30))
    }
    fn memcpy_htod(
        &mut self,
        stream: StreamRef,
        dst: u64,
        src: &[HostRun],
        _wait_for_source: bool,
    ) -> CuResult<()> {
        self.check_stream(stream)?;
        let mut memory = lock(&self.memory);
        let device = span(&mut memory.blocks, dst, total(src))?;
        let mut at = 0;
        for run in src {
            let to = device
                .get_mut(at..at + run.len)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: the session handed out runs inside mapped guest memory.
            unsafe { std::ptr::copy_nonoverlapping(run.ptr, to.as_mut_ptr(), run.len) };
            at += run.len;
        }
        Ok(())
    }
    fn memcpy_dtoh(
        &mut self,
        stream: StreamRef,
        dst: &[HostRun],
        src: u64,
        _wait: bool,
    ) -> CuResult<()> {
        self.check_stream(stream)?;
        let mut memory = lock(&self.memory);
        let device = span(&mut memory.blocks, src, total(dst))?;
        let mut at = 0;
        for run in dst {
            let from = device
                .get(at..at + run.len)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: as in memcpy_htod.
            unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), run.ptr, run.len) };
            at += run.len;
        }
        Ok(())
    }
    fn memcpy_dtod(&mut self, stream: StreamRef, dst: u64, src: u64, size: u64) -> CuResult<()> {
        self.check_stream(stream)?;
        let mut memory = lock(&self.memory);
        let data = span(&mut memory.blocks, src, size)?.to_vec();
        span(&mut memory.blocks, dst, size)?.copy_from_slice(&data);
        Ok(())
    }
    fn memset(
        &mut self,
        stream: StreamRef,
        dst: u64,
        value: u32,
        element_size: u32,
        count: u64,
    ) -> CuResult<()> {
        self.check_stream(stream)?;
        let bytes = value.to_le_bytes();
        let width = element_size as usize;
        let mut memory = lock(&self.memory);
        let device = span(&mut memory.blocks, dst, count * u64::from(element_size))?;
        for chunk in device.chunks_mut(width) {
            chunk.copy_from_slice(&bytes[..width]);
        }
        Ok(())
    }
    fn module_load(&mut self, image: &[u8]) -> CuResult<u64> {
        if !image.starts_with(b"FAKEMODULE") {
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        let h = self.handle();
        self.modules.insert(h, ());
        Ok(h)
    }
    fn module_unload(&mut self, module: u64) -> CuResult<()> {
        self.modules
            .remove(&module)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
    fn module_get_function(&mut self, module: u64, name: &str) -> CuResult<(u64, FunctionInfo)> {
        if !self.modules.contains_key(&module) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if name != "rgpu_fill_index" {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        let h = self.handle();
        self.functions.insert(h, ());
        let slot = |offset, size| ParamSlot { offset, size };
        Ok((
            h,
            FunctionInfo {
                params: vec![slot(0, 8), slot(8, 4), slot(12, 4)],
            },
        ))
    }
    fn module_get_global(&mut self, _module: u64, _name: &str) -> CuResult<(u64, u64)> {
        Err(CUDA_ERROR_NOT_FOUND)
    }
    fn func_get_attribute(&mut self, function: u64, attribute: i32) -> CuResult<i32> {
        if !self.functions.contains_key(&function) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        Ok(attribute + 1000)
    }
    fn launch_kernel(
        &mut self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        _shared_mem_bytes: u32,
        stream: StreamRef,
        params: &[u8],
    ) -> CuResult<()> {
        self.check_stream(stream)?;
        if !self.functions.contains_key(&function) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let word = |at: usize, n: usize| -> u64 {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&params[at..at + n]);
            u64::from_le_bytes(b)
        };
        let (out, base, n) = (word(0, 8), word(8, 4) as u32, word(12, 4));
        let threads: u64 = grid.iter().chain(&block).map(|v| u64::from(*v)).product();
        let n = n.min(threads);
        let mut memory = lock(&self.memory);
        let device = span(&mut memory.blocks, out, n * 4)?;
        for (i, chunk) in device.chunks_mut(4).enumerate() {
            chunk.copy_from_slice(&(base + i as u32).to_le_bytes());
        }
        lock(&self.state).launches += 1;
        Ok(())
    }
    fn stream_create(&mut self, _flags: u32, _priority: i32) -> CuResult<u64> {
        let h = self.handle();
        self.streams.insert(h, ());
        Ok(h)
    }
    fn stream_destroy(&mut self, stream: u64) -> CuResult<()> {
        self.streams
            .remove(&stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
    fn stream_synchronize(&mut self, stream: StreamRef) -> CuResult<()> {
        self.check_stream(stream)
    }
    fn stream_query(&mut self, stream: StreamRef) -> CuResult<()> {
        self.check_stream(stream)
    }
    fn stream_wait_event(&mut self, stream: StreamRef, event: u64, _flags: u32) -> CuResult<()> {
        self.check_stream(stream)?;
        self.event_query(event)
    }
    fn event_create(&mut self, _flags: u32) -> CuResult<u64> {
        let h = self.handle();
        self.events.insert(h, 0.0);
        Ok(h)
    }
    fn event_destroy(&mut self, event: u64) -> CuResult<()> {
        self.events
            .remove(&event)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
    fn event_record(&mut self, event: u64, stream: StreamRef) -> CuResult<()> {
        self.check_stream(stream)?;
        let now = self.next_handle as f32;
        let slot = self
            .events
            .get_mut(&event)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        *slot = now;
        Ok(())
    }
    fn event_synchronize(&mut self, event: u64) -> CuResult<()> {
        self.event_query(event)
    }
    fn event_query(&mut self, event: u64) -> CuResult<()> {
        self.events
            .get(&event)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
    fn event_elapsed_time(&mut self, start: u64, end: u64) -> CuResult<f32> {
        let a = self.events.get(&start).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let b = self.events.get(&end).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(b - a)
    }
    fn ipc_get_mem_handle(&mut self, device_ptr: u64) -> CuResult<IpcHandle> {
        let memory = lock(&self.memory);
        let (base, _) = memory
            .blocks
            .range(..=device_ptr)
            .next_back()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok(fake_handle(FAKE_IPC_MEM, *base))
    }
    fn ipc_open_mem_handle(&mut self, handle: &IpcHandle, _flags: u32) -> CuResult<(u64, u64)> {
        let ptr = fake_object(FAKE_IPC_MEM, handle)?;
        let size = lock(&self.memory)
            .blocks
            .get(&ptr)
            .map(|b| b.len() as u64)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        *self.ipc_opens.entry(ptr).or_insert(0) += 1;
        lock(&self.state).ipc_opens += 1;
        Ok((ptr, size))
    }
    fn ipc_close_mem_handle(&mut self, device_ptr: u64) -> CuResult<()> {
        let opens = self
            .ipc_opens
            .get_mut(&device_ptr)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        *opens -= 1;
        if *opens == 0 {
            self.ipc_opens.remove(&device_ptr);
        }
        lock(&self.state).ipc_opens -= 1;
        Ok(())
    }
    fn ipc_get_event_handle(&mut self, event: u64) -> CuResult<IpcHandle> {
        self.event_query(event)?;
        Ok(fake_handle(FAKE_IPC_EVENT, event))
    }
    fn ipc_open_event_handle(&mut self, handle: &IpcHandle) -> CuResult<u64> {
        fake_object(FAKE_IPC_EVENT, handle)?;
        self.event_create(0)
    }
}
