//! `kjob-queue certs`: a kjob CA and the certificates of kjob-queue (serving) and of each role
//! (client: `kjob-watcher`, `kjob-worker`, `kjob-inspector`), for clusters without
//! cert-manager and for tests. The same layout as cert-manager's Secrets: `tls.crt`,
//! `tls.key` and `ca.crt` per Secret.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::auth::Role;

/// The CA lives long; rotating it means new certificates for every component at once.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Leaf certificates last a year: run `kjob-queue certs` again (or let cert-manager renew).
const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Subject CN of kjob-queue's serving certificate (clients check its SANs, not this).
pub const SERVER_CN: &str = "kjob-queue";

/// The names kjob-queue is reached by in deploy/ (Service `kjob-queue` in `kjob-system`) and
/// on one machine (docker-compose, tests).
pub const DEFAULT_HOSTS: [&str; 6] = [
    "kjob-queue",
    "kjob-queue.kjob-system",
    "kjob-queue.kjob-system.svc",
    "kjob-queue.kjob-system.svc.cluster.local",
    "localhost",
    "127.0.0.1",
];

/// A certificate with its private key.
#[derive(Debug)]
pub struct Issued {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Issued {
    /// The certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The private key, PEM (PKCS#8).
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// The certificate, DER.
    pub fn der(&self) -> &[u8] {
        self.cert.der()
    }
}

/// A certificate authority that signs kjob's certificates.
#[derive(Debug)]
pub struct Ca {
    own: Issued,
    issuer: Issuer<'static, KeyPair>,
}

fn params(cn: &str, sans: &[String], validity: Duration) -> anyhow::Result<CertificateParams> {
    let mut p = CertificateParams::new(sans.to_vec()).context("certificate names")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    // A little slack for clocks that lag the machine that made the certificate.
    p.not_before = now - Duration::from_secs(3600);
    p.not_after = now + validity;
    Ok(p)
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let mut p = params(name, &[], CA_VALIDITY)?;
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = p.self_signed(&key)?;
        let issuer = Issuer::new(p, KeyPair::from_pem(&key.serialize_pem())?);
        Ok(Self { own: Issued { cert, key }, issuer })
    }

    /// The CA certificate (and key).
    pub fn own(&self) -> &Issued {
        &self.own
    }

    fn leaf(
        &self,
        cn: &str,
        sans: &[String],
        usage: ExtendedKeyUsagePurpose,
    ) -> anyhow::Result<Issued> {
        let mut p = params(cn, sans, LEAF_VALIDITY)?;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert, key })
    }

    /// kjob-queue's serving certificate for `hosts` (DNS names or IP addresses).
    pub fn server(&self, hosts: &[String]) -> anyhow::Result<Issued> {
        self.leaf(SERVER_CN, hosts, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose subject CN is `cn` (a [`Role`] name to be let in).
    pub fn client(&self, cn: &str) -> anyhow::Result<Issued> {
        self.leaf(cn, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// What [`write`] wrote: one folder per Secret, each with `tls.crt`, `tls.key` and `ca.crt`.
pub const SECRETS: [(&str, &str); 4] = [
    ("kjob-queue-tls", SERVER_CN),
    ("kjob-watcher-tls", Role::Watcher.name()),
    ("kjob-worker-tls", Role::Worker.name()),
    ("kjob-inspector-tls", Role::Inspector.name()),
];

/// Writes a new CA (`ca.crt`, `ca.key`) and, per entry of [`SECRETS`], a folder with the
/// certificate, its key and the CA certificate into `out`. Keys are written readable by the
/// owner only.
pub fn write(out: &Path, hosts: &[String]) -> anyhow::Result<()> {
    let ca = Ca::new("kjob CA")?;
    let ca_pem = ca.own().cert_pem();
    write_file(&out.join("ca.crt"), &ca_pem, false)?;
    write_file(&out.join("ca.key"), &ca.own().key_pem(), true)?;
    for (secret, cn) in SECRETS {
        let issued = if cn == SERVER_CN { ca.server(hosts)? } else { ca.client(cn)? };
        let dir = out.join(secret);
        write_file(&dir.join("tls.crt"), &issued.cert_pem(), false)?;
        write_file(&dir.join("tls.key"), &issued.key_pem(), true)?;
        write_file(&dir.join("ca.crt"), &ca_pem, false)?;
    }
    Ok(())
}

/// The commands that load what [`write`] wrote into `namespace` as TLS Secrets (with `ca.crt`,
/// as cert-manager writes them), one line each.
pub fn kubectl_commands(out: &Path, namespace: &str) -> Vec<String> {
    SECRETS
        .iter()
        .map(|(secret, _)| {
            let d = out.join(secret);
            format!(
                "kubectl -n {namespace} create secret generic {secret} --type=kubernetes.io/tls \
                 --from-file=tls.crt={c} --from-file=tls.key={k} --from-file=ca.crt={a}",
                c = d.join("tls.crt").display(),
                k = d.join("tls.key").display(),
                a = d.join("ca.crt").display(),
            )
        })
        .collect()
}

fn write_file(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_secret_and_names_them_in_the_commands() {
        let dir = tempfile::tempdir().unwrap();
        let hosts: Vec<String> = DEFAULT_HOSTS.map(String::from).into();
        write(dir.path(), &hosts).unwrap();
        for (secret, cn) in SECRETS {
            let crt = std::fs::read_to_string(dir.path().join(secret).join("tls.crt")).unwrap();
            assert!(crt.starts_with("-----BEGIN CERTIFICATE-----"), "{secret}");
            let key = dir.path().join(secret).join("tls.key");
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
            let _ = cn;
        }
        let cmds = kubectl_commands(dir.path(), "kjob-system");
        assert_eq!(cmds.len(), SECRETS.len());
        assert!(cmds[0].contains("create secret generic kjob-queue-tls --type=kubernetes.io/tls"));
    }
}
