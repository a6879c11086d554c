//! Test certificates made at test time with rcgen (no openssl binary): a CA, a server
//! certificate for `127.0.0.1` / `localhost` and a client certificate, as PEM files in a
//! temporary directory that lives as long as the value.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A test CA and the certificates it signed, written as PEM files.
#[derive(Debug)]
pub struct TestPki {
    dir: tempfile::TempDir,
}

impl TestPki {
    /// Makes a fresh CA (named `name` in its subject) and a server and a client certificate.
    pub fn generate(name: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
        std::fs::write(dir.path().join("ca.crt"), ca.pem())?;
        for (who, sans, usage) in [
            (
                "server",
                vec!["127.0.0.1".to_string(), "localhost".into()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            ("client", vec!["kjob-queue".to_string()], ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = KeyPair::generate()?;
            let mut p = CertificateParams::new(sans)?;
            p.distinguished_name.push(DnType::CommonName, format!("{name} {who}"));
            p.extended_key_usages = vec![usage];
            p.key_usages =
                vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            let cert = p.signed_by(&key, &ca)?;
            std::fs::write(dir.path().join(format!("{who}.crt")), cert.pem())?;
            std::fs::write(dir.path().join(format!("{who}.key")), key.serialize_pem())?;
        }
        Ok(Self { dir })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server certificate (SANs `127.0.0.1`, `localhost`).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server certificate's key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The client certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.crt")
    }

    /// The client certificate's key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }
}
