//! A test certificate authority made with the `openssl` CLI: its CA certificate, and server
//! certificates it signs for the names asked (so a test can make a certificate for the wrong
//! host as easily as for the right one).

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct TestCa {
    pub dir: tempfile::TempDir,
    /// The CA's certificate (PEM): what `--ca-file` is given.
    pub ca: PathBuf,
    ca_key: PathBuf,
    openssl: PathBuf,
}

/// A server certificate and its key.
pub struct ServerCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(bin: &Path, dir: &Path, args: &[&str]) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl TestCa {
    /// A new CA; `None` (said) when the `openssl` CLI is missing.
    pub fn new() -> Option<TestCa> {
        let bin = super::require_tool("openssl")?;
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
        args.extend(EC);
        args.extend([
            "-subj",
            "/CN=sbxfs test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&bin, dir.path(), &args);
        Some(TestCa {
            ca: dir.path().join("ca.pem"),
            ca_key: dir.path().join("ca.key"),
            dir,
            openssl: bin,
        })
    }

    /// A server certificate signed by this CA for `names` (`IP:127.0.0.1`, `DNS:localhost`).
    pub fn server(&self, label: &str, names: &[&str]) -> ServerCert {
        let d = self.dir.path();
        let key = format!("{label}.key");
        let csr = format!("{label}.csr");
        let cert = format!("{label}.pem");
        let ext = format!("{label}.ext");
        std::fs::write(
            d.join(&ext),
            format!(
                "subjectAltName={}\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n",
                names.join(",")
            ),
        )
        .unwrap();
        let mut args = vec!["req", "-nodes"];
        args.extend(EC);
        args.extend([
            "-subj",
            "/CN=sbxfs test server",
            "-keyout",
            &key,
            "-out",
            &csr,
        ]);
        openssl(&self.openssl, d, &args);
        let ca = self.ca.display().to_string();
        let ca_key = self.ca_key.display().to_string();
        openssl(
            &self.openssl,
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &cert,
                "-extfile",
                &ext,
            ],
        );
        ServerCert {
            cert: d.join(cert),
            key: d.join(key),
        }
    }
}
