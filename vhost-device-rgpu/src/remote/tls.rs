//! The daemon's TLS side (`--tls-cert`, `--tls-key`, `--tls-client-ca`):
//! TLS 1.3 only, and every client must show a certificate that the client
//! CA signed and that is valid now. Its subject's common name (or, without
//! one, its first DNS name) says who the client is.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{option} {path}: {reason}")]
    File {
        option: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS server configuration: {0}")]
    Config(String),
}

fn file_error(option: &'static str, path: &Path, reason: impl ToString) -> TlsSetupError {
    TlsSetupError::File {
        option,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn certificates(
    option: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(option, path, e))?;
    if certificates.is_empty() {
        return Err(file_error(option, path, "no certificate in the file"));
    }
    Ok(certificates)
}

/// The server configuration: `cert` and `key` are the daemon's, clients are
/// checked against `client_ca`.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates("--tls-client-ca", client_ca)? {
        roots
            .add(certificate)
            .map_err(|e| file_error("--tls-client-ca", client_ca, e))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsSetupError::Config(e.to_string()))?;
    let chain = certificates("--tls-cert", cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("--tls-key", key, e))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsSetupError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsSetupError::Config(format!("--tls-cert and --tls-key: {e}")))?;
    Ok(Arc::new(config))
}

/// Who a verified client certificate names: its subject's common name, or
/// its first DNS name.
pub fn identity(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    if let Some(name) = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
    {
        return Some(name.to_owned());
    }
    let names = parsed.subject_alternative_name().ok()??;
    names
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
}
