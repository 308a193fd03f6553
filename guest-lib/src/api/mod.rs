//! The hand-written driver API, one module per idea; `crate::exports`
//! declares which function answers which exported symbol.

pub mod context;
pub mod device;
pub mod error;
pub mod event;
pub mod export_table;
pub mod init;
pub mod launch;
pub mod library;
pub mod memory;
pub mod module;
pub mod primary_context;
pub mod proc_address;
pub mod stream;
