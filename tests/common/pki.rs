//! Certificates made on the spot by the `openssl` command, for the TLS tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `openssl ARGS` in `dir`; it must succeed.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
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

/// A CA and certificates it signed, in a directory of PEM files.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    /// A CA named `ca` (`ca.pem`, `ca.key`).
    pub fn new(dir: &Path, ca: &str) -> Pki {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ],
        );
        pki
    }

    /// `NAME.pem` and `NAME.key`, signed by `ca`, for 127.0.0.1 and localhost (a server) or
    /// a client.
    pub fn issue(&self, ca: &str, name: &str) {
        self.issue_for(ca, name, "IP:127.0.0.1,DNS:localhost");
    }

    /// `NAME.pem` and `NAME.key`, signed by `ca`, for the names of `san`
    /// (`subjectAltName`'s form: `DNS:collector.example,IP:10.0.0.7`).
    pub fn issue_for(&self, ca: &str, name: &str, san: &str) {
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            format!("subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        )
        .unwrap();
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}
