//! Process-wide state: the carrier opened by `cuInit`, the contexts (one
//! [`Channel`] each), the per-thread context stack, and the registries that
//! turn the opaque pointers handed to the application back into objects.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rgpu_proto::capset::DeviceInfo;
use rgpu_proto::channel::CompletionKind;
use rgpu_proto::cuda_result::*;
use rgpu_proto::reply::FunctionInfo;
use rgpu_proto::Command;
use rgpu_transport::process_tag::process_name;
use rgpu_transport::{Carrier, CarrierError, Completion, ContextChannel, Reply};

use crate::abi::{CUdevice, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};

/// What `cuInit` set up.
pub(crate) struct Driver {
    /// The carriers: `RGPU_DEVICES`' entries in order, or the one the
    /// environment selects. A carrier's index is also the address space of
    /// its devices' memory (see [`crate::device_ranges`]): each daemon hands
    /// out device pointers of its own, which may coincide with another's.
    pub carriers: Vec<Arc<dyn Carrier>>,
    /// The CUDA devices, by ordinal.
    pub devices: Vec<Device>,
}

/// One CUDA device: a device that a carrier's daemon offers.
pub(crate) struct Device {
    /// Its carrier's index in [`Driver::carriers`].
    pub carrier: usize,
    /// As the carrier's capset describes it.
    pub info: DeviceInfo,
    pub primary: Mutex<Primary>,
}

/// A device's primary context: created at the first retain, closed when
/// released to zero or reset.
#[derive(Default)]
pub(crate) struct Primary {
    pub context: Option<Arc<Context>>,
    /// The primary context closed by a release to zero or a reset: the next
    /// retain reopens this same object, so the `CUcontext` handle stays the
    /// same for the device, as with NVIDIA's driver (runtimes keep it).
    pub dormant: Option<Arc<Context>>,
    pub refcount: u32,
    pub flags: u32,
}

static DRIVER: OnceLock<Result<Driver, u32>> = OnceLock::new();

/// Opens the driver once; later calls return the first outcome.
pub(crate) fn init_driver(
    open: impl FnOnce() -> Result<Driver, u32>,
) -> Result<&'static Driver, u32> {
    DRIVER.get_or_init(open).as_ref().map_err(|e| *e)
}

/// The driver, or `CUDA_ERROR_NOT_INITIALIZED` before a successful `cuInit`.
pub(crate) fn driver() -> Result<&'static Driver, u32> {
    match DRIVER.get() {
        Some(Ok(driver)) => Ok(driver),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

impl Driver {
    /// The devices the carriers offer. One carrier offers all of its
    /// devices, as it always did; with several (`RGPU_DEVICES`), each
    /// contributes its first: the host runs every session of a connection
    /// on its daemon's first device, so a later one could not be reached.
    /// `Err` names the carrier that offers none.
    pub fn new(carriers: Vec<Arc<dyn Carrier>>) -> Result<Self, usize> {
        let several = carriers.len() > 1;
        let mut devices = Vec::new();
        for (index, carrier) in carriers.iter().enumerate() {
            let offered = &carrier.capset().devices;
            if offered.is_empty() {
                return Err(index);
            }
            let taken = if several { 1 } else { offered.len() };
            if offered.len() > taken {
                log::info!(
                    "rgpu: RGPU_DEVICES entry {index} offers {} devices; using its first",
                    offered.len()
                );
            }
            devices.extend(offered.iter().take(taken).map(|info| Device {
                carrier: index,
                info: info.clone(),
                primary: Mutex::new(Primary::default()),
            }));
        }
        Ok(Self { carriers, devices })
    }

    /// `cuDriverGetVersion`: the oldest of the daemons' drivers, which every
    /// device supports.
    pub fn driver_version(&self) -> i32 {
        self.carriers
            .iter()
            .map(|c| c.capset().driver_version)
            .min()
            .unwrap_or(0)
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn slot(&self, device: CUdevice) -> Result<&Device, u32> {
        usize::try_from(device)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    pub fn device(&self, device: CUdevice) -> Result<&DeviceInfo, u32> {
        self.slot(device).map(|d| &d.info)
    }

    pub fn primary(&self, device: CUdevice) -> Result<&Mutex<Primary>, u32> {
        self.slot(device).map(|d| &d.primary)
    }

    /// The index of `device`'s carrier: its address space.
    pub fn space_of(&self, device: CUdevice) -> Result<usize, u32> {
        self.slot(device).map(|d| d.carrier)
    }

    /// The carrier of address space `space`.
    pub fn carrier(&self, space: usize) -> Result<&Arc<dyn Carrier>, u32> {
        self.carriers.get(space).ok_or(CUDA_ERROR_INVALID_DEVICE)
    }
}

pub(crate) use crate::transport_error::carrier_error;

/// Process-wide unique ids, never reused: context ids (`cuCtxGetId`),
/// stream ids (`cuStreamGetId`) and buffer ids of allocations
/// (`CU_POINTER_ATTRIBUTE_BUFFER_ID`). Ids 1 and 2 are the default streams'.
static NEXT_ID: AtomicU64 = AtomicU64::new(3);

pub(crate) fn new_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// `cuStreamGetId` of the legacy and the per-thread default stream.
pub(crate) const LEGACY_STREAM_ID: u64 = 1;
pub(crate) const PER_THREAD_STREAM_ID: u64 = 2;

/// A device allocation (`cuMemAlloc`), or memory of another process
/// opened through CUDA IPC, as pointer queries report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceAllocation {
    pub size: u64,
    pub buffer_id: u64,
    /// 0: this context's own allocation. Else memory another process
    /// exported, opened this many times (`cuIpcOpenMemHandle`; the last
    /// `cuIpcCloseMemHandle` forgets it, `cuMemFree` refuses it).
    pub ipc_opens: u32,
}

/// A CUDA context: one channel to one host session.
pub(crate) struct Context {
    pub device: CUdevice,
    /// The carrier its device is on ([`Driver::space_of`]): where its
    /// channel goes and which address space its device pointers are in.
    pub space: usize,
    pub flags: AtomicU32,
    pub primary: bool,
    /// `cuCtxGetId`.
    pub id: u64,
    /// `cuCtxSetCacheConfig` (a hint for the host driver; kept here).
    pub cache_config: AtomicI32,
    /// This context's device allocations (and the memory of other
    /// processes it opened) by base address: pointer attributes and
    /// address ranges are answered from here.
    pub allocations: Mutex<BTreeMap<u64, DeviceAllocation>>,
    alive: AtomicBool,
    /// The sticky error this context hit (CUDA_SUCCESS while none).
    sticky_error: AtomicU32,
    /// A reset primary context: closed, but its handle stays valid and the
    /// next call through it opens a new host session.
    reopen_on_use: AtomicBool,
    channel: RwLock<Option<ContextChannel>>,
    /// The virtio-gpu context of the current channel (a reopened primary
    /// context gets a new one).
    ctx_id: AtomicU32,
    next_handle: AtomicU32,
}

impl Context {
    /// Opens a channel (a new host session) for `device`.
    pub fn open(
        driver: &Driver,
        device: CUdevice,
        flags: u32,
        primary: bool,
    ) -> Result<Arc<Self>, u32> {
        let space = driver.space_of(device)?;
        let channel = ContextChannel::open(driver.carrier(space)?.clone(), &process_name())
            .map_err(carrier_error)?;
        Ok(Arc::new(Self {
            device,
            space,
            flags: AtomicU32::new(flags),
            primary,
            id: new_id(),
            cache_config: AtomicI32::new(0),
            allocations: Mutex::new(BTreeMap::new()),
            alive: AtomicBool::new(true),
            sticky_error: AtomicU32::new(CUDA_SUCCESS),
            reopen_on_use: AtomicBool::new(false),
            ctx_id: AtomicU32::new(channel.ctx_id()),
            channel: RwLock::new(Some(channel)),
            next_handle: AtomicU32::new(1),
        }))
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// The allocation holding `ptr`: `(base, allocation)`.
    pub fn allocation_at(&self, ptr: u64) -> Option<(u64, DeviceAllocation)> {
        let map = self.allocations.lock().ok()?;
        let (base, allocation) = map.range(..=ptr).next_back()?;
        (ptr - base < allocation.size).then_some((*base, *allocation))
    }

    /// Whether its carrier is the network's, which shares no memory with
    /// the host: host memory reaches it only as copies made now.
    pub fn over_network(&self) -> bool {
        driver()
            .and_then(|d| d.carrier(self.space))
            .is_ok_and(|c| c.remote().is_some())
    }

    /// The virtio-gpu context id of this context's channel.
    pub fn ctx_id(&self) -> u32 {
        self.ctx_id.load(Ordering::Acquire)
    }

    /// Closes the context's host session but keeps the context usable: the
    /// next call opens a new, empty session (`cuDevicePrimaryCtxReset`).
    pub fn reset(&self) {
        self.close();
        self.alive.store(true, Ordering::Release);
        self.reopen_on_use.store(true, Ordering::Release);
    }

    /// Gives a closed context a new channel (a new host session, empty): a
    /// primary context retained again after a release to zero or a reset.
    pub fn reopen(&self, driver: &Driver) -> Result<(), u32> {
        let channel = ContextChannel::open(driver.carrier(self.space)?.clone(), &process_name())
            .map_err(carrier_error)?;
        let mut guard = self.channel.write().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        self.ctx_id.store(channel.ctx_id(), Ordering::Release);
        *guard = Some(channel);
        if let Ok(mut allocations) = self.allocations.lock() {
            allocations.clear();
        }
        crate::device_ranges::forget_context(self.id);
        self.sticky_error.store(CUDA_SUCCESS, Ordering::Relaxed);
        self.alive.store(true, Ordering::Release);
        Ok(())
    }

    /// A fresh guest-chosen handle (non-zero, never the per-thread stream).
    pub fn new_handle(&self) -> Result<u32, u32> {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        if handle == 0 || handle == rgpu_proto::STREAM_PER_THREAD {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(handle)
    }

    /// `count` consecutive handles (a graph clone's nodes): the first.
    pub fn new_handles(&self, count: u32) -> Result<u32, u32> {
        if count == 0 {
            return Ok(0);
        }
        let first = self.next_handle.fetch_add(count, Ordering::Relaxed);
        let last = first
            .checked_add(count - 1)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if first == 0 || last == rgpu_proto::STREAM_PER_THREAD {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(first)
    }

    pub fn with_channel<R>(
        &self,
        f: impl FnOnce(&ContextChannel) -> Result<R, CarrierError>,
    ) -> Result<R, u32> {
        // A context that hit a sticky error is unusable, as with NVIDIA's
        // driver: every later call returns that error.
        match self.sticky_error.load(Ordering::Relaxed) {
            CUDA_SUCCESS => {}
            code => return Err(code),
        }
        let guard = self.channel.read().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        if guard.is_none() && self.reopen_on_use.swap(false, Ordering::AcqRel) {
            // A reset primary context comes back on its first use.
            drop(guard);
            self.reopen(driver()?)?;
            return self.with_channel(f);
        }
        let channel = guard.as_ref().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        f(channel).map_err(carrier_error)
    }

    /// Whether event or stream `handle` is complete, from the host's
    /// completion table; asks the host (through the ring, behind what is
    /// queued) only when the table cannot tell. Never waits otherwise.
    pub fn query(&self, kind: CompletionKind, handle: u32) -> Result<(), u32> {
        match self.with_channel(|c| Ok(c.completion(kind, handle)))? {
            Completion::Done => Ok(()),
            Completion::Pending => Err(CUDA_ERROR_NOT_READY),
            Completion::Ask => {
                let command = match kind {
                    CompletionKind::Event => Command::EventQuery { event: handle },
                    CompletionKind::Stream => Command::StreamQuery { stream: handle },
                };
                self.call(&command).map(|_| ())
            }
        }
    }

    /// Queues a command without waiting (errors surface later).
    pub fn send(&self, command: &Command) -> Result<(), u32> {
        self.with_channel(|c| c.send(command))
    }

    /// Sends a command and waits; a non-zero result is the error.
    pub fn call(&self, command: &Command) -> Result<Vec<u8>, u32> {
        let Reply { result, payload } = self.with_channel(|c| c.call(command))?;
        if result == CUDA_SUCCESS {
            Ok(payload)
        } else {
            if is_sticky(result) {
                self.sticky_error.store(result, Ordering::Relaxed);
            }
            Err(result)
        }
    }

    /// Sends a command and waits, if the context has a host session now:
    /// `None` when it has none. Neither reopens a reset context nor heeds
    /// the sticky error: for queries about the device (NVML's
    /// `DeviceStatus`), which must not start a session and still work after
    /// a kernel fault.
    pub fn call_if_open(&self, command: &Command) -> Result<Option<Reply>, u32> {
        let guard = self.channel.read().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        guard
            .as_ref()
            .map(|channel| channel.call(command))
            .transpose()
            .map_err(carrier_error)
    }

    /// Closes the channel: the host frees the session's resources.
    pub fn close(&self) {
        self.alive.store(false, Ordering::Release);
        let channel = match self.channel.write() {
            Ok(mut guard) => guard.take(),
            Err(_) => None,
        };
        if let Some(channel) = channel {
            if let Err(e) = channel.close() {
                log::warn!("rgpu: closing a context's channel: {e}");
            }
        }
        STREAMS.retain(|s| s.context.is_alive());
        EVENTS.retain(|e| e.context.is_alive());
        MODULES.retain(|m| m.context.is_alive());
        FUNCTIONS.retain(|f| f.context.is_alive());
        // The host freed the session's memory and modules with it.
        crate::device_ranges::forget_context(self.id);
        crate::pinned::forget_context(self.space, self.ctx_id());
    }
}

/// Objects handed to the application as opaque pointers: the pointer is the
/// object's address, and only registered pointers are accepted back.
pub(crate) struct Registry<T> {
    map: RwLock<BTreeMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    pub const fn new() -> Self {
        Self {
            map: RwLock::new(BTreeMap::new()),
        }
    }

    pub fn insert(&self, object: Arc<T>) -> *mut c_void {
        let key = Arc::as_ptr(&object) as usize;
        if let Ok(mut map) = self.map.write() {
            map.insert(key, object);
        }
        key as *mut c_void
    }

    pub fn get(&self, handle: *mut c_void) -> Option<Arc<T>> {
        self.map.read().ok()?.get(&(handle as usize)).cloned()
    }

    pub fn remove(&self, handle: *mut c_void) -> Option<Arc<T>> {
        self.map.write().ok()?.remove(&(handle as usize))
    }

    /// Every registered object.
    pub fn values(&self) -> Vec<Arc<T>> {
        self.map
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn retain(&self, keep: impl Fn(&T) -> bool) {
        if let Ok(mut map) = self.map.write() {
            map.retain(|_, v| keep(v));
        }
    }
}

pub(crate) static CONTEXTS: Registry<Context> = Registry::new();
pub(crate) static STREAMS: Registry<Stream> = Registry::new();
pub(crate) static EVENTS: Registry<Event> = Registry::new();
pub(crate) static MODULES: Registry<Module> = Registry::new();
pub(crate) static FUNCTIONS: Registry<Function> = Registry::new();

pub(crate) struct Stream {
    pub context: Arc<Context>,
    pub handle: u32,
    pub flags: u32,
    pub priority: i32,
    /// `cuStreamGetId`.
    pub id: u64,
}

pub(crate) struct Event {
    pub context: Arc<Context>,
    pub handle: u32,
    /// Opened from another process's IPC handle: that process records it,
    /// so only the host knows whether it completed.
    pub ipc: bool,
}

pub(crate) struct Module {
    pub context: Arc<Context>,
    /// The host session it was loaded in (a reset context gets a new one,
    /// where this module does not exist).
    pub session: u32,
    pub handle: u32,
    /// Functions already looked up, by name: `cuModuleGetFunction` asks the
    /// host once per name.
    pub functions: Mutex<HashMap<Vec<u8>, usize>>,
}

pub(crate) struct Function {
    pub context: Arc<Context>,
    /// The host session it was looked up in (see `Module::session`).
    pub session: u32,
    pub module: u32,
    pub handle: u32,
    /// For `cuFuncGetName` / `cuKernelGetName`, which hand out a pointer.
    pub name: std::ffi::CString,
    pub info: FunctionInfo,
    /// `cuFuncGetAttribute` answers; a `cuFuncSetAttribute` changes the
    /// one it sets ([`Function::attribute_set`]).
    pub attributes: Mutex<HashMap<i32, i32>>,
    /// Occupancy answers, cached likewise.
    pub occupancy: Mutex<HashMap<OccupancyQuery, i64>>,
}

/// An occupancy question about a function, by its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum OccupancyQuery {
    /// Blocks per multiprocessor: block size, dynamic shared memory, flags.
    MaxActiveBlocks(i32, u64, u32),
    /// Dynamic shared memory per block: blocks, block size.
    AvailableDynamicSmem(i32, i32),
    /// Clusters: grid, block, shared memory, cluster shape.
    MaxActiveClusters([u32; 3], [u32; 3], u32, [u32; 3]),
    /// The largest cluster: grid, block, shared memory.
    MaxPotentialClusterSize([u32; 3], [u32; 3], u32),
}

impl Function {
    /// A `cuFuncSetAttribute` of `attribute` went to the host: it reads
    /// back as `value` where that is known to be what the driver reports,
    /// else it is asked again. The other attributes stay cached, as a set
    /// changes none of them (PyTorch sets a kernel's dynamic shared memory
    /// before launches, every training step, and then asks for all of its
    /// attributes: forgetting them all cost about 60 round trips a step).
    /// Occupancy answers depend on the shared-memory settings: forgotten.
    pub fn attribute_set(&self, attribute: i32, value: Option<i32>) {
        if let Ok(mut a) = self.attributes.lock() {
            match value {
                Some(value) => a.insert(attribute, value),
                None => a.remove(&attribute),
            };
        }
        if let Ok(mut o) = self.occupancy.lock() {
            o.clear();
        }
    }
}

thread_local! {
    /// This thread's context stack; the top is the current context.
    static STACK: RefCell<Vec<Arc<Context>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current context.
pub(crate) fn current() -> Result<Arc<Context>, u32> {
    driver()?;
    current_or_none()?.ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// The current context, or `None` when the stack is empty.
pub(crate) fn current_or_none() -> Result<Option<Arc<Context>>, u32> {
    match STACK.with(|s| s.borrow().last().cloned()) {
        Some(ctx) if !ctx.is_alive() => Err(CUDA_ERROR_INVALID_CONTEXT),
        other => Ok(other),
    }
}

pub(crate) fn push_current(ctx: Arc<Context>) {
    STACK.with(|s| s.borrow_mut().push(ctx));
}

pub(crate) fn pop_current() -> Option<Arc<Context>> {
    STACK.with(|s| s.borrow_mut().pop())
}

/// `cuCtxSetCurrent`: replaces the top of the stack (NULL pops it).
pub(crate) fn set_current(ctx: Option<Arc<Context>>) {
    STACK.with(|s| {
        let mut stack = s.borrow_mut();
        stack.pop();
        if let Some(ctx) = ctx {
            stack.push(ctx);
        }
    });
}

/// The live context with `cuCtxGetId` `id`.
pub(crate) fn context_by_id(id: u64) -> Option<Arc<Context>> {
    CONTEXTS
        .values()
        .into_iter()
        .find(|c| c.id == id && c.is_alive())
}

/// Drops a destroyed context from this thread's stack.
pub(crate) fn forget_current(ctx: &Arc<Context>) {
    STACK.with(|s| s.borrow_mut().retain(|c| !Arc::ptr_eq(c, ctx)));
}

/// Looks up a context argument; NULL means the current context.
pub(crate) fn context_or_current(handle: *mut c_void) -> Result<Arc<Context>, u32> {
    if handle.is_null() {
        return current();
    }
    driver()?;
    CONTEXTS
        .get(handle)
        .filter(|c| c.is_alive())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// The context and host handle a `CUstream` argument names. NULL is the
/// legacy stream, or the per-thread stream for the `_ptsz`/`_ptds` forms.
pub(crate) fn resolve_stream(
    stream: *mut c_void,
    per_thread: bool,
) -> Result<(Arc<Context>, u32), u32> {
    let default = match stream as usize {
        0 if per_thread => Some(rgpu_proto::STREAM_PER_THREAD),
        0 | CU_STREAM_LEGACY => Some(rgpu_proto::STREAM_LEGACY),
        CU_STREAM_PER_THREAD => Some(rgpu_proto::STREAM_PER_THREAD),
        _ => None,
    };
    if let Some(handle) = default {
        return Ok((current()?, handle));
    }
    driver()?;
    let s = STREAMS.get(stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok((s.context.clone(), s.handle))
}

/// The stream a synchronous copy or memset runs on.
pub(crate) fn sync_stream(per_thread: bool) -> u32 {
    if per_thread {
        rgpu_proto::STREAM_PER_THREAD
    } else {
        rgpu_proto::STREAM_LEGACY
    }
}

/// Errors after which NVIDIA's driver considers a context corrupt: a kernel
/// faulted (illegal or misaligned address, illegal instruction, stack
/// error, invalid PC, timeout, unspecified launch failure).
fn is_sticky(code: u32) -> bool {
    matches!(code, 700 | 702 | 714..=719)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgpu_proto::capset::Capset;
    use rgpu_transport::{BlobMapping, FenceToken};

    /// A carrier that only has a capset.
    struct Offering(Capset);

    impl Carrier for Offering {
        fn capset(&self) -> &Capset {
            &self.0
        }
        fn create_context(&self, _: &str) -> Result<u32, CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
        fn destroy_context(&self, _: u32) -> Result<(), CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
        fn create_blob(&self, _: u32, _: u64) -> Result<BlobMapping, CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
        fn attach_blob(&self, _: u32, _: u32) -> Result<(), CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
        fn destroy_blob(&self, _: u32, _: u32) -> Result<(), CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
        fn submit(&self, _: u32, _: &[u8], _: bool) -> Result<Option<FenceToken>, CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
        fn wait_fence(&self, _: u32, _: FenceToken) -> Result<(), CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
        fn raw_control(&self, _: &[u8], _: usize) -> Result<Vec<u8>, CarrierError> {
            Err(CarrierError::Unsupported("test"))
        }
    }

    /// A carrier offering devices named `names`, with driver `version`.
    fn offering(version: i32, names: &[&str]) -> Arc<dyn Carrier> {
        let devices = names
            .iter()
            .map(|name| DeviceInfo {
                name: (*name).to_owned(),
                uuid: [0; 16],
                total_mem: 1 << 30,
                host_ordinal: 0,
                attributes: Vec::new(),
            })
            .collect();
        Arc::new(Offering(Capset {
            protocol_version: rgpu_proto::PROTOCOL_VERSION,
            driver_version: version,
            executor: "sim".into(),
            devices,
        }))
    }

    fn names(driver: &Driver) -> Vec<(String, usize)> {
        driver
            .devices
            .iter()
            .map(|d| (d.info.name.clone(), d.carrier))
            .collect()
    }

    #[test]
    fn one_carrier_offers_all_its_devices() {
        let driver = Driver::new(vec![offering(13000, &["a", "b"])]).unwrap();
        assert_eq!(names(&driver), [("a".into(), 0), ("b".into(), 0)]);
        assert_eq!(driver.space_of(1), Ok(0));
        assert_eq!(driver.device(2).err(), Some(CUDA_ERROR_INVALID_DEVICE));
    }

    #[test]
    fn several_carriers_offer_their_first_device_each_in_order() {
        let driver = Driver::new(vec![
            offering(13000, &["a", "a2"]),
            offering(12080, &["b"]),
            offering(13010, &["c"]),
        ])
        .unwrap();
        assert_eq!(
            names(&driver),
            [("a".into(), 0), ("b".into(), 1), ("c".into(), 2)]
        );
        assert_eq!(driver.device_count(), 3);
        assert_eq!(driver.space_of(2), Ok(2));
        assert_eq!(driver.space_of(-1), Err(CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(driver.driver_version(), 12080, "the oldest driver");
        assert!(driver.carrier(2).is_ok());
        assert!(driver.carrier(3).is_err());
    }

    #[test]
    fn a_carrier_without_devices_is_named() {
        let result = Driver::new(vec![offering(13000, &["a"]), offering(13000, &[])]);
        assert_eq!(result.err(), Some(1));
    }
}
