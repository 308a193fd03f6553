//! Certificates for the network carrier's tests, made fresh by each test
//! (rcgen): a CA, the daemon's certificate, and clients good and bad.

use std::path::{Path, PathBuf};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::TempDir;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA that signs the daemon's and clients' certificates.
pub struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    /// The CA certificate (PEM).
    pub cert: PathBuf,
    dir: PathBuf,
}

impl TestCa {
    /// A new CA named `name`, its files in `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&path, cert.pem()).unwrap();
        Self {
            params,
            key,
            cert: path,
            dir: dir.to_path_buf(),
        }
    }

    fn sign(&self, file: &str, params: CertificateParams) -> CertFiles {
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    /// The daemon's certificate, for `localhost` and 127.0.0.1.
    pub fn server(&self) -> CertFiles {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "rgpu daemon");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign("server", params)
    }

    /// A client certificate whose common name is `name`; `expired`: valid
    /// only in 2020.
    pub fn client(&self, name: &str, expired: bool) -> CertFiles {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2020, 12, 31);
        }
        let file = format!("client-{name}{}", if expired { "-expired" } else { "" });
        self.sign(&file, params)
    }
}

/// A CA with the daemon's certificate, in a temp dir of its own.
pub struct TestPki {
    pub ca: TestCa,
    pub server: CertFiles,
    _dir: TempDir,
}

impl TestPki {
    pub fn new() -> Self {
        let dir = TempDir::new("rgpu-pki").unwrap();
        let ca = TestCa::new(dir.path(), "rgpu-test");
        let server = ca.server();
        Self {
            ca,
            server,
            _dir: dir,
        }
    }

    /// Another CA in the same dir (its clients are strangers to the daemon).
    pub fn other_ca(&self, name: &str) -> TestCa {
        let dir = self.ca.cert.parent().unwrap_or(Path::new("."));
        TestCa::new(dir, name)
    }

    /// The daemon options that serve remote clients on `listen` with this
    /// PKI.
    pub fn daemon_args(&self, listen: &str) -> Vec<String> {
        vec![
            "--listen".into(),
            listen.into(),
            "--tls-cert".into(),
            self.server.cert.display().to_string(),
            "--tls-key".into(),
            self.server.key.display().to_string(),
            "--tls-client-ca".into(),
            self.ca.cert.display().to_string(),
        ]
    }

    /// A client's environment: this PKI's CA, and `client` if given.
    pub fn client_env(&self, client: Option<&CertFiles>) -> Vec<(String, String)> {
        let mut env = vec![("RGPU_TLS_CA".into(), self.ca.cert.display().to_string())];
        if let Some(client) = client {
            env.push(("RGPU_TLS_CERT".into(), client.cert.display().to_string()));
            env.push(("RGPU_TLS_KEY".into(), client.key.display().to_string()));
        }
        env
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
