//! Commands from the guest to the host.
//!
//! A command is a 16-byte [`CommandHeader`] followed by its body. Commands are
//! laid out 8-byte aligned one after another, in a `SUBMIT_3D` payload or in
//! the shared command ring of a channel ([`crate::channel`]).
//!
//! Handles of streams, events, modules and functions are chosen by the guest
//! (so creating them needs no reply); the host keeps a per-session table and
//! rejects unknown ones. Device pointers are real addresses in the session's
//! own device context. Data is named by a [`BlobRange`], never by pointer.

use crate::wire::{DecodeError, WireReader, WireWriter};
use crate::{MAX_KERNEL_PARAMS_BYTES, MAX_NAME_BYTES};

/// Size of [`CommandHeader`] on the wire.
pub const COMMAND_HEADER_SIZE: usize = 16;
/// Commands start at multiples of this.
pub const COMMAND_ALIGN: usize = 8;
/// Largest command body accepted, Padding excepted (a kernel's parameters
/// plus its header fields fit well inside).
pub const MAX_COMMAND_BODY: usize = 64 * 1024;

/// The header in front of every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandHeader {
    pub opcode: u16,
    /// Reserved, zero.
    pub flags: u16,
    /// Length of the body that follows, without padding.
    pub body_len: u32,
    /// Non-zero: the guest waits for a reply carrying this number, written
    /// after the command completed. Zero: no reply; a failure is remembered
    /// and returned by the next command that asks for a reply.
    pub reply_seq: u64,
}

impl CommandHeader {
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = WireReader::new(bytes);
        let header = Self {
            opcode: r.u16()?,
            flags: r.u16()?,
            body_len: r.u32()?,
            reply_seq: r.u64()?,
        };
        // A Padding body is never copied or decoded (it fills the ring's tail
        // or carries inline data for the next command), so it may be as long
        // as a ring.
        let limit = if header.opcode == Opcode::Padding as u16 {
            crate::channel::MAX_RING_SIZE
        } else {
            MAX_COMMAND_BODY as u64
        };
        if u64::from(header.body_len) > limit {
            return Err(DecodeError::LengthOutOfRange {
                length: header.body_len.into(),
                limit,
            });
        }
        Ok(header)
    }

    pub fn encode(&self, w: &mut WireWriter) {
        w.u16(self.opcode)
            .u16(self.flags)
            .u32(self.body_len)
            .u64(self.reply_seq);
    }

    /// Header plus body, rounded up to [`COMMAND_ALIGN`].
    pub fn padded_len(&self) -> usize {
        padded(COMMAND_HEADER_SIZE + self.body_len as usize)
    }
}

/// Rounds a length up to [`COMMAND_ALIGN`].
pub const fn padded(len: usize) -> usize {
    (len + COMMAND_ALIGN - 1) & !(COMMAND_ALIGN - 1)
}

/// Bytes inside one blob resource: `(resource id, offset, length)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlobRange {
    pub resource_id: u32,
    pub offset: u64,
    pub length: u64,
}

impl BlobRange {
    pub const WIRE_SIZE: usize = 24;

    fn decode(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let resource_id = r.u32()?;
        let reserved = r.u32()?;
        if reserved != 0 {
            return Err(DecodeError::InvalidField {
                field: "blob_range.reserved",
                value: reserved.into(),
            });
        }
        Ok(Self {
            resource_id,
            offset: r.u64()?,
            length: r.u64()?,
        })
    }

    fn encode(&self, w: &mut WireWriter) {
        w.u32(self.resource_id)
            .u32(0)
            .u64(self.offset)
            .u64(self.length);
    }

    /// `offset + length`, or `None` when it overflows.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.length)
    }
}

/// Where the parts of a channel live inside its blob (all offsets in bytes
/// from the start of the blob).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelLayout {
    pub resource_id: u32,
    pub header_offset: u64,
    pub ring_offset: u64,
    pub ring_size: u64,
    pub reply_offset: u64,
    pub reply_size: u64,
    pub bounce_offset: u64,
    pub bounce_size: u64,
}

/// What `cuOccupancyMaxActiveClusters` asks about: a launch's geometry and
/// its cluster shape (all zero: none given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterQuery {
    pub function: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub cluster: [u32; 3],
}

/// Kernel launch geometry and parameters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Launch {
    pub function: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: u32,
    /// The parameter buffer laid out as the host's function reply described
    /// (offsets and sizes), passed to the driver as one buffer.
    pub params: Vec<u8>,
}

macro_rules! opcodes {
    ($($name:ident = $value:expr,)*) => {
        /// Command numbers on the wire.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Opcode { $($name = $value,)* }

        impl Opcode {
            pub fn from_u16(value: u16) -> Option<Self> {
                match value {
                    $($value => Some(Self::$name),)*
                    _ => None,
                }
            }
        }
    };
}

opcodes! {
    Padding = 0x0000,
    BindChannel = 0x0001,
    Doorbell = 0x0002,
    CtxSynchronize = 0x0100,
    CtxGetLimit = 0x0101,
    CtxSetLimit = 0x0102,
    MemAlloc = 0x0200,
    MemFree = 0x0201,
    MemGetInfo = 0x0202,
    MemcpyHtoD = 0x0203,
    MemcpyDtoH = 0x0204,
    MemcpyDtoD = 0x0205,
    Memset = 0x0206,
    ModuleLoad = 0x0300,
    ModuleUnload = 0x0301,
    ModuleGetFunction = 0x0302,
    ModuleGetGlobal = 0x0303,
    FuncGetAttribute = 0x0304,
    LaunchKernel = 0x0305,
    ModuleLoadCached = 0x0306,
    ModuleLoadHashed = 0x0307,
    FuncSetAttribute = 0x0308,
    OccupancyMaxActiveBlocks = 0x0309,
    OccupancyAvailableDynamicSmem = 0x030a,
    OccupancyMaxActiveClusters = 0x030b,
    StreamCreate = 0x0400,
    StreamDestroy = 0x0401,
    StreamSynchronize = 0x0402,
    StreamQuery = 0x0403,
    StreamWaitEvent = 0x0404,
    EventCreate = 0x0500,
    EventDestroy = 0x0501,
    EventRecord = 0x0502,
    EventSynchronize = 0x0503,
    EventQuery = 0x0504,
    EventElapsedTime = 0x0505,
    DeviceStatus = 0x0600,
}

/// One decoded command body. Which ones answer with data is documented on
/// [`crate::reply`].
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Ring filler up to the ring's end; its body is ignored.
    Padding,
    /// Attach a command ring and reply area to the session (SUBMIT_3D only).
    BindChannel(ChannelLayout),
    /// The ring holds commands up to byte `until`; the fence of the SUBMIT_3D
    /// that carries this, if any, signals once the host has executed them.
    Doorbell {
        until: u64,
    },
    CtxSynchronize,
    CtxGetLimit {
        limit: u32,
    },
    CtxSetLimit {
        limit: u32,
        value: u64,
    },
    MemAlloc {
        size: u64,
    },
    MemFree {
        device_ptr: u64,
    },
    MemGetInfo,
    MemcpyHtoD {
        stream: u32,
        dst: u64,
        src: BlobRange,
    },
    MemcpyDtoH {
        stream: u32,
        dst: BlobRange,
        src: u64,
    },
    MemcpyDtoD {
        stream: u32,
        dst: u64,
        src: u64,
        size: u64,
    },
    /// `count` elements of `element_size` (1, 2 or 4) bytes set to `value`.
    Memset {
        stream: u32,
        dst: u64,
        value: u32,
        element_size: u32,
        count: u64,
    },
    ModuleLoad {
        module: u32,
        image: BlobRange,
    },
    ModuleUnload {
        module: u32,
    },
    /// Loads the image the daemon has cached under this SHA-256 (an earlier
    /// load by any guest); answers `CUDA_ERROR_NOT_FOUND` when it has none,
    /// and the guest then sends the image with `ModuleLoadHashed`.
    ModuleLoadCached {
        module: u32,
        hash: [u8; 32],
    },
    /// `ModuleLoad` of an image whose SHA-256 the guest computed: the host
    /// refuses it (`CUDA_ERROR_INVALID_VALUE`) unless its own hash agrees.
    ModuleLoadHashed {
        module: u32,
        hash: [u8; 32],
        image: BlobRange,
    },
    ModuleGetFunction {
        module: u32,
        function: u32,
        name: Vec<u8>,
    },
    ModuleGetGlobal {
        module: u32,
        name: Vec<u8>,
    },
    FuncGetAttribute {
        function: u32,
        attribute: i32,
    },
    LaunchKernel(Launch),
    /// `cuFuncSetAttribute`; sent without a reply (the guest checks what it
    /// can first), so a failure surfaces at the next synchronising call.
    FuncSetAttribute {
        function: u32,
        attribute: i32,
        value: i32,
    },
    OccupancyMaxActiveBlocks {
        function: u32,
        block_size: i32,
        flags: u32,
        dynamic_smem_bytes: u64,
    },
    OccupancyAvailableDynamicSmem {
        function: u32,
        num_blocks: i32,
        block_size: i32,
    },
    OccupancyMaxActiveClusters(ClusterQuery),
    StreamCreate {
        stream: u32,
        flags: u32,
        priority: i32,
    },
    StreamDestroy {
        stream: u32,
    },
    StreamSynchronize {
        stream: u32,
    },
    StreamQuery {
        stream: u32,
    },
    StreamWaitEvent {
        stream: u32,
        event: u32,
        flags: u32,
    },
    EventCreate {
        event: u32,
        flags: u32,
    },
    EventDestroy {
        event: u32,
    },
    EventRecord {
        event: u32,
        stream: u32,
    },
    EventSynchronize {
        event: u32,
    },
    EventQuery {
        event: u32,
    },
    EventElapsedTime {
        start: u32,
        end: u32,
    },
    /// Live state of guest device `device` (NVML): answered without the
    /// session's device context, so it never creates one.
    DeviceStatus {
        device: u32,
    },
}

fn name(r: &mut WireReader<'_>) -> Result<Vec<u8>, DecodeError> {
    let bytes = r.bytes_with_len(MAX_NAME_BYTES)?;
    if bytes.contains(&0) {
        return Err(DecodeError::InvalidField {
            field: "name",
            value: 0,
        });
    }
    Ok(bytes.to_vec())
}

/// A SHA-256 digest.
fn hash(r: &mut WireReader<'_>) -> Result<[u8; 32], DecodeError> {
    let mut out = [0u8; 32];
    out.copy_from_slice(r.take(32)?);
    Ok(out)
}

impl Command {
    pub fn opcode(&self) -> Opcode {
        match self {
            Command::Padding => Opcode::Padding,
            Command::BindChannel(_) => Opcode::BindChannel,
            Command::Doorbell { .. } => Opcode::Doorbell,
            Command::CtxSynchronize => Opcode::CtxSynchronize,
            Command::CtxGetLimit { .. } => Opcode::CtxGetLimit,
            Command::CtxSetLimit { .. } => Opcode::CtxSetLimit,
            Command::MemAlloc { .. } => Opcode::MemAlloc,
            Command::MemFree { .. } => Opcode::MemFree,
            Command::MemGetInfo => Opcode::MemGetInfo,
            Command::MemcpyHtoD { .. } => Opcode::MemcpyHtoD,
            Command::MemcpyDtoH { .. } => Opcode::MemcpyDtoH,
            Command::MemcpyDtoD { .. } => Opcode::MemcpyDtoD,
            Command::Memset { .. } => Opcode::Memset,
            Command::ModuleLoad { .. } => Opcode::ModuleLoad,
            Command::ModuleUnload { .. } => Opcode::ModuleUnload,
            Command::ModuleLoadCached { .. } => Opcode::ModuleLoadCached,
            Command::ModuleLoadHashed { .. } => Opcode::ModuleLoadHashed,
            Command::ModuleGetFunction { .. } => Opcode::ModuleGetFunction,
            Command::ModuleGetGlobal { .. } => Opcode::ModuleGetGlobal,
            Command::FuncGetAttribute { .. } => Opcode::FuncGetAttribute,
            Command::LaunchKernel(_) => Opcode::LaunchKernel,
            Command::FuncSetAttribute { .. } => Opcode::FuncSetAttribute,
            Command::OccupancyMaxActiveBlocks { .. } => Opcode::OccupancyMaxActiveBlocks,
            Command::OccupancyAvailableDynamicSmem { .. } => Opcode::OccupancyAvailableDynamicSmem,
            Command::OccupancyMaxActiveClusters(_) => Opcode::OccupancyMaxActiveClusters,
            Command::StreamCreate { .. } => Opcode::StreamCreate,
            Command::StreamDestroy { .. } => Opcode::StreamDestroy,
            Command::StreamSynchronize { .. } => Opcode::StreamSynchronize,
            Command::StreamQuery { .. } => Opcode::StreamQuery,
            Command::StreamWaitEvent { .. } => Opcode::StreamWaitEvent,
            Command::EventCreate { .. } => Opcode::EventCreate,
            Command::EventDestroy { .. } => Opcode::EventDestroy,
            Command::EventRecord { .. } => Opcode::EventRecord,
            Command::EventSynchronize { .. } => Opcode::EventSynchronize,
            Command::EventQuery { .. } => Opcode::EventQuery,
            Command::EventElapsedTime { .. } => Opcode::EventElapsedTime,
            Command::DeviceStatus { .. } => Opcode::DeviceStatus,
        }
    }

    /// Decodes a body of the given opcode. The whole body must be consumed.
    pub fn decode_body(opcode: u16, body: &[u8]) -> Result<Self, DecodeError> {
        let op = Opcode::from_u16(opcode).ok_or(DecodeError::UnknownOpcode(opcode))?;
        let mut r = WireReader::new(body);
        let command = match op {
            // Padding bodies are arbitrary filler.
            Opcode::Padding => return Ok(Command::Padding),
            Opcode::BindChannel => {
                let resource_id = r.u32()?;
                let _reserved = r.u32()?;
                Command::BindChannel(ChannelLayout {
                    resource_id,
                    header_offset: r.u64()?,
                    ring_offset: r.u64()?,
                    ring_size: r.u64()?,
                    reply_offset: r.u64()?,
                    reply_size: r.u64()?,
                    bounce_offset: r.u64()?,
                    bounce_size: r.u64()?,
                })
            }
            Opcode::Doorbell => Command::Doorbell { until: r.u64()? },
            Opcode::CtxSynchronize => Command::CtxSynchronize,
            Opcode::CtxGetLimit => Command::CtxGetLimit { limit: r.u32()? },
            Opcode::CtxSetLimit => {
                let limit = r.u32()?;
                let _reserved = r.u32()?;
                Command::CtxSetLimit {
                    limit,
                    value: r.u64()?,
                }
            }
            Opcode::MemAlloc => Command::MemAlloc { size: r.u64()? },
            Opcode::MemFree => Command::MemFree {
                device_ptr: r.u64()?,
            },
            Opcode::MemGetInfo => Command::MemGetInfo,
            Opcode::MemcpyHtoD => {
                let stream = r.u32()?;
                let _reserved = r.u32()?;
                Command::MemcpyHtoD {
                    stream,
                    dst: r.u64()?,
                    src: BlobRange::decode(&mut r)?,
                }
            }
            Opcode::MemcpyDtoH => {
                let stream = r.u32()?;
                let _reserved = r.u32()?;
                Command::MemcpyDtoH {
                    stream,
                    dst: BlobRange::decode(&mut r)?,
                    src: r.u64()?,
                }
            }
            Opcode::MemcpyDtoD => {
                let stream = r.u32()?;
                let _reserved = r.u32()?;
                Command::MemcpyDtoD {
                    stream,
                    dst: r.u64()?,
                    src: r.u64()?,
                    size: r.u64()?,
                }
            }
            Opcode::Memset => {
                let stream = r.u32()?;
                let value = r.u32()?;
                let dst = r.u64()?;
                let element_size = r.u32()?;
                if !matches!(element_size, 1 | 2 | 4) {
                    return Err(DecodeError::InvalidField {
                        field: "memset.element_size",
                        value: element_size.into(),
                    });
                }
                let _reserved = r.u32()?;
                Command::Memset {
                    stream,
                    dst,
                    value,
                    element_size,
                    count: r.u64()?,
                }
            }
            Opcode::ModuleLoad => {
                let module = r.u32()?;
                let _reserved = r.u32()?;
                Command::ModuleLoad {
                    module,
                    image: BlobRange::decode(&mut r)?,
                }
            }
            Opcode::ModuleUnload => Command::ModuleUnload { module: r.u32()? },
            Opcode::ModuleLoadCached => Command::ModuleLoadCached {
                module: r.u32()?,
                hash: hash(&mut r)?,
            },
            Opcode::ModuleLoadHashed => Command::ModuleLoadHashed {
                module: r.u32()?,
                hash: hash(&mut r)?,
                image: BlobRange::decode(&mut r)?,
            },
            Opcode::ModuleGetFunction => Command::ModuleGetFunction {
                module: r.u32()?,
                function: r.u32()?,
                name: name(&mut r)?,
            },
            Opcode::ModuleGetGlobal => Command::ModuleGetGlobal {
                module: r.u32()?,
                name: name(&mut r)?,
            },
            Opcode::FuncGetAttribute => Command::FuncGetAttribute {
                function: r.u32()?,
                attribute: r.i32()?,
            },
            Opcode::LaunchKernel => {
                let function = r.u32()?;
                let grid = [r.u32()?, r.u32()?, r.u32()?];
                let block = [r.u32()?, r.u32()?, r.u32()?];
                let shared_mem_bytes = r.u32()?;
                let stream = r.u32()?;
                let params = r.bytes_with_len(MAX_KERNEL_PARAMS_BYTES)?.to_vec();
                Command::LaunchKernel(Launch {
                    function,
                    grid,
                    block,
                    shared_mem_bytes,
                    stream,
                    params,
                })
            }
            Opcode::FuncSetAttribute => Command::FuncSetAttribute {
                function: r.u32()?,
                attribute: r.i32()?,
                value: r.i32()?,
            },
            Opcode::OccupancyMaxActiveBlocks => {
                let function = r.u32()?;
                let block_size = r.i32()?;
                let flags = r.u32()?;
                let _reserved = r.u32()?;
                Command::OccupancyMaxActiveBlocks {
                    function,
                    block_size,
                    flags,
                    dynamic_smem_bytes: r.u64()?,
                }
            }
            Opcode::OccupancyAvailableDynamicSmem => Command::OccupancyAvailableDynamicSmem {
                function: r.u32()?,
                num_blocks: r.i32()?,
                block_size: r.i32()?,
            },
            Opcode::OccupancyMaxActiveClusters => {
                Command::OccupancyMaxActiveClusters(ClusterQuery {
                    function: r.u32()?,
                    grid: [r.u32()?, r.u32()?, r.u32()?],
                    block: [r.u32()?, r.u32()?, r.u32()?],
                    shared_mem_bytes: r.u32()?,
                    cluster: [r.u32()?, r.u32()?, r.u32()?],
                })
            }
            Opcode::StreamCreate => Command::StreamCreate {
                stream: r.u32()?,
                flags: r.u32()?,
                priority: r.i32()?,
            },
            Opcode::StreamDestroy => Command::StreamDestroy { stream: r.u32()? },
            Opcode::StreamSynchronize => Command::StreamSynchronize { stream: r.u32()? },
            Opcode::StreamQuery => Command::StreamQuery { stream: r.u32()? },
            Opcode::StreamWaitEvent => Command::StreamWaitEvent {
                stream: r.u32()?,
                event: r.u32()?,
                flags: r.u32()?,
            },
            Opcode::EventCreate => Command::EventCreate {
                event: r.u32()?,
                flags: r.u32()?,
            },
            Opcode::EventDestroy => Command::EventDestroy { event: r.u32()? },
            Opcode::EventRecord => Command::EventRecord {
                event: r.u32()?,
                stream: r.u32()?,
            },
            Opcode::EventSynchronize => Command::EventSynchronize { event: r.u32()? },
            Opcode::EventQuery => Command::EventQuery { event: r.u32()? },
            Opcode::EventElapsedTime => Command::EventElapsedTime {
                start: r.u32()?,
                end: r.u32()?,
            },
            Opcode::DeviceStatus => Command::DeviceStatus { device: r.u32()? },
        };
        r.finish()?;
        Ok(command)
    }

    /// Appends the body (no header) to `w`.
    pub fn encode_body(&self, w: &mut WireWriter) {
        match self {
            Command::Padding | Command::CtxSynchronize | Command::MemGetInfo => {}
            Command::BindChannel(l) => {
                w.u32(l.resource_id)
                    .u32(0)
                    .u64(l.header_offset)
                    .u64(l.ring_offset)
                    .u64(l.ring_size)
                    .u64(l.reply_offset)
                    .u64(l.reply_size)
                    .u64(l.bounce_offset)
                    .u64(l.bounce_size);
            }
            Command::Doorbell { until } => {
                w.u64(*until);
            }
            Command::CtxGetLimit { limit } => {
                w.u32(*limit);
            }
            Command::CtxSetLimit { limit, value } => {
                w.u32(*limit).u32(0).u64(*value);
            }
            Command::MemAlloc { size } => {
                w.u64(*size);
            }
            Command::MemFree { device_ptr } => {
                w.u64(*device_ptr);
            }
            Command::MemcpyHtoD { stream, dst, src } => {
                w.u32(*stream).u32(0).u64(*dst);
                src.encode(w);
            }
            Command::MemcpyDtoH { stream, dst, src } => {
                w.u32(*stream).u32(0);
                dst.encode(w);
                w.u64(*src);
            }
            Command::MemcpyDtoD {
                stream,
                dst,
                src,
                size,
            } => {
                w.u32(*stream).u32(0).u64(*dst).u64(*src).u64(*size);
            }
            Command::Memset {
                stream,
                dst,
                value,
                element_size,
                count,
            } => {
                w.u32(*stream)
                    .u32(*value)
                    .u64(*dst)
                    .u32(*element_size)
                    .u32(0)
                    .u64(*count);
            }
            Command::ModuleLoad { module, image } => {
                w.u32(*module).u32(0);
                image.encode(w);
            }
            Command::ModuleUnload { module } => {
                w.u32(*module);
            }
            Command::ModuleLoadCached { module, hash } => {
                w.u32(*module).raw(hash);
            }
            Command::ModuleLoadHashed {
                module,
                hash,
                image,
            } => {
                w.u32(*module).raw(hash);
                image.encode(w);
            }
            Command::ModuleGetFunction {
                module,
                function,
                name,
            } => {
                w.u32(*module).u32(*function).bytes_with_len(name);
            }
            Command::ModuleGetGlobal { module, name } => {
                w.u32(*module).bytes_with_len(name);
            }
            Command::FuncGetAttribute {
                function,
                attribute,
            } => {
                w.u32(*function).i32(*attribute);
            }
            Command::LaunchKernel(l) => {
                w.u32(l.function);
                for v in l.grid.iter().chain(l.block.iter()) {
                    w.u32(*v);
                }
                w.u32(l.shared_mem_bytes)
                    .u32(l.stream)
                    .bytes_with_len(&l.params);
            }
            Command::FuncSetAttribute {
                function,
                attribute,
                value,
            } => {
                w.u32(*function).i32(*attribute).i32(*value);
            }
            Command::OccupancyMaxActiveBlocks {
                function,
                block_size,
                flags,
                dynamic_smem_bytes,
            } => {
                w.u32(*function)
                    .i32(*block_size)
                    .u32(*flags)
                    .u32(0)
                    .u64(*dynamic_smem_bytes);
            }
            Command::OccupancyAvailableDynamicSmem {
                function,
                num_blocks,
                block_size,
            } => {
                w.u32(*function).i32(*num_blocks).i32(*block_size);
            }
            Command::OccupancyMaxActiveClusters(q) => {
                w.u32(q.function);
                for v in q.grid.iter().chain(q.block.iter()) {
                    w.u32(*v);
                }
                w.u32(q.shared_mem_bytes);
                for v in &q.cluster {
                    w.u32(*v);
                }
            }
            Command::StreamCreate {
                stream,
                flags,
                priority,
            } => {
                w.u32(*stream).u32(*flags).i32(*priority);
            }
            Command::StreamDestroy { stream }
            | Command::StreamSynchronize { stream }
            | Command::StreamQuery { stream } => {
                w.u32(*stream);
            }
            Command::StreamWaitEvent {
                stream,
                event,
                flags,
            } => {
                w.u32(*stream).u32(*event).u32(*flags);
            }
            Command::EventCreate { event, flags } => {
                w.u32(*event).u32(*flags);
            }
            Command::EventDestroy { event }
            | Command::EventSynchronize { event }
            | Command::EventQuery { event } => {
                w.u32(*event);
            }
            Command::EventRecord { event, stream } => {
                w.u32(*event).u32(*stream);
            }
            Command::EventElapsedTime { start, end } => {
                w.u32(*start).u32(*end);
            }
            Command::DeviceStatus { device } => {
                w.u32(*device);
            }
        }
    }

    /// Appends header, body and alignment padding to `w`; returns the number
    /// of bytes written.
    pub fn encode(&self, reply_seq: u64, w: &mut WireWriter) -> usize {
        let start = w.len();
        let mut body = WireWriter::new();
        self.encode_body(&mut body);
        CommandHeader {
            opcode: self.opcode() as u16,
            flags: 0,
            body_len: body.len() as u32,
            reply_seq,
        }
        .encode(w);
        w.raw(body.as_bytes()).pad_to(COMMAND_ALIGN);
        w.len() - start
    }

    /// Encodes into a fresh vector.
    pub fn to_bytes(&self, reply_seq: u64) -> Vec<u8> {
        let mut w = WireWriter::new();
        self.encode(reply_seq, &mut w);
        w.into_bytes()
    }
}

/// A decoded command and the reply number it asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub reply_seq: u64,
    pub command: Command,
    /// Bytes the command occupies including padding.
    pub wire_len: usize,
}

/// Decodes the command at the start of `bytes`.
pub fn decode_one(bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let header = CommandHeader::decode(bytes)?;
    let body_end = COMMAND_HEADER_SIZE + header.body_len as usize;
    let body = bytes
        .get(COMMAND_HEADER_SIZE..body_end)
        .ok_or(DecodeError::Truncated {
            offset: COMMAND_HEADER_SIZE,
            needed: header.body_len as usize,
            available: bytes.len().saturating_sub(COMMAND_HEADER_SIZE),
        })?;
    let command = Command::decode_body(header.opcode, body)?;
    Ok(Decoded {
        reply_seq: header.reply_seq,
        command,
        wire_len: header.padded_len().min(bytes.len().max(body_end)),
    })
}

/// Iterates over a buffer of back-to-back commands (a SUBMIT_3D payload).
/// Stops at the first error, which it yields.
pub fn decode_all(bytes: &[u8]) -> impl Iterator<Item = Result<Decoded, DecodeError>> + '_ {
    let mut offset = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || offset >= bytes.len() {
            return None;
        }
        let rest = bytes.get(offset..)?;
        match decode_one(rest) {
            Ok(decoded) => {
                offset = offset.saturating_add(decoded.wire_len.max(COMMAND_ALIGN));
                Some(Ok(decoded))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}
