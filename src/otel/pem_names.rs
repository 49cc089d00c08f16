//! A [`PemFile`]'s name in a worker's configuration: written as the text it is, read back as
//! the one of the names the master gives ([`super::tls`]) that it equals, so that the type
//! keeps its `&'static str`.

use serde::de::Error;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::path::PathBuf;

use super::{
    PemFile, CA_VARS, CERT_DIR, CERT_FILE, CLIENT_CERT_VARS, CLIENT_KEY_VARS, SYSTEM_BUNDLE,
};

/// The name among those the master gives that equals `name`.
fn known(name: &str) -> Option<&'static str> {
    CA_VARS
        .into_iter()
        .chain(CLIENT_CERT_VARS)
        .chain(CLIENT_KEY_VARS)
        .chain([CERT_FILE, CERT_DIR, SYSTEM_BUNDLE])
        .find(|k| *k == name)
}

fn owned((name, path): (String, PathBuf)) -> Result<PemFile, String> {
    known(&name)
        .map(|k| (k, path))
        .ok_or_else(|| format!("{name:?} names no certificate file the trace export reads"))
}

pub fn serialize<S: Serializer>(files: &[PemFile], s: S) -> Result<S::Ok, S::Error> {
    files.serialize(s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PemFile>, D::Error> {
    Vec::<(String, PathBuf)>::deserialize(d)?
        .into_iter()
        .map(|f| owned(f).map_err(D::Error::custom))
        .collect()
}

/// The client certificate and its key.
pub mod pair {
    use super::*;

    pub fn serialize<S: Serializer>(
        pair: &Option<(PemFile, PemFile)>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        pair.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<(PemFile, PemFile)>, D::Error> {
        type Named = (String, PathBuf);
        match Option::<(Named, Named)>::deserialize(d)? {
            None => Ok(None),
            Some((cert, key)) => Ok(Some((
                owned(cert).map_err(D::Error::custom)?,
                owned(key).map_err(D::Error::custom)?,
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::OtelTls;

    /// Every name the master gives comes back as itself; another is refused.
    #[test]
    fn names_travel_and_come_back() {
        let tls = OtelTls {
            host: "collector".into(),
            roots: vec![
                (super::CERT_FILE, "/b.pem".into()),
                (super::CERT_DIR, "/certs".into()),
                (super::SYSTEM_BUNDLE, "/etc/ssl/cert.pem".into()),
            ],
            client: Some((
                (super::CLIENT_CERT_VARS[0], "/c.pem".into()),
                (super::CLIENT_KEY_VARS[1], "/k.pem".into()),
            )),
        };
        let text = serde_json::to_string(&tls).unwrap();
        assert_eq!(serde_json::from_str::<OtelTls>(&text).unwrap(), tls);
        let other = text.replace("SSL_CERT_FILE", "SSL_CERT_FILES");
        let e = serde_json::from_str::<OtelTls>(&other)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"SSL_CERT_FILES\" names no certificate file"),
            "{e}"
        );
    }
}
