//! vhost-device-rgpu: the host daemon of rgpu (ARCHITECTURE.md §5).
//!
//! A vhost-user backend of a compute-only virtio-gpu device that offers the
//! rgpu CUDA context type. Each vhost-user connection is served by a process
//! of its own, which [`supervisor`] (the parent process) starts, reaps and
//! sums the counters of ([`shared_counters`]); in that process, one
//! [`virtio_gpu::GpuBackend`] (and device model) serves the connection and
//! [`daemon`] serves it and tears it down when its frontend goes away;
//! [`gate`] (in the parent) accepts connections and holds each until its
//! frontend speaks, [`handoff`] passes it to its process and relays it
//! there; [`socket`] creates or inherits the listening socket; [`signals`]
//! cleans up on SIGINT/SIGTERM; [`stats`] answers the optional stats socket,
//! [`metrics`] the optional Prometheus endpoint (which [`top`] reads).
//!
//! The parent serves any number of tenants ([`tenants`]: one socket, one
//! supervisor and one memory budget each), declared in a TOML file
//! ([`config`]) or given by `--socket-path` alone; [`control`] answers the
//! control socket, through which [`ctl`] lists and changes them live.
//! [`scheduler`] grants tenants their turns on the GPU through their
//! tenant pages ([`tenant_page`]). [`remote`] serves clients over TCP with
//! mutual TLS, as local clients of their tenants.

pub mod config;
pub mod control;
pub mod ctl;
pub mod daemon;
pub mod gate;
pub mod handoff;
pub mod limits;
pub mod metrics;
pub mod remote;
pub mod scheduler;
pub mod shareable_broker;
pub mod shared_counters;
pub mod shared_page;
pub mod signals;
pub mod socket;
pub mod stats;
pub mod supervisor;
pub mod tenant_page;
pub mod tenants;
pub mod top;
pub mod virtio_gpu;
pub mod worker_process;
