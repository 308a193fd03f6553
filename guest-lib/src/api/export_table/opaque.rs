//! Tables whose slots are all unknown: only their size is known, from
//! what driver 580 handed out (`shared/cuda-driver-requests.txt`). Static
//! cudart asks for F8CFF951 before `cuInit`; PyTorch for 69A28E9F; CuPy and
//! Triton for DA9151D3. Every slot reports itself when called, so the GPU
//! host's logs say which ones matter.
//!
//! PyTorch 2.11 calls 69A28E9F slots 24, 19 and 25 during `torch.cuda`
//! initialisation. No public reimplementation describes them, so they stay
//! unknown. What the H200 log shows: slot 24 gets a pointer into a
//! library's data and then 0x81, 0x7fffffff and a libc text address, which
//! are what a futex wake (FUTEX_WAKE_PRIVATE, wake all) leaves in rsi, rdx
//! and rcx: most likely a one-argument function called right after a
//! `call_once` or mutex unlock. Slot 25 gets the same object + 0x10, then
//! 0, 1, 0; slot 19 two adjacent stack addresses (two out-values).

use super::{unknown_slot, Slot, CUPY_DA9151D3, F8CFF951, TORCH_69A28E9F};

pub static F8CFF951_TABLE: [Slot; 3] = [
    Slot::size(3),
    unknown_slot!(F8CFF951, 1),
    unknown_slot!(F8CFF951, 2),
];

pub static TORCH_TABLE: [Slot; 34] = [
    Slot::size(34),
    unknown_slot!(TORCH_69A28E9F, 1),
    unknown_slot!(TORCH_69A28E9F, 2),
    unknown_slot!(TORCH_69A28E9F, 3),
    unknown_slot!(TORCH_69A28E9F, 4),
    unknown_slot!(TORCH_69A28E9F, 5),
    unknown_slot!(TORCH_69A28E9F, 6),
    unknown_slot!(TORCH_69A28E9F, 7),
    unknown_slot!(TORCH_69A28E9F, 8),
    unknown_slot!(TORCH_69A28E9F, 9),
    unknown_slot!(TORCH_69A28E9F, 10),
    unknown_slot!(TORCH_69A28E9F, 11),
    unknown_slot!(TORCH_69A28E9F, 12),
    unknown_slot!(TORCH_69A28E9F, 13),
    unknown_slot!(TORCH_69A28E9F, 14),
    unknown_slot!(TORCH_69A28E9F, 15),
    unknown_slot!(TORCH_69A28E9F, 16),
    unknown_slot!(TORCH_69A28E9F, 17),
    unknown_slot!(TORCH_69A28E9F, 18),
    unknown_slot!(TORCH_69A28E9F, 19),
    unknown_slot!(TORCH_69A28E9F, 20),
    unknown_slot!(TORCH_69A28E9F, 21),
    unknown_slot!(TORCH_69A28E9F, 22),
    unknown_slot!(TORCH_69A28E9F, 23),
    unknown_slot!(TORCH_69A28E9F, 24),
    unknown_slot!(TORCH_69A28E9F, 25),
    unknown_slot!(TORCH_69A28E9F, 26),
    unknown_slot!(TORCH_69A28E9F, 27),
    unknown_slot!(TORCH_69A28E9F, 28),
    unknown_slot!(TORCH_69A28E9F, 29),
    unknown_slot!(TORCH_69A28E9F, 30),
    unknown_slot!(TORCH_69A28E9F, 31),
    unknown_slot!(TORCH_69A28E9F, 32),
    unknown_slot!(TORCH_69A28E9F, 33),
];

pub static CUPY_TABLE: [Slot; 7] = [
    Slot::size(7),
    unknown_slot!(CUPY_DA9151D3, 1),
    unknown_slot!(CUPY_DA9151D3, 2),
    unknown_slot!(CUPY_DA9151D3, 3),
    unknown_slot!(CUPY_DA9151D3, 4),
    unknown_slot!(CUPY_DA9151D3, 5),
    unknown_slot!(CUPY_DA9151D3, 6),
];
