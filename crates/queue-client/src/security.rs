//! How a client reaches kjob-queue: mTLS with its role's certificate over `https://`, or
//! plaintext over `http://` only when asked for by name (`--insecure-no-auth`, development).

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::ClientError;

/// What a client proves and checks when it connects to kjob-queue.
#[derive(Clone, Debug)]
pub enum QueueSecurity {
    /// mTLS: kjob-queue's certificate must be signed by `ca`; this client presents `cert`
    /// (its role is the certificate's CN) with `key`. All PEM.
    Tls {
        /// The kjob CA certificate.
        ca: Vec<u8>,
        /// This client's certificate.
        cert: Vec<u8>,
        /// This client's private key.
        key: Vec<u8>,
    },
    /// Plaintext and no identity: only a kjob-queue run with `--insecure-no-auth` answers.
    Insecure,
}

impl QueueSecurity {
    /// The TLS settings of an `https://` endpoint; an error when they do not fit `url`.
    pub(crate) fn tls_for(&self, url: &str) -> Result<Option<ClientTlsConfig>, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        match (self, url.starts_with("https://")) {
            (QueueSecurity::Tls { ca, cert, key }, true) => Ok(Some(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .identity(Identity::from_pem(cert, key)),
            )),
            (QueueSecurity::Tls { .. }, false) => {
                Err(invalid("TLS settings are given, so the queue URL must be https://"))
            }
            (QueueSecurity::Insecure, true) => Err(invalid(
                "an https:// queue needs --queue-ca-file, --queue-cert-file and --queue-key-file",
            )),
            (QueueSecurity::Insecure, false) => Ok(None),
        }
    }
}

/// The flags of every kjob-queue client binary (kjob-watcher, kjob-worker, `kjob-queue
/// inspect`), each with an `env` twin.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct QueueTlsArgs {
    /// The kjob CA certificate (PEM) that signed kjob-queue's certificate (https:// queue URLs).
    #[arg(long, env = "KJOB_QUEUE_CA_FILE")]
    pub queue_ca_file: Option<PathBuf>,
    /// This client's certificate (PEM); its subject CN is its role (https:// queue URLs).
    #[arg(long, env = "KJOB_QUEUE_CERT_FILE")]
    pub queue_cert_file: Option<PathBuf>,
    /// This client's private key (PEM) (https:// queue URLs).
    #[arg(long, env = "KJOB_QUEUE_KEY_FILE")]
    pub queue_key_file: Option<PathBuf>,
    /// Development only: allow an http:// queue URL (plaintext, no identity), for a kjob-queue
    /// run with --insecure-no-auth.
    #[arg(long, env = "KJOB_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
}

impl QueueTlsArgs {
    /// Plaintext to an `http://` kjob-queue run with `--insecure-no-auth` (tests, the demo).
    pub fn insecure() -> Self {
        Self { insecure_no_auth: true, ..Self::default() }
    }

    /// mTLS with the certificates in these files.
    pub fn tls(ca: &Path, cert: &Path, key: &Path) -> Self {
        Self {
            queue_ca_file: Some(ca.to_path_buf()),
            queue_cert_file: Some(cert.to_path_buf()),
            queue_key_file: Some(key.to_path_buf()),
            insecure_no_auth: false,
        }
    }

    /// The security these flags give for `url`, reading the files; the error says in one line
    /// what is missing.
    pub fn security(&self, url: &str) -> Result<QueueSecurity, ClientError> {
        let refuse = |reason: String| ClientError::InvalidUrl { url: url.to_string(), reason };
        let files = [&self.queue_ca_file, &self.queue_cert_file, &self.queue_key_file];
        if url.starts_with("https://") {
            let [Some(ca), Some(cert), Some(key)] = files else {
                return Err(refuse(
                    "an https:// queue needs all of --queue-ca-file, --queue-cert-file and \
                     --queue-key-file"
                        .into(),
                ));
            };
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|e| refuse(format!("reading {}: {e}", p.display())))
            };
            return Ok(QueueSecurity::Tls { ca: read(ca)?, cert: read(cert)?, key: read(key)? });
        }
        if !self.insecure_no_auth {
            return Err(refuse(
                "refusing a plaintext http:// queue: use https:// with --queue-ca-file, \
                 --queue-cert-file and --queue-key-file, or pass --insecure-no-auth (development only)"
                    .into(),
            ));
        }
        if files.iter().any(|f| f.is_some()) {
            return Err(refuse(
                "certificate files are given, so the queue URL must be https://".into(),
            ));
        }
        Ok(QueueSecurity::Insecure)
    }

    /// A client of `url` secured as these flags say (see [`crate::QueueClient::connect_lazy_with`]).
    pub fn connect_lazy(&self, url: &str) -> Result<crate::QueueClient, ClientError> {
        crate::QueueClient::connect_lazy_with(url, &self.security(url)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_when_asked_for_and_https_only_with_every_file() {
        let http = "http://127.0.0.1:1";
        let https = "https://127.0.0.1:1";
        let err = QueueTlsArgs::default().security(http).unwrap_err().to_string();
        assert!(err.contains("--insecure-no-auth") && !err.contains('\n'), "{err}");
        assert!(matches!(QueueTlsArgs::insecure().security(http), Ok(QueueSecurity::Insecure)));
        let err = QueueTlsArgs::insecure().security(https).unwrap_err().to_string();
        assert!(err.contains("--queue-ca-file"), "{err}");
        let p = Path::new("/nonexistent/kjob");
        let err = QueueTlsArgs::tls(p, p, p).security(https).unwrap_err().to_string();
        assert!(err.contains("reading /nonexistent/kjob"), "{err}");
        let mut with_files = QueueTlsArgs::tls(p, p, p);
        with_files.insecure_no_auth = true;
        assert!(with_files.security(http).is_err());
        assert!(QueueSecurity::Insecure.tls_for(https).is_err());
    }
}
