//! Commands from the guest to the host.
//!
//! A command is a 24-byte [`CommandHeader`] followed by its body. Commands are
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
pub const COMMAND_HEADER_SIZE: usize = 24;
/// Where [`CommandHeader::stamp`] lies in a header: its last word.
pub const COMMAND_STAMP_OFFSET: usize = 16;
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
    /// In a channel's ring, [`crate::channel::ring_stamp`] of the command's
    /// position, written last: the host finds a new command by polling for
    /// it. Zero elsewhere; never trusted for anything but that.
    pub stamp: u64,
}

impl CommandHeader {
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = WireReader::new(bytes);
        let header = Self {
            opcode: r.u16()?,
            flags: r.u16()?,
            body_len: r.u32()?,
            reply_seq: r.u64()?,
            stamp: r.u64()?,
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
        w.raw(&self.to_bytes());
    }

    /// The header's wire form, without a buffer to grow.
    pub fn to_bytes(&self) -> [u8; COMMAND_HEADER_SIZE] {
        let mut bytes = [0u8; COMMAND_HEADER_SIZE];
        bytes[0..2].copy_from_slice(&self.opcode.to_le_bytes());
        bytes[2..4].copy_from_slice(&self.flags.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.body_len.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.reply_seq.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.stamp.to_le_bytes());
        bytes
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

/// Highest tensor rank a tensor map describes.
pub const MAX_TENSOR_RANK: usize = 5;
/// Bytes of a `CUtensorMap`.
pub const TENSOR_MAP_BYTES: usize = 128;

/// Which `cuTensorMapEncode*` a [`TensorMapSpec`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum TensorMapKind {
    /// `cuTensorMapEncodeTiled`: `box_dim` is used.
    #[default]
    Tiled = 0,
    /// `cuTensorMapEncodeIm2col`: the pixel box corners, channels per
    /// pixel and pixels per column are used.
    Im2col = 1,
}

/// The arguments of `cuTensorMapEncodeTiled` or `cuTensorMapEncodeIm2col`,
/// arrays padded to [`MAX_TENSOR_RANK`] (entries past the rank are zero
/// and unused). Enum arguments travel as the integers the guest passed:
/// the host's driver validates them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TensorMapSpec {
    pub kind: TensorMapKind,
    pub data_type: u32,
    /// 1 to [`MAX_TENSOR_RANK`].
    pub rank: u32,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
    pub channels_per_pixel: u32,
    pub pixels_per_column: u32,
    pub global_address: u64,
    pub global_dim: [u64; MAX_TENSOR_RANK],
    /// `rank - 1` strides (the first dimension's is the element size).
    pub global_strides: [u64; MAX_TENSOR_RANK - 1],
    pub box_dim: [u32; MAX_TENSOR_RANK],
    pub element_strides: [u32; MAX_TENSOR_RANK],
    /// `rank - 2` corners each (im2col).
    pub lower_corner: [i32; MAX_TENSOR_RANK - 2],
    pub upper_corner: [i32; MAX_TENSOR_RANK - 2],
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

/// Most attributes one `LaunchKernelEx` carries besides its cluster shape
/// and cooperative flag (the driver defines fewer than 20 kinds).
pub const MAX_LAUNCH_ATTRIBUTES: usize = 16;

/// `GraphNameNodes`' `which`: the nodes listed.
pub mod name_nodes {
    /// Every node of graph `handle`.
    pub const NODES: u32 = 0;
    /// The nodes of graph `handle` that depend on none.
    pub const ROOTS: u32 = 1;
    /// What the next node captured on stream `handle` will depend on.
    pub const CAPTURE_DEPENDENCIES: u32 = 2;
    /// The nodes node `handle` depends on.
    pub const DEPENDENCIES: u32 = 3;
    /// The nodes that depend on node `handle`.
    pub const DEPENDENTS: u32 = 4;
}

/// `CUlaunchAttributeID`s (cuda.h) that a `LaunchKernelEx` may carry.
pub mod launch_attribute {
    pub const IGNORE: u32 = 0;
    pub const ACCESS_POLICY_WINDOW: u32 = 1;
    pub const COOPERATIVE: u32 = 2;
    pub const SYNCHRONIZATION_POLICY: u32 = 3;
    pub const CLUSTER_DIMENSION: u32 = 4;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
    pub const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
    pub const PROGRAMMATIC_EVENT: u32 = 7;
    pub const PRIORITY: u32 = 8;
    pub const MEM_SYNC_DOMAIN_MAP: u32 = 9;
    pub const MEM_SYNC_DOMAIN: u32 = 10;
    pub const PREFERRED_CLUSTER_DIMENSION: u32 = 11;
    pub const LAUNCH_COMPLETION_EVENT: u32 = 12;
    /// A graph kernel node's; no launch takes it.
    pub const DEVICE_UPDATABLE_KERNEL_NODE: u32 = 13;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: u32 = 14;
}

/// One `CUlaunchAttribute` of a `cuLaunchKernelEx` as the guest sent it:
/// the driver's attribute id and the first 32 bytes of its value union
/// (the largest value the host accepts, the access policy window, is 28).
/// Event handles in it are the guest's handles; the host checks and
/// translates every field before the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaunchAttr {
    pub id: u32,
    pub value: [u64; 4],
}

impl LaunchAttr {
    /// Attribute `id` whose value union (as `CUlaunchAttributeValue`, 16
    /// words) is `union`: its first 32 bytes travel.
    pub fn from_union(id: u32, union: &[u32; 16]) -> Self {
        let mut value = [0u64; 4];
        for (v, pair) in value.iter_mut().zip(union.chunks_exact(2)) {
            *v = pair
                .iter()
                .rev()
                .fold(0u64, |high, word| high << 32 | u64::from(*word));
        }
        Self { id, value }
    }
}

/// A value of a command body on the wire: how it is read (never trusting
/// a length), written, and how long it is written, so a command's size is
/// known without encoding it. `commands!` builds every command from these.
pub trait Field: Sized {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError>;
    fn write(&self, w: &mut WireWriter);
    fn wire_len(&self) -> usize;
    /// An arbitrary value drawn from `draw` (fuzzing and round trips are
    /// generated from the command table with it).
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self;
}

/// A boxed field travels as its content. The command table boxes the
/// rare large fields (tensor maps): every command moves through the worker
/// by value, and the largest variant sets the size of all (184 bytes, each
/// move a `memcpy` call, 10% of a worker's time in a synchronous loop).
impl<T: Field> Field for Box<T> {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        T::read(r).map(Box::new)
    }
    fn write(&self, w: &mut WireWriter) {
        (**self).write(w);
    }
    fn wire_len(&self) -> usize {
        (**self).wire_len()
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        Box::new(T::draw(draw))
    }
}

impl Field for u32 {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        r.u32()
    }
    fn write(&self, w: &mut WireWriter) {
        w.u32(*self);
    }
    fn wire_len(&self) -> usize {
        4
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        draw() as u32
    }
}

impl Field for i32 {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        r.i32()
    }
    fn write(&self, w: &mut WireWriter) {
        w.i32(*self);
    }
    fn wire_len(&self) -> usize {
        4
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        draw() as i32
    }
}

impl Field for u64 {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        r.u64()
    }
    fn write(&self, w: &mut WireWriter) {
        w.u64(*self);
    }
    fn wire_len(&self) -> usize {
        8
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        draw()
    }
}

impl Field for [u32; 3] {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        Ok([r.u32()?, r.u32()?, r.u32()?])
    }
    fn write(&self, w: &mut WireWriter) {
        for v in self {
            w.u32(*v);
        }
    }
    fn wire_len(&self) -> usize {
        12
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        [u32::draw(draw), u32::draw(draw), u32::draw(draw)]
    }
}

/// Bytes of a fixed length: a SHA-256 digest (32), a CUDA IPC handle (64).
impl<const N: usize> Field for [u8; N] {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(r.take(N)?);
        Ok(out)
    }
    fn write(&self, w: &mut WireWriter) {
        w.raw(self);
    }
    fn wire_len(&self) -> usize {
        N
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        let mut out = [0u8; N];
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&draw().to_le_bytes()[..chunk.len()]);
        }
        out
    }
}

/// Bytes of a CUDA IPC handle (`CUipcMemHandle`, `CUipcEventHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// A CUDA IPC handle as the driver wrote it.
pub type IpcHandle = [u8; IPC_HANDLE_BYTES];

/// Bytes drawn for a variable-length field: at most `max` of them, each
/// from `byte`.
fn draw_bytes(draw: &mut dyn FnMut() -> u64, max: u64, byte: impl Fn(u64) -> u8) -> Vec<u8> {
    let len = draw() % (max + 1);
    (0..len).map(|_| byte(draw())).collect()
}

/// A symbol name (a `u32` length, then the bytes): at most
/// [`MAX_NAME_BYTES`], no NUL byte.
impl Field for Vec<u8> {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let bytes = r.bytes_with_len(MAX_NAME_BYTES)?;
        if bytes.contains(&0) {
            return Err(DecodeError::InvalidField {
                field: "name",
                value: 0,
            });
        }
        Ok(bytes.to_vec())
    }
    fn write(&self, w: &mut WireWriter) {
        w.bytes_with_len(self);
    }
    fn wire_len(&self) -> usize {
        4 + self.len()
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        draw_bytes(draw, 64, |v| (v % 255) as u8 + 1)
    }
}

impl Field for BlobRange {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        BlobRange::decode(r)
    }
    fn write(&self, w: &mut WireWriter) {
        self.encode(w);
    }
    fn wire_len(&self) -> usize {
        BlobRange::WIRE_SIZE
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        BlobRange {
            resource_id: u32::draw(draw),
            offset: draw(),
            length: draw(),
        }
    }
}

impl Field for ChannelLayout {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        Ok(ChannelLayout {
            resource_id: r.u32()?,
            header_offset: r.u64()?,
            ring_offset: r.u64()?,
            ring_size: r.u64()?,
            reply_offset: r.u64()?,
            reply_size: r.u64()?,
            bounce_offset: r.u64()?,
            bounce_size: r.u64()?,
        })
    }
    fn write(&self, w: &mut WireWriter) {
        w.u32(self.resource_id)
            .u64(self.header_offset)
            .u64(self.ring_offset)
            .u64(self.ring_size)
            .u64(self.reply_offset)
            .u64(self.reply_size)
            .u64(self.bounce_offset)
            .u64(self.bounce_size);
    }
    fn wire_len(&self) -> usize {
        4 + 7 * 8
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        ChannelLayout {
            resource_id: u32::draw(draw),
            header_offset: draw(),
            ring_offset: draw(),
            ring_size: draw(),
            reply_offset: draw(),
            reply_size: draw(),
            bounce_offset: draw(),
            bounce_size: draw(),
        }
    }
}

impl Field for ClusterQuery {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        Ok(ClusterQuery {
            function: r.u32()?,
            grid: Field::read(r)?,
            block: Field::read(r)?,
            shared_mem_bytes: r.u32()?,
            cluster: Field::read(r)?,
        })
    }
    fn write(&self, w: &mut WireWriter) {
        w.u32(self.function);
        self.grid.write(w);
        self.block.write(w);
        w.u32(self.shared_mem_bytes);
        self.cluster.write(w);
    }
    fn wire_len(&self) -> usize {
        4 + 12 + 12 + 4 + 12
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        ClusterQuery {
            function: u32::draw(draw),
            grid: Field::draw(draw),
            block: Field::draw(draw),
            shared_mem_bytes: u32::draw(draw),
            cluster: Field::draw(draw),
        }
    }
}

impl Field for TensorMapSpec {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let kind = match r.u32()? {
            0 => TensorMapKind::Tiled,
            1 => TensorMapKind::Im2col,
            value => {
                return Err(DecodeError::InvalidField {
                    field: "tensor map kind",
                    value: value.into(),
                })
            }
        };
        let mut spec = TensorMapSpec {
            kind,
            data_type: r.u32()?,
            rank: r.u32()?,
            interleave: r.u32()?,
            swizzle: r.u32()?,
            l2_promotion: r.u32()?,
            oob_fill: r.u32()?,
            channels_per_pixel: r.u32()?,
            pixels_per_column: r.u32()?,
            ..Default::default()
        };
        if spec.rank == 0 || spec.rank as usize > MAX_TENSOR_RANK {
            return Err(DecodeError::InvalidField {
                field: "tensor rank",
                value: spec.rank.into(),
            });
        }
        let _pad = r.u32()?;
        spec.global_address = r.u64()?;
        for v in &mut spec.global_dim {
            *v = r.u64()?;
        }
        for v in &mut spec.global_strides {
            *v = r.u64()?;
        }
        for v in spec.box_dim.iter_mut().chain(&mut spec.element_strides) {
            *v = r.u32()?;
        }
        for v in spec.lower_corner.iter_mut().chain(&mut spec.upper_corner) {
            *v = r.i32()?;
        }
        Ok(spec)
    }
    fn write(&self, w: &mut WireWriter) {
        w.u32(self.kind as u32)
            .u32(self.data_type)
            .u32(self.rank)
            .u32(self.interleave)
            .u32(self.swizzle)
            .u32(self.l2_promotion)
            .u32(self.oob_fill)
            .u32(self.channels_per_pixel)
            .u32(self.pixels_per_column)
            .u32(0)
            .u64(self.global_address);
        for v in self.global_dim.iter().chain(&self.global_strides) {
            w.u64(*v);
        }
        for v in self.box_dim.iter().chain(&self.element_strides) {
            w.u32(*v);
        }
        for v in self.lower_corner.iter().chain(&self.upper_corner) {
            w.i32(*v);
        }
    }
    fn wire_len(&self) -> usize {
        40 + 8
            + 8 * (2 * MAX_TENSOR_RANK - 1)
            + 4 * 2 * MAX_TENSOR_RANK
            + 4 * 2 * (MAX_TENSOR_RANK - 2)
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        let mut spec = TensorMapSpec {
            kind: if draw().is_multiple_of(2) {
                TensorMapKind::Tiled
            } else {
                TensorMapKind::Im2col
            },
            data_type: u32::draw(draw),
            rank: (draw() % MAX_TENSOR_RANK as u64) as u32 + 1,
            interleave: u32::draw(draw),
            swizzle: u32::draw(draw),
            l2_promotion: u32::draw(draw),
            oob_fill: u32::draw(draw),
            channels_per_pixel: u32::draw(draw),
            pixels_per_column: u32::draw(draw),
            global_address: draw(),
            ..Default::default()
        };
        for v in spec.global_dim.iter_mut().chain(&mut spec.global_strides) {
            *v = draw();
        }
        for v in spec.box_dim.iter_mut().chain(&mut spec.element_strides) {
            *v = draw() as u32;
        }
        for v in spec.lower_corner.iter_mut().chain(&mut spec.upper_corner) {
            *v = draw() as i32;
        }
        spec
    }
}

/// One side of a [`Copy3D`]: its first byte, rows `pitch` bytes apart and
/// slices `rows` rows apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PitchedSide {
    pub address: u64,
    pub pitch: u64,
    pub rows: u64,
}

impl PitchedSide {
    /// Where row `row` of slice `slice` starts; `None` on overflow.
    pub fn row_start(&self, row: u64, slice: u64) -> Option<u64> {
        slice
            .checked_mul(self.rows)?
            .checked_add(row)?
            .checked_mul(self.pitch)?
            .checked_add(self.address)
    }
}

/// `depth` slices of `height` rows of `width` bytes between device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy3D {
    pub dst: PitchedSide,
    pub src: PitchedSide,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

impl Copy3D {
    /// `size` contiguous bytes.
    pub fn linear(dst: u64, src: u64, size: u64) -> Self {
        let side = |address| PitchedSide {
            address,
            pitch: size,
            rows: 1,
        };
        Self {
            dst: side(dst),
            src: side(src),
            width: size,
            height: 1,
            depth: 1,
        }
    }

    /// The bytes of `side` from its first to its last copied byte (the
    /// last row ends `width` bytes after it starts); `None` on overflow or
    /// an empty copy.
    pub fn span(&self, side: &PitchedSide) -> Option<u64> {
        if self.width == 0 || self.height == 0 || self.depth == 0 {
            return None;
        }
        let last = side.row_start(self.height - 1, self.depth - 1)?;
        last.checked_add(self.width)?.checked_sub(side.address)
    }

    /// Rows never overlap and slices hold their rows: each side's pitch is
    /// at least the width and its slices at least the height (as the
    /// driver asks of a 2D or 3D copy; a single row or slice needs
    /// neither).
    pub fn is_well_formed(&self) -> bool {
        let side_ok = |side: &PitchedSide| {
            (self.height <= 1 && self.depth <= 1 || side.pitch >= self.width)
                && (self.depth <= 1 || side.rows >= self.height)
        };
        self.width > 0
            && self.height > 0
            && self.depth > 0
            && side_ok(&self.dst)
            && side_ok(&self.src)
    }
}

impl Field for PitchedSide {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        Ok(PitchedSide {
            address: r.u64()?,
            pitch: r.u64()?,
            rows: r.u64()?,
        })
    }
    fn write(&self, w: &mut WireWriter) {
        w.u64(self.address).u64(self.pitch).u64(self.rows);
    }
    fn wire_len(&self) -> usize {
        24
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        PitchedSide {
            address: draw(),
            pitch: draw(),
            rows: draw(),
        }
    }
}

impl Field for Copy3D {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        Ok(Copy3D {
            dst: Field::read(r)?,
            src: Field::read(r)?,
            width: r.u64()?,
            height: r.u64()?,
            depth: r.u64()?,
        })
    }
    fn write(&self, w: &mut WireWriter) {
        self.dst.write(w);
        self.src.write(w);
        w.u64(self.width).u64(self.height).u64(self.depth);
    }
    fn wire_len(&self) -> usize {
        24 + 24 + 24
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        Copy3D {
            dst: Field::draw(draw),
            src: Field::draw(draw),
            width: draw(),
            height: draw(),
            depth: draw(),
        }
    }
}

impl Field for Launch {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        Ok(Launch {
            function: r.u32()?,
            grid: Field::read(r)?,
            block: Field::read(r)?,
            shared_mem_bytes: r.u32()?,
            stream: r.u32()?,
            params: r.bytes_with_len(MAX_KERNEL_PARAMS_BYTES)?.to_vec(),
        })
    }
    fn write(&self, w: &mut WireWriter) {
        w.u32(self.function);
        self.grid.write(w);
        self.block.write(w);
        w.u32(self.shared_mem_bytes)
            .u32(self.stream)
            .bytes_with_len(&self.params);
    }
    fn wire_len(&self) -> usize {
        4 + 12 + 12 + 4 + 4 + 4 + self.params.len()
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        Launch {
            function: u32::draw(draw),
            grid: Field::draw(draw),
            block: Field::draw(draw),
            shared_mem_bytes: u32::draw(draw),
            stream: u32::draw(draw),
            params: draw_bytes(draw, 256, |v| v as u8),
        }
    }
}

impl Field for Vec<LaunchAttr> {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let count = r.u32()? as usize;
        if count > MAX_LAUNCH_ATTRIBUTES {
            return Err(DecodeError::LengthOutOfRange {
                length: count as u64,
                limit: MAX_LAUNCH_ATTRIBUTES as u64,
            });
        }
        let mut attributes = Vec::with_capacity(count);
        for _ in 0..count {
            let id = r.u32()?;
            let _pad = r.u32()?;
            attributes.push(LaunchAttr {
                id,
                value: [r.u64()?, r.u64()?, r.u64()?, r.u64()?],
            });
        }
        Ok(attributes)
    }
    fn write(&self, w: &mut WireWriter) {
        let attributes = self.get(..MAX_LAUNCH_ATTRIBUTES).unwrap_or(self);
        w.u32(attributes.len() as u32);
        for attribute in attributes {
            w.u32(attribute.id).u32(0);
            for v in attribute.value {
                w.u64(v);
            }
        }
    }
    fn wire_len(&self) -> usize {
        4 + self.len().min(MAX_LAUNCH_ATTRIBUTES) * 40
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        let count = draw() % 4;
        (0..count)
            .map(|_| LaunchAttr {
                id: (draw() % 16) as u32,
                value: [draw(), draw(), draw(), draw()],
            })
            .collect()
    }
}

/// Most dependencies one graph node may name (a node with more is refused
/// where it is decoded; the driver takes any number, real graphs a few).
pub const MAX_NODE_DEPENDENCIES: usize = 1024;

/// A graph node's dependencies: guest node handles (a `u32` count, at most
/// [`MAX_NODE_DEPENDENCIES`], then the handles).
impl Field for Vec<u32> {
    fn read(r: &mut WireReader<'_>) -> Result<Self, DecodeError> {
        let count = r.u32()? as usize;
        if count > MAX_NODE_DEPENDENCIES {
            return Err(DecodeError::LengthOutOfRange {
                length: count as u64,
                limit: MAX_NODE_DEPENDENCIES as u64,
            });
        }
        (0..count).map(|_| r.u32()).collect()
    }
    fn write(&self, w: &mut WireWriter) {
        let nodes = self.get(..MAX_NODE_DEPENDENCIES).unwrap_or(self);
        w.u32(nodes.len() as u32);
        for node in nodes {
            w.u32(*node);
        }
    }
    fn wire_len(&self) -> usize {
        4 + self.len().min(MAX_NODE_DEPENDENCIES) * 4
    }
    fn draw(draw: &mut dyn FnMut() -> u64) -> Self {
        let count = draw() % 8;
        (0..count).map(|_| draw() as u32).collect()
    }
}

/// A command table: each command is defined once, with its wire number
/// and its fields in wire order. It generates the opcode enum, the command
/// enum, and for every command its decoding (the whole body must be
/// consumed, and a `check` function, if named, must accept it), encoding,
/// encoded size and a drawn example (what the round-trip and fuzz tests
/// run over, so a new command is tested as soon as it is in the table).
/// Two tables use it: the ring's [`Command`]s and the [`ControlCommand`]s
/// of a SUBMIT_3D. A `filler` command's body is arbitrary and never
/// decoded.
macro_rules! commands {
    (
        $(#[$enum_doc:meta])* enum $command:ident;
        $(#[$opcode_doc:meta])* opcodes $opcode:ident $(, filler $filler:ident)?;
        $(
            $(#[$doc:meta])*
            $name:ident = $op:literal $({
                $($(#[$field_doc:meta])* $field:ident : $ty:ty),* $(,)?
            })? $(check $check:path)?;
        )*
    ) => {
        $(#[$opcode_doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum $opcode { $($name = $op,)* }

        impl $opcode {
            /// Every opcode, in table order.
            pub const ALL: &'static [$opcode] = &[$($opcode::$name,)*];

            pub fn from_u16(value: u16) -> Option<Self> {
                match value {
                    $($op => Some(Self::$name),)*
                    _ => None,
                }
            }

            /// The command's name, as the table spells it.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$name => stringify!($name),)*
                }
            }
        }

        $(#[$enum_doc])*
        #[derive(Debug, Clone, PartialEq)]
        pub enum $command {
            $(
                $(#[$doc])*
                $name $({ $($(#[$field_doc])* $field: $ty,)* })?,
            )*
        }

        impl $command {
            pub fn opcode(&self) -> $opcode {
                match self {
                    $($command::$name { .. } => $opcode::$name,)*
                }
            }

            /// Decodes a body of the given opcode. The whole body must be
            /// consumed.
            pub fn decode_body(opcode: u16, body: &[u8]) -> Result<Self, DecodeError> {
                let op = $opcode::from_u16(opcode).ok_or(DecodeError::UnknownOpcode(opcode))?;
                // Filler bodies are arbitrary (or inline data).
                $(if op == $opcode::$filler {
                    return Ok($command::$filler);
                })?
                let mut r = WireReader::new(body);
                let command = match op {
                    $($opcode::$name => $command::$name $({
                        $($field: <$ty as Field>::read(&mut r)?,)*
                    })?,)*
                };
                r.finish()?;
                command.validate()?;
                Ok(command)
            }

            /// Appends the body (no header) to `w`.
            pub fn encode_body(&self, w: &mut WireWriter) {
                match self {
                    $($command::$name $({ $($field,)* })? => {
                        $($( <$ty as Field>::write($field, w); )*)?
                    })*
                }
            }

            /// The length of the body [`Self::encode_body`] writes.
            pub fn body_len(&self) -> usize {
                match self {
                    $($command::$name $({ $($field,)* })? => {
                        0 $($( + <$ty as Field>::wire_len($field) )*)?
                    })*
                }
            }

            /// The rules a command must meet beyond its fields' (the
            /// table's `check` functions); decoding refuses one that fails.
            pub fn validate(&self) -> Result<(), DecodeError> {
                match self {
                    $($($command::$name { .. } => $check(self),)?)*
                    #[allow(unreachable_patterns)]
                    _ => Ok(()),
                }
            }

            /// An arbitrary command of opcode `op`, its fields drawn from
            /// `draw` (it may break a `check` rule).
            pub fn draw(op: $opcode, draw: &mut dyn FnMut() -> u64) -> $command {
                match op {
                    $($opcode::$name => $command::$name $({
                        $($field: <$ty as Field>::draw(draw),)*
                    })?,)*
                }
            }

            /// Bytes the command takes on the wire: header, body and
            /// padding.
            pub fn encoded_len(&self) -> usize {
                padded(COMMAND_HEADER_SIZE + self.body_len())
            }

            /// The header the command travels under (stamp 0).
            pub fn header(&self, reply_seq: u64) -> CommandHeader {
                CommandHeader {
                    opcode: self.opcode() as u16,
                    flags: 0,
                    body_len: self.body_len() as u32,
                    reply_seq,
                    stamp: 0,
                }
            }

            /// Appends header, body and alignment padding to `w`; returns
            /// the number of bytes written.
            pub fn encode(&self, reply_seq: u64, w: &mut WireWriter) -> usize {
                let start = w.len();
                self.header(reply_seq).encode(w);
                self.encode_body(w);
                w.pad_to(COMMAND_ALIGN);
                w.len() - start
            }

            /// Encodes into a fresh vector.
            pub fn to_bytes(&self, reply_seq: u64) -> Vec<u8> {
                let mut w = WireWriter::with_capacity(self.encoded_len());
                self.encode(reply_seq, &mut w);
                w.into_bytes()
            }
        }

        impl WireCommand for $command {
            fn decode_body(opcode: u16, body: &[u8]) -> Result<Self, DecodeError> {
                $command::decode_body(opcode, body)
            }
        }
    };
}

/// What both command tables decode with ([`decode_one_of`]).
pub trait WireCommand: Sized {
    fn decode_body(opcode: u16, body: &[u8]) -> Result<Self, DecodeError>;
}

/// `LaunchKernelEx`'s cooperative flag is a boolean.
fn cooperative_flag(command: &Command) -> Result<(), DecodeError> {
    match command {
        Command::LaunchKernelEx { cooperative, .. } if *cooperative > 1 => {
            Err(DecodeError::InvalidField {
                field: "launch_kernel_ex.cooperative",
                value: (*cooperative).into(),
            })
        }
        _ => Ok(()),
    }
}

/// A graph event node's `wait` and a node's `enabled` are booleans.
fn graph_flags(command: &Command) -> Result<(), DecodeError> {
    let (field, value) = match command {
        Command::GraphEventNodeSetEvent { wait, .. }
        | Command::GraphExecEventNodeSetEvent { wait, .. } => ("graph event node wait", *wait),
        Command::GraphExecNodeSetEnabled { enabled, .. } => ("graph node enabled", *enabled),
        Command::GraphMemOpNodeSetParams { wait, .. }
        | Command::GraphExecMemOpNodeSetParams { wait, .. } => {
            ("memory-operation node wait", *wait)
        }
        _ => return Ok(()),
    };
    if value > 1 {
        return Err(DecodeError::InvalidField {
            field,
            value: value.into(),
        });
    }
    Ok(())
}

/// `Memset` sets elements of 1, 2 or 4 bytes.
fn memset_element_size(command: &Command) -> Result<(), DecodeError> {
    match command {
        Command::Memset { element_size, .. } if !matches!(element_size, 1 | 2 | 4) => {
            Err(DecodeError::InvalidField {
                field: "memset.element_size",
                value: (*element_size).into(),
            })
        }
        _ => Ok(()),
    }
}

/// A kernel node's launch names no stream (it runs on the graph's).
fn kernel_node_stream(command: &Command) -> Result<(), DecodeError> {
    match command {
        Command::GraphAddKernelNode { launch, .. }
        | Command::GraphKernelNodeSetParams { launch, .. }
        | Command::GraphExecKernelNodeSetParams { launch, .. }
            if launch.stream != 0 =>
        {
            Err(DecodeError::InvalidField {
                field: "graph kernel node launch.stream",
                value: launch.stream.into(),
            })
        }
        _ => Ok(()),
    }
}

/// A memset node sets elements of 1, 2 or 4 bytes.
fn memset_node_element_size(command: &Command) -> Result<(), DecodeError> {
    match command {
        Command::GraphAddMemsetNode { element_size, .. }
        | Command::GraphMemsetNodeSetParams { element_size, .. }
        | Command::GraphExecMemsetNodeSetParams { element_size, .. }
            if !matches!(element_size, 1 | 2 | 4) =>
        {
            Err(DecodeError::InvalidField {
                field: "graph memset node element_size",
                value: (*element_size).into(),
            })
        }
        _ => Ok(()),
    }
}

commands! {
    /// Channel control: what a SUBMIT_3D carries (never the ring).
    enum ControlCommand;
    /// Control command numbers on the wire (apart from the ring's).
    opcodes ControlOpcode;
    /// Attach a command ring and reply area to the session.
    BindChannel = 0x0001 { layout: ChannelLayout };
    /// The ring holds commands up to byte `until`; the fence of the
    /// SUBMIT_3D that carries this, if any, signals once the host has
    /// executed them.
    Doorbell = 0x0002 { until: u64 };
    /// The next blob of `size` bytes this context attaches is mapped in its
    /// worker at `address`, the guest process's own address of it, when
    /// that range is free there (the drm carrier's way to say what the
    /// local carrier puts in the blob id, which Linux's driver keeps at
    /// zero for guest blobs).
    PlaceNextBlob = 0x0003 { address: u64, size: u64 };
}

commands! {
    /// One decoded command of the ring. Which ones answer with data is
    /// documented on [`crate::reply`].
    enum Command;
    /// Ring command numbers on the wire.
    opcodes Opcode, filler Padding;
    /// Ring filler up to the ring's end; its body is ignored.
    Padding = 0x0000;
    CtxSynchronize = 0x0100;
    CtxGetLimit = 0x0101 { limit: u32 };
    CtxSetLimit = 0x0102 { limit: u32, value: u64 };
    MemAlloc = 0x0200 { size: u64 };
    MemFree = 0x0201 { device_ptr: u64 };
    MemGetInfo = 0x0202;
    MemcpyHtoD = 0x0203 { stream: u32, dst: u64, src: BlobRange };
    MemcpyDtoH = 0x0204 { stream: u32, dst: BlobRange, src: u64 };
    MemcpyDtoD = 0x0205 { stream: u32, dst: u64, src: u64, size: u64 };
    /// `cuMemHostGetDevicePointer` of page-locked guest memory (a range of
    /// a blob of the process's own); answers the device address (`u64`)
    /// at which kernels reach it.
    HostDevicePointer = 0x0220 { range: BlobRange };
    /// `count` elements of `element_size` (1, 2 or 4) bytes set to `value`.
    Memset = 0x0206 { stream: u32, value: u32, dst: u64, element_size: u32, count: u64 }
        check memset_element_size;
    ModuleLoad = 0x0300 { module: u32, image: BlobRange };
    ModuleUnload = 0x0301 { module: u32 };
    ModuleGetFunction = 0x0302 { module: u32, function: u32, name: Vec<u8> };
    ModuleGetGlobal = 0x0303 { module: u32, name: Vec<u8> };
    FuncGetAttribute = 0x0304 { function: u32, attribute: i32 };
    LaunchKernel = 0x0305 { launch: Launch };
    /// Loads the image the daemon has cached under this SHA-256 (an earlier
    /// load by any guest); answers `CUDA_ERROR_NOT_FOUND` when it has none,
    /// and the guest then sends the image with `ModuleLoadHashed`.
    ModuleLoadCached = 0x0306 { module: u32, hash: [u8; 32] };
    /// `ModuleLoad` of an image whose SHA-256 the guest computed: the host
    /// refuses it (`CUDA_ERROR_INVALID_VALUE`) unless its own hash agrees.
    ModuleLoadHashed = 0x0307 { module: u32, hash: [u8; 32], image: BlobRange };
    /// `cuFuncSetAttribute`; sent without a reply (the guest checks what it
    /// can first), so a failure surfaces at the next synchronising call.
    FuncSetAttribute = 0x0308 { function: u32, attribute: i32, value: i32 };
    OccupancyMaxActiveBlocks = 0x0309 {
        function: u32,
        block_size: i32,
        flags: u32,
        dynamic_smem_bytes: u64,
    };
    OccupancyAvailableDynamicSmem = 0x030a { function: u32, num_blocks: i32, block_size: i32 };
    OccupancyMaxActiveClusters = 0x030b { query: ClusterQuery };
    /// `cuOccupancyMaxPotentialClusterSize` (the query's cluster shape is
    /// not used); answers an `i32`.
    OccupancyMaxPotentialClusterSize = 0x030d { query: ClusterQuery };
    /// `cuLaunchKernelEx` with what changes how a kernel runs: a
    /// thread-block cluster shape (all zero: none), a cooperative launch
    /// (0 or 1), and every other launch attribute the guest gave.
    LaunchKernelEx = 0x030c {
        launch: Launch,
        cluster: [u32; 3],
        cooperative: u32,
        attributes: Vec<LaunchAttr>,
    }
        check cooperative_flag;
    StreamCreate = 0x0400 { stream: u32, flags: u32, priority: i32 };
    StreamDestroy = 0x0401 { stream: u32 };
    StreamSynchronize = 0x0402 { stream: u32 };
    StreamQuery = 0x0403 { stream: u32 };
    StreamWaitEvent = 0x0404 { stream: u32, event: u32, flags: u32 };
    /// `cuStreamBeginCapture_v2`: the host's stream records instead of
    /// running until `StreamEndCapture`.
    StreamBeginCapture = 0x0405 { stream: u32, mode: u32 };
    /// Ends the capture; the graph gets guest handle `graph` (a capture
    /// into an existing graph ends in that graph, and `graph` is unused).
    StreamEndCapture = 0x0406 { stream: u32, graph: u32 };
    /// `cuStreamBeginCaptureToGraph`: the stream's work is recorded into
    /// existing graph `graph`, after its nodes `dependencies`.
    StreamBeginCaptureToGraph = 0x0407 { stream: u32, mode: u32, graph: u32, dependencies: Vec<u32> };
    /// `cuStreamWriteValue32/64`: once its earlier work is done, the stream
    /// writes the low `width` (4 or 8) bytes of `value` at device address
    /// `address`.
    StreamWriteValue = 0x0408 { stream: u32, width: u32, address: u64, value: u64, flags: u32 };
    /// `cuStreamWaitValue32/64`: the stream waits until the `width`-byte
    /// word at `address` meets `flags`' condition against `value`.
    StreamWaitValue = 0x0409 { stream: u32, width: u32, address: u64, value: u64, flags: u32 };
    /// `cuStreamSetAttribute`: one attribute as `LaunchKernelEx` carries
    /// them (those a stream takes).
    StreamSetAttribute = 0x040a { stream: u32, attribute: Vec<LaunchAttr> };
    /// `cuStreamGetAttribute`; answers the 64-byte value union as the
    /// host's driver holds it.
    StreamGetAttribute = 0x040b { stream: u32, id: u32 };
    /// `cuStreamCopyAttributes`: stream `dst` takes `src`'s.
    StreamCopyAttributes = 0x040c { dst: u32, src: u32 };
    /// The graph `stream`'s capture records into (`cuStreamGetCaptureInfo`'s
    /// graph) gets guest handle `graph`; its `StreamEndCapture` ends in it.
    StreamCaptureGraph = 0x040d { stream: u32, graph: u32 };
    /// `cuStreamUpdateCaptureDependencies`: the next node captured on
    /// `stream` depends on `nodes` (nodes of the capture's graph) too
    /// (`flags` 0), or only on them (1).
    StreamUpdateCaptureDependencies = 0x040e { stream: u32, nodes: Vec<u32>, flags: u32 };
    EventCreate = 0x0500 { event: u32, flags: u32 };
    EventDestroy = 0x0501 { event: u32 };
    EventRecord = 0x0502 { event: u32, stream: u32 };
    EventSynchronize = 0x0503 { event: u32 };
    EventQuery = 0x0504 { event: u32 };
    EventElapsedTime = 0x0505 { start: u32, end: u32 };
    /// Live state of guest device `device` (NVML): answered without the
    /// session's device context, so it never creates one.
    DeviceStatus = 0x0600 { device: u32 };
    /// `cuMemGetAllocationGranularity` of pinned device memory (`option`:
    /// 0 minimum, 1 recommended); answers a `u64`.
    MemGranularity = 0x0800 { option: u32 };
    /// `cuMemCreate`: `size` bytes of pinned device memory, guest handle
    /// `handle`; taken from the tenant's memory budget.
    MemCreate = 0x0801 { handle: u32, size: u64 };
    MemRelease = 0x0802 { handle: u32 };
    /// `cuMemAddressReserve`; answers the address (`u64`).
    MemAddressReserve = 0x0803 { size: u64, alignment: u64, address: u64 };
    MemAddressFree = 0x0804 { address: u64, size: u64 };
    /// `cuMemMap`: `size` bytes of `handle`'s memory from `offset` at
    /// `address`, inside a reservation of the session.
    MemMap = 0x0805 { address: u64, size: u64, offset: u64, handle: u32 };
    MemUnmap = 0x0806 { address: u64, size: u64 };
    /// `cuMemSetAccess` for the session's device (`flags`: 1 read, 3
    /// read-write).
    MemSetAccess = 0x0807 { address: u64, size: u64, flags: u32 };
    /// `cuMemExportToShareableHandle` of physical allocation `handle` as a
    /// POSIX file descriptor; answers the token (32 bytes) the tenant's
    /// registry keeps the host driver's descriptor under.
    MemExportShareable = 0x0808 { handle: u32 };
    /// `cuMemImportFromShareableHandle` of what a process of the tenant
    /// exported under `token`, as physical allocation `handle`; answers
    /// its size (`u64`).
    MemImportShareable = 0x0809 { handle: u32, token: [u8; 32] };
    /// `cuGraphInstantiateWithFlags`: executable graph `exec` of `graph`.
    GraphInstantiate = 0x0700 { graph: u32, exec: u32, flags: u64 };
    GraphLaunch = 0x0701 { exec: u32, stream: u32 };
    GraphExecDestroy = 0x0702 { exec: u32 };
    GraphDestroy = 0x0703 { graph: u32 };
    /// `cuGraphCreate`: an empty graph, guest handle `graph` (`flags` 0).
    GraphCreate = 0x0704 { graph: u32, flags: u32 };
    /// `cuGraphClone` of `original` as `graph`; the clone's nodes get guest
    /// handles `first_node`, `first_node + 1`... in the order the
    /// original's nodes were added.
    GraphClone = 0x0705 { graph: u32, original: u32, first_node: u32 };
    /// The graph-building commands: node `node` of `graph`, after the
    /// nodes of the same graph in `dependencies` (guest handles).
    GraphAddEmptyNode = 0x0710 { graph: u32, node: u32, dependencies: Vec<u32> };
    /// A kernel node: the launch as `LaunchKernel` carries it (its stream
    /// is 0, unused).
    GraphAddKernelNode = 0x0711 {
        graph: u32,
        node: u32,
        dependencies: Vec<u32>,
        launch: Launch,
    }
        check kernel_node_stream;
    /// A memset node: `height` rows `pitch` bytes apart, each `width`
    /// elements of `element_size` (1, 2 or 4) bytes set to `value`.
    GraphAddMemsetNode = 0x0712 {
        graph: u32,
        node: u32,
        dependencies: Vec<u32>,
        dst: u64,
        value: u32,
        element_size: u32,
        width: u64,
        height: u64,
        pitch: u64,
    }
        check memset_node_element_size;
    /// A memcpy node copying `size` bytes between device memory
    /// (page-locked memory included: its address is a device address).
    GraphAddMemcpyNode = 0x0713 {
        graph: u32,
        node: u32,
        dependencies: Vec<u32>,
        dst: u64,
        src: u64,
        size: u64,
    };
    GraphAddEventRecordNode = 0x0714 { graph: u32, node: u32, dependencies: Vec<u32>, event: u32 };
    GraphAddEventWaitNode = 0x0715 { graph: u32, node: u32, dependencies: Vec<u32>, event: u32 };
    /// A child graph node: a copy of graph `child` as it is now.
    GraphAddChildGraphNode = 0x0716 { graph: u32, node: u32, dependencies: Vec<u32>, child: u32 };
    /// A memory-allocation node: `size` bytes of device memory of the
    /// context's device (the default pool properties, no access beyond
    /// the device's own); answers the allocation's device pointer `u64`.
    GraphAddMemAllocNode = 0x0717 { graph: u32, node: u32, dependencies: Vec<u32>, size: u64 };
    /// A memory-free node of `dptr`, an allocation of a memory-allocation
    /// node of the session.
    GraphAddMemFreeNode = 0x0718 { graph: u32, node: u32, dependencies: Vec<u32>, dptr: u64 };
    /// A memory-operation node (`cuGraphAddBatchMemOpNode` of one
    /// operation): with `wait` 0, writes the low `width` (4 or 8) bytes of
    /// `value` at `address`; with 1, waits until the word there meets
    /// `flags`' condition (`cuStreamWrite/WaitValue` as a node).
    GraphAddMemOpNode = 0x0719 {
        graph: u32,
        node: u32,
        dependencies: Vec<u32>,
        wait: u32,
        width: u32,
        address: u64,
        value: u64,
        flags: u32,
    };
    /// A memcpy node of any shape between device memory (page-locked
    /// memory included).
    GraphAddMemcpy3DNode = 0x071a {
        graph: u32,
        node: u32,
        dependencies: Vec<u32>,
        copy: Copy3D,
    };
    /// `cuGraphKernelNodeSetParams_v2` of kernel node `node` (a launch as
    /// `GraphAddKernelNode` carries it).
    GraphKernelNodeSetParams = 0x0720 { node: u32, launch: Launch }
        check kernel_node_stream;
    /// `cuGraphMemsetNodeSetParams` of memset node `node`.
    GraphMemsetNodeSetParams = 0x0721 {
        node: u32,
        dst: u64,
        value: u32,
        element_size: u32,
        width: u64,
        height: u64,
        pitch: u64,
    }
        check memset_node_element_size;
    /// `cuGraphExecKernelNodeSetParams_v2`: kernel node `node` of the graph
    /// `exec` was instantiated from, in `exec` only.
    GraphExecKernelNodeSetParams = 0x0722 { exec: u32, node: u32, launch: Launch }
        check kernel_node_stream;
    /// `cuGraphAddDependencies`: edges `from[i]` -> `to[i]` (as many of
    /// each) between nodes of `graph`.
    GraphAddDependencies = 0x0726 { graph: u32, from: Vec<u32>, to: Vec<u32> };
    /// `cuGraphRemoveDependencies`: those edges go.
    GraphRemoveDependencies = 0x0727 { graph: u32, from: Vec<u32>, to: Vec<u32> };
    /// `cuGraphDestroyNode`: node `node` leaves its graph, with its edges.
    GraphDestroyNode = 0x0728 { node: u32 };
    /// `cuGraphMemcpyNodeSetParams` of memcpy node `node`.
    GraphMemcpyNodeSetParams = 0x0724 { node: u32, copy: Copy3D };
    /// `cuGraphExecMemcpyNodeSetParams`: as `GraphMemcpyNodeSetParams`, in
    /// executable graph `exec` only.
    GraphExecMemcpyNodeSetParams = 0x0725 { exec: u32, node: u32, copy: Copy3D };
    /// `cuGraphExecMemsetNodeSetParams`: as `GraphMemsetNodeSetParams`, in
    /// `exec` only.
    GraphExecMemsetNodeSetParams = 0x0723 {
        exec: u32,
        node: u32,
        dst: u64,
        value: u32,
        element_size: u32,
        width: u64,
        height: u64,
        pitch: u64,
    }
        check memset_node_element_size;
    /// `cuGraphEventRecordNodeSetEvent` (`wait` 0) or
    /// `cuGraphEventWaitNodeSetEvent` (1) of event node `node`: it records
    /// or waits for `event` from now on.
    GraphEventNodeSetEvent = 0x0729 { node: u32, event: u32, wait: u32 }
        check graph_flags;
    /// `cuGraphExecEventRecordNodeSetEvent` / `...WaitNodeSetEvent`: as
    /// `GraphEventNodeSetEvent`, in executable graph `exec` only.
    GraphExecEventNodeSetEvent = 0x072a { exec: u32, node: u32, event: u32, wait: u32 }
        check graph_flags;
    /// `cuGraphExecChildGraphNodeSetParams`: child graph node `node` of
    /// `exec` runs (the parameters of) graph `child` from now on; the
    /// driver asks for the same topology.
    GraphExecChildGraphNodeSetParams = 0x072b { exec: u32, node: u32, child: u32 };
    /// `cuGraphNodeSetEnabled`: node `node` of `exec` runs (`enabled` 1)
    /// or is skipped (0) in its launches.
    GraphExecNodeSetEnabled = 0x072c { exec: u32, node: u32, enabled: u32 }
        check graph_flags;
    /// `cuGraphNodeGetEnabled`; answers a `u64`, 1 or 0.
    GraphExecNodeGetEnabled = 0x072d { exec: u32, node: u32 };
    /// New parameters of memory-operation node `node` (as
    /// `GraphAddMemOpNode` gives them): where a host node's gate is.
    GraphMemOpNodeSetParams = 0x072e {
        node: u32,
        wait: u32,
        width: u32,
        address: u64,
        value: u64,
        flags: u32,
    }
        check graph_flags;
    /// `cuGraphKernelNodeSetAttribute` of kernel node `node`: one
    /// attribute, as `LaunchKernelEx` carries them (a cluster dimension and
    /// cooperativity among them; no events).
    GraphKernelNodeSetAttribute = 0x0730 { node: u32, attribute: Vec<LaunchAttr> };
    /// `cuGraphKernelNodeGetAttribute`; answers the attribute's 64-byte
    /// value union as the host's driver holds it.
    GraphKernelNodeGetAttribute = 0x0731 { node: u32, id: u32 };
    /// `cuGraphKernelNodeCopyAttributes`: kernel node `dst` takes `src`'s.
    GraphKernelNodeCopyAttributes = 0x0732 { dst: u32, src: u32 };
    /// As `GraphMemOpNodeSetParams`, in executable graph `exec` only.
    GraphExecMemOpNodeSetParams = 0x072f {
        exec: u32,
        node: u32,
        wait: u32,
        width: u32,
        address: u64,
        value: u64,
        flags: u32,
    }
        check graph_flags;
    /// `cuGraphExecUpdate_v2` of `exec` from `graph`; answers the call's
    /// result, the `CUgraphExecUpdateResult` and the guest handle of the
    /// node that failed it (0: none), each a `u64`.
    GraphExecUpdate = 0x0706 { exec: u32, graph: u32 };
    /// `cuGraphUpload` of `exec` on `stream`.
    GraphUpload = 0x0707 { exec: u32, stream: u32 };
    /// `cuGraphGetNodes`' count for `graph` as the host's driver holds it
    /// (a captured graph's nodes are the driver's); answers a `u64`.
    GraphGetNodeCount = 0x0708 { graph: u32 };
    /// `cuGraphGetRootNodes`' count for `graph` as the host's driver holds
    /// it; answers a `u64`.
    GraphGetRootNodeCount = 0x0709 { graph: u32 };
    /// Nodes as the host's driver lists them, which it may have made by
    /// capture: `which` ([`name_nodes`]) says which, of `handle` (a
    /// graph, a capturing stream or a node); a listed node without a guest
    /// handle gets the next of `first_node`.. (at most `room` of them).
    /// Answers `u64`s: the number listed, then for each its guest handle (0:
    /// no room left to name it) and its `CUgraphNodeType`.
    GraphNameNodes = 0x070a { which: u32, handle: u32, first_node: u32, room: u32 };
    /// `cuTensorMapEncodeTiled` / `cuTensorMapEncodeIm2col`: the host's
    /// driver encodes the descriptor (its layout is the driver's own);
    /// answers its [`TENSOR_MAP_BYTES`] bytes.
    TensorMapEncode = 0x0a00 { spec: Box<TensorMapSpec> };
    /// `cuTensorMapReplaceAddress`: answers `map` with its global address
    /// replaced by the host's driver.
    TensorMapReplaceAddress = 0x0a01 { map: Box<[u8; TENSOR_MAP_BYTES]>, address: u64 };
    /// `cuIpcGetMemHandle` of device memory of the guest process (it must
    /// lie in one of its `cuMemAlloc` allocations); answers the driver's
    /// 64-byte handle, which the tenant's registry records.
    IpcGetMemHandle = 0x0900 { device_ptr: u64 };
    /// `cuIpcOpenMemHandle_v2` of a handle another process of the tenant
    /// exported (any other is refused with `CUDA_ERROR_INVALID_HANDLE`
    /// before the driver sees it); answers the device pointer `u64` and
    /// the mapping's size `u64`.
    IpcOpenMemHandle = 0x0901 { handle: IpcHandle, flags: u32 };
    /// `cuIpcCloseMemHandle` of a pointer `IpcOpenMemHandle` answered.
    IpcCloseMemHandle = 0x0902 { device_ptr: u64 };
    /// `cuIpcGetEventHandle` of event `event`; answers the 64-byte handle.
    IpcGetEventHandle = 0x0903 { event: u32 };
    /// `cuIpcOpenEventHandle` of a handle another process of the tenant
    /// exported; the event gets guest handle `event`.
    IpcOpenEventHandle = 0x0904 { event: u32, handle: IpcHandle };
}

impl Command {
    /// The stream a command puts work on the GPU on (a kernel, a copy, a
    /// memset), if it does.
    pub fn work_stream(&self) -> Option<u32> {
        match self {
            Command::LaunchKernel { launch } | Command::LaunchKernelEx { launch, .. } => {
                Some(launch.stream)
            }
            Command::GraphLaunch { stream, .. } => Some(*stream),
            Command::MemcpyHtoD { stream, .. }
            | Command::MemcpyDtoH { stream, .. }
            | Command::MemcpyDtoD { stream, .. }
            | Command::Memset { stream, .. } => Some(*stream),
            _ => None,
        }
    }

    /// The events a command records: an event record's, and the events a
    /// launch's attributes record (programmatic and completion events).
    pub fn events_recorded(&self) -> Vec<u32> {
        match self {
            Command::EventRecord { event, .. } => vec![*event],
            Command::LaunchKernelEx { attributes, .. } => attributes
                .iter()
                .filter(|a| {
                    matches!(
                        a.id,
                        launch_attribute::PROGRAMMATIC_EVENT
                            | launch_attribute::LAUNCH_COMPLETION_EVENT
                    )
                })
                .map(|a| a.value[0] as u32)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The stream whose queue a command extends: its work stream, the
    /// stream an event is recorded on or made to wait, and one a memory
    /// operation or a graph's upload is queued on (a query must not answer
    /// complete before they are; they are not work the scheduler meters:
    /// a wait for a word holds no GPU time).
    pub fn queued_on(&self) -> Option<u32> {
        match self {
            Command::EventRecord { stream, .. }
            | Command::StreamWaitEvent { stream, .. }
            | Command::StreamWriteValue { stream, .. }
            | Command::StreamWaitValue { stream, .. }
            | Command::GraphUpload { stream, .. } => Some(*stream),
            other => other.work_stream(),
        }
    }
}

/// A decoded command (of the ring unless said) and the reply number it
/// asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded<C = Command> {
    pub reply_seq: u64,
    pub command: C,
    /// Bytes the command occupies including padding.
    pub wire_len: usize,
}

// A command moves through the worker by value several times (decoded,
// wrapped, matched): up to 128 bytes a move is a few inline stores, past
// it a `memcpy` call. Rare large fields are boxed to stay under it.
const _: () = assert!(std::mem::size_of::<Decoded>() <= 128);

/// Decodes the ring command at the start of `bytes`.
pub fn decode_one(bytes: &[u8]) -> Result<Decoded, DecodeError> {
    decode_one_of(bytes)
}

/// Decodes the command of table `C` at the start of `bytes`.
pub fn decode_one_of<C: WireCommand>(bytes: &[u8]) -> Result<Decoded<C>, DecodeError> {
    let header = CommandHeader::decode(bytes)?;
    let body_end = COMMAND_HEADER_SIZE + header.body_len as usize;
    let body = bytes
        .get(COMMAND_HEADER_SIZE..body_end)
        .ok_or(DecodeError::Truncated {
            offset: COMMAND_HEADER_SIZE,
            needed: header.body_len as usize,
            available: bytes.len().saturating_sub(COMMAND_HEADER_SIZE),
        })?;
    let command = C::decode_body(header.opcode, body)?;
    Ok(Decoded {
        reply_seq: header.reply_seq,
        command,
        wire_len: header.padded_len().min(bytes.len().max(body_end)),
    })
}

/// Iterates over a buffer of back-to-back commands of table `C` (a
/// SUBMIT_3D payload). Stops at the first error, which it yields.
pub fn decode_all<C: WireCommand>(
    bytes: &[u8],
) -> impl Iterator<Item = Result<Decoded<C>, DecodeError>> + '_ {
    let mut offset = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || offset >= bytes.len() {
            return None;
        }
        let rest = bytes.get(offset..)?;
        match decode_one_of::<C>(rest) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_spans_from_its_first_byte_to_its_last() {
        let side = |address, pitch, rows| PitchedSide {
            address,
            pitch,
            rows,
        };
        // Two slices of three rows of 10 bytes; the source's slices are 4
        // rows of 16 bytes apart.
        let copy = Copy3D {
            dst: side(0x1000, 10, 3),
            src: side(0x2000, 16, 4),
            width: 10,
            height: 3,
            depth: 2,
        };
        assert!(copy.is_well_formed());
        assert_eq!(copy.span(&copy.dst), Some(60));
        assert_eq!(copy.span(&copy.src), Some((4 + 2) * 16 + 10));
        assert_eq!(copy.src.row_start(1, 1), Some(0x2000 + 5 * 16));
        assert_eq!(
            Copy3D::linear(1, 2, 77).span(&PitchedSide {
                address: 1,
                pitch: 77,
                rows: 1
            }),
            Some(77)
        );
        // Rows that overlap, slices that do, an empty copy, an overflow.
        assert!(!Copy3D {
            dst: side(0, 9, 3),
            ..copy
        }
        .is_well_formed());
        assert!(!Copy3D {
            src: side(0, 16, 2),
            ..copy
        }
        .is_well_formed());
        assert!(!Copy3D { width: 0, ..copy }.is_well_formed());
        assert_eq!(Copy3D { depth: 0, ..copy }.span(&copy.dst), None);
        let far = Copy3D {
            dst: side(u64::MAX - 8, 10, 3),
            ..copy
        };
        assert_eq!(far.span(&far.dst), None);
    }
}
