//! The yardstick of the network carrier's copy rows: the same bytes over a
//! plain TLS 1.3 loopback stream (rustls, ring, mutual authentication, as
//! the carrier uses), in the carrier's piece size, each way.
//!
//!   tls_loopback_bench \[MIB]      (default 256)
//!
//! Prints "tls loopback MIB MiB: client->server A GB/s, server->client B
//! GB/s" (best of three).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

const PIECE: usize = rgpu_proto::remote::MAX_DATA_PIECE;

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(256);
    let total = mib << 20;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "bench CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let leaf = |name: &str, sans: Vec<String>| {
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        (
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    };
    let (server_chain, server_key) = leaf("server", vec!["localhost".into()]);
    let (client_chain, client_key) = leaf("client", Vec::new());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca.der().to_vec())).unwrap();
    let roots = Arc::new(roots);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server_config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(server_chain, server_key)
            .unwrap(),
    );
    let client_config = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(client_chain, client_key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        socket.set_nodelay(true).unwrap();
        let connection = rustls::ServerConnection::new(server_config).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, socket);
        let mut piece = vec![0u8; PIECE];
        for _ in 0..3 {
            // Receive `total`, acknowledge, then send `total`.
            let mut left = total;
            while left > 0 {
                let n = tls.read(&mut piece[..left.min(PIECE)]).unwrap();
                assert!(n > 0);
                left -= n;
            }
            tls.write_all(&[1]).unwrap();
            tls.flush().unwrap();
            for _ in 0..total / PIECE {
                tls.write_all(&piece).unwrap();
            }
            tls.flush().unwrap();
        }
    });
    let socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket.set_nodelay(true).unwrap();
    let connection =
        rustls::ClientConnection::new(client_config, ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut tls = rustls::StreamOwned::new(connection, socket);
    let piece = vec![7u8; PIECE];
    let mut buffer = vec![0u8; PIECE];
    let (mut best_up, mut best_down) = (0f64, 0f64);
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..total / PIECE {
            tls.write_all(&piece).unwrap();
        }
        tls.flush().unwrap();
        let mut ack = [0u8; 1];
        tls.read_exact(&mut ack).unwrap();
        best_up = best_up.max(total as f64 / start.elapsed().as_secs_f64() / 1e9);
        let start = Instant::now();
        let mut left = total;
        while left > 0 {
            let n = tls.read(&mut buffer[..left.min(PIECE)]).unwrap();
            assert!(n > 0);
            left -= n;
        }
        best_down = best_down.max(total as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    server.join().unwrap();
    println!(
        "tls loopback {mib} MiB: client->server {best_up:.2} GB/s, server->client {best_down:.2} GB/s"
    );
}
