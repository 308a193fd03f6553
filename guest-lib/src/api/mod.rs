//! The hand-written driver API, one module per idea; `crate::exports`
//! declares which function answers which exported symbol.

pub mod context;
pub mod copy_2d;
pub mod device;
pub mod error;
pub mod event;
pub mod export_table;
pub mod function;
pub mod graph;
pub mod host_register;
pub mod init;
pub mod ipc;
pub mod launch;
pub mod library;
pub mod memory;
pub mod memory_pool;
pub mod module;
pub mod occupancy;
pub mod peer;
pub mod pointer;
pub mod primary_context;
pub mod proc_address;
pub mod stream;
pub mod stream_ordered;
pub mod tensor_map;
pub mod unified_copy;
pub mod vmm;
