//! Remote clients (`--listen`, a tenant's `listen`): the network carrier's
//! daemon side (ARCHITECTURE.md §6.3).
//!
//! Tokio accepts connections and runs the TLS handshake (bounded in time,
//! so a client that stalls costs a task, not a thread). An authenticated
//! connection then moves to a thread of its own ([`gateway`]): each of its
//! requests ends in a wait on the host's shared-memory ring, which a
//! blocking thread does without a hop between threads.
//!
//! Who a client is: its certificate's name ([`tls::identity`]) is its
//! tenant's name on the daemon's `--listen`; on a tenant's own `listen` it
//! must be that tenant's name; a daemon with one tenant and no config file
//! serves every client its client CA vouches for. Plaintext (`tcp://`)
//! clients are served only where `--allow-plaintext` says so, and only on
//! a listener that belongs to one tenant. Refusals happen before any CUDA
//! work, and both sides are told why.

pub mod gateway;
pub mod lanes;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use log::info;
use rgpu_proto::remote::Response;
use rgpu_transport::carrier::remote::SpinningSocket;
use tokio::io::AsyncWriteExt;

use crate::tenants::Tenants;
use gateway::{Accepted, Gateway, HELLO_TIMEOUT};

/// Whose clients a listener serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The certificate's name is the tenant's (the daemon's `--listen`
    /// with a config file).
    Named,
    /// One tenant's own `listen`: the certificate must name it.
    Tenant(String),
    /// The daemon's only tenant (no config file): any client the client CA
    /// vouches for.
    Only(String),
}

/// One listening address.
#[derive(Clone)]
pub struct ListenerConfig {
    pub address: SocketAddr,
    /// `None`: plaintext only.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Also serve plaintext (`tcp://`) clients.
    pub allow_plaintext: bool,
    pub admission: Admission,
    /// How long a connection's thread polls for the next request before it
    /// sleeps (`--host-spin-us`, as a session's host thread polls its ring).
    pub spin: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("--listen {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the remote listener: {0}")]
    Start(std::io::Error),
}

/// The running listeners (they stop with the process).
pub struct RemoteServer {
    pub addresses: Vec<SocketAddr>,
}

/// Binds every listener and serves them from a thread of their own.
pub fn serve(
    listeners: Vec<ListenerConfig>,
    tenants: &Arc<Tenants>,
) -> Result<RemoteServer, RemoteError> {
    let gateway = Gateway::new(Arc::downgrade(tenants));
    let mut bound = Vec::new();
    for config in listeners {
        let listener =
            std::net::TcpListener::bind(config.address).map_err(|source| RemoteError::Bind {
                address: config.address,
                source,
            })?;
        listener.set_nonblocking(true).map_err(RemoteError::Start)?;
        let address = listener.local_addr().map_err(RemoteError::Start)?;
        info!(
            "remote clients on {address} ({}{})",
            if config.tls.is_some() {
                "TLS"
            } else {
                "plaintext"
            },
            if config.tls.is_some() && config.allow_plaintext {
                " and plaintext"
            } else {
                ""
            }
        );
        bound.push((listener, address, Arc::new(config)));
    }
    let addresses = bound.iter().map(|(_, address, _)| *address).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RemoteError::Start)?;
    std::thread::Builder::new()
        .name("rgpu-remote".into())
        .spawn(move || {
            runtime.block_on(async move {
                let permits = Arc::new(tokio::sync::Semaphore::new(MAX_REMOTE_CONNECTIONS));
                let mut loops = Vec::new();
                for (listener, _, config) in bound {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => loops.push(tokio::spawn(accept_loop(
                            listener,
                            config,
                            Arc::clone(&gateway),
                            Arc::clone(&permits),
                        ))),
                        Err(e) => log::error!("remote listener: {e}"),
                    }
                }
                for accept in loops {
                    let _ = accept.await;
                }
            })
        })
        .map_err(RemoteError::Start)?;
    Ok(RemoteServer { addresses })
}

/// Remote connections served at once, on every listener together (each
/// costs a thread, and a channel's buffers of up to a frame): past it, new
/// ones are closed at once.
pub const MAX_REMOTE_CONNECTIONS: usize = 1024;

async fn accept_loop(
    listener: tokio::net::TcpListener,
    config: Arc<ListenerConfig>,
    gateway: Arc<Gateway>,
    permits: Arc<tokio::sync::Semaphore>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    rgpu_session::warn_limited!(
                        "remote {peer}: refused: {MAX_REMOTE_CONNECTIONS} remote connections already"
                    );
                    continue;
                };
                tokio::spawn(admit(
                    stream,
                    peer,
                    Arc::clone(&config),
                    Arc::clone(&gateway),
                    permit,
                ));
            }
            Err(e) => {
                rgpu_session::warn_limited!("remote listener: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Tells a plaintext client why it is refused, and closes.
async fn refuse_plaintext(mut stream: tokio::net::TcpStream, peer: SocketAddr, reason: &str) {
    rgpu_session::warn_limited!("remote {peer}: refused: {reason}");
    let frame = Response::Refused {
        reason: reason.to_owned(),
    }
    .encode();
    let _ = tokio::time::timeout(HELLO_TIMEOUT, stream.write_all(&frame)).await;
    let _ = stream.shutdown().await;
}

/// The tenant of a client whose certificate names `identity`.
fn tenant_of(admission: &Admission, identity: Option<String>) -> Result<String, String> {
    let identity =
        identity.ok_or("the client certificate names nobody (no common name or DNS name)");
    match admission {
        Admission::Only(tenant) => Ok(tenant.clone()),
        Admission::Named => identity.map_err(str::to_owned),
        Admission::Tenant(tenant) => match identity? {
            name if name == *tenant => Ok(name),
            name => Err(format!(
                "the client certificate names {name:?}, this listener serves tenant {tenant:?}"
            )),
        },
    }
}

/// Takes a new connection: TLS or plaintext by its first byte, then the
/// handshake and the tenant, then a thread of its own.
async fn admit(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    config: Arc<ListenerConfig>,
    gateway: Arc<Gateway>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    match tokio::time::timeout(HELLO_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return,
    }
    // A TLS connection starts with a handshake record.
    let accepted = if first[0] == 0x16 {
        let Some(tls) = &config.tls else {
            return refuse_plaintext(
                stream,
                peer,
                "this listener speaks plaintext (tcp://), not TLS",
            )
            .await;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(tls));
        let tls_stream = match tokio::time::timeout(HELLO_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(tls_stream)) => tls_stream,
            Ok(Err(e)) => {
                rgpu_session::warn_limited!("remote {peer}: refused: TLS handshake: {e}");
                return;
            }
            Err(_) => {
                rgpu_session::warn_limited!("remote {peer}: refused: TLS handshake timed out");
                return;
            }
        };
        let identity = tls_stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(tls::identity);
        let tenant = tenant_of(&config.admission, identity);
        let (tcp, connection) = tls_stream.into_inner();
        let Some(socket) = blocking(tcp) else { return };
        let Ok(clone) = socket.try_clone() else {
            return;
        };
        let socket = SpinningSocket::new(socket, config.spin);
        (
            Box::new(rustls::StreamOwned::new(connection, socket)) as Box<dyn gateway::ReadWrite>,
            clone,
            tenant,
        )
    } else {
        if !config.allow_plaintext || config.tls.is_some() && config.admission == Admission::Named {
            let reason = if config.allow_plaintext {
                "plaintext clients cannot say which tenant they are: give the tenant a listen \
                 address of its own"
            } else {
                "this daemon requires TLS: connect with tls://HOST:PORT and a client certificate"
            };
            return refuse_plaintext(stream, peer, reason).await;
        }
        let tenant = match &config.admission {
            Admission::Only(tenant) | Admission::Tenant(tenant) => Ok(tenant.clone()),
            Admission::Named => Err("plaintext clients cannot say which tenant they are".into()),
        };
        let Some(socket) = blocking(stream) else {
            return;
        };
        let Ok(clone) = socket.try_clone() else {
            return;
        };
        (
            Box::new(socket) as Box<dyn gateway::ReadWrite>,
            clone,
            tenant,
        )
    };
    let (io, socket, tenant) = accepted;
    let accepted = Accepted {
        io,
        socket,
        tenant,
        peer: peer.to_string(),
    };
    let spawned = std::thread::Builder::new()
        .name("rgpu-remote-conn".into())
        .spawn(move || {
            gateway.serve(accepted);
            drop(permit);
        });
    if let Err(e) = spawned {
        rgpu_session::warn_limited!("remote {peer}: no thread to serve it: {e}");
    }
}

/// The socket as a blocking std one (the gateway's threads block on it).
fn blocking(stream: tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    let socket = stream.into_std().ok()?;
    socket.set_nonblocking(false).ok()?;
    Some(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_name_tenants_as_each_listener_says() {
        let named = Admission::Named;
        assert_eq!(tenant_of(&named, Some("vm1".into())), Ok("vm1".into()));
        assert!(tenant_of(&named, None).is_err());
        let own = Admission::Tenant("vm1".into());
        assert_eq!(tenant_of(&own, Some("vm1".into())), Ok("vm1".into()));
        let err = tenant_of(&own, Some("vm2".into())).unwrap_err();
        assert!(err.contains("serves tenant \"vm1\""), "{err}");
        let only = Admission::Only("default".into());
        assert_eq!(
            tenant_of(&only, Some("anyone".into())),
            Ok("default".into())
        );
    }
}
