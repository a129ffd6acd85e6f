//! https for the agent (`--tls-cert`, `--tls-key`): rustls with ring over the agent's own
//! accept loop, for sandboxes whose port is reached without an ssh tunnel. The files are read
//! at start, before Landlock confines the process to its workspace.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server side of TLS, from a PEM certificate chain (the server's first) and its key.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    crate::remote::client::install_tls();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--tls-cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("--tls-cert {}: not a PEM certificate", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "--tls-cert {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
        cert.display()
    );
    // Never echoed: the key's bytes are a secret.
    let key = PrivateKeyDer::from_pem_file(key).map_err(|_| {
        anyhow::anyhow!(
            "--tls-key {}: no PEM private key in it (or it cannot be read)",
            key.display()
        )
    })?;
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("--tls-cert/--tls-key: the key does not go with the certificate")?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
