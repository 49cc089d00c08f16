//! The OpenTelemetry trace export's configuration, from the standard `OTEL_*` variables
//! (<https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/>,
//! and the OTLP exporter's). Read by the master at start, which stops with exit 2 on an
//! error and logs the warnings, and hands what it read to each worker in its configuration
//! (`crate::master::worker_config`); each worker exports its own spans
//! (`worker/src/observe/spans/`).
//!
//! Export is **off** unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! or `OTEL_EXPORTER_OTLP_ENDPOINT`) or `OTEL_TRACES_EXPORTER=otlp` asks for the default
//! one; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turns it off whatever else
//! is set. What the standard says is a warning (an unknown sampler, a bad sampler argument,
//! an unknown `OTEL_TRACES_EXPORTER`) is a warning and the default; what would make the
//! server export somewhere it cannot, or send what it was not given, is an error: a URL
//! that is not `http://` or `https://` or that could not be sent as written (`endpoint`), a
//! protocol other than `http/protobuf`, a header that does not parse or would not be one
//! header on the wire (`pairs`), a client certificate without its key. An `https://`
//! endpoint's certificate files are read by [`crate::otel_tls`] (the master checks them at
//! start).

mod endpoint;
mod pairs;
mod pem_names;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use endpoint::Url;

/// OTLP/HTTP's default endpoint for traces (the specification's, for `http/protobuf`).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318/v1/traces";

/// How the root of a trace, or a request with a caller's trace, is sampled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// A trace id's lower 8 bytes below this fraction of the range.
    Ratio(f64),
    /// A caller's sampled flag decides; without a caller, the inner sampler.
    ParentBased(Box<Sampler>),
}

impl Sampler {
    /// Whether a span of `trace_id` (32 hex digits) is sampled, given the caller's sampled
    /// flag (`None`: no caller).
    pub fn sampled(&self, trace_id: &str, parent: Option<bool>) -> bool {
        match self {
            Sampler::AlwaysOn => true,
            Sampler::AlwaysOff => false,
            Sampler::Ratio(r) => {
                // The specification's TraceIdRatioBased: the trace id's last 8 bytes as a
                // number, against ratio × 2^64 (deterministic, so every service agrees).
                let low = u64::from_str_radix(trace_id.get(16..32).unwrap_or("0"), 16).unwrap_or(0);
                (low as f64) < r * (u64::MAX as f64)
            }
            Sampler::ParentBased(root) => match parent {
                Some(s) => s,
                None => root.sampled(trace_id, None),
            },
        }
    }
}

/// Where and how spans are exported: read by the master, handed to each worker in its
/// configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OtelConfig {
    /// `http://host:port/path` of the OTLP/HTTP traces endpoint.
    pub endpoint: String,
    /// The endpoint's host and port, and its path (with query).
    pub host_port: String,
    pub path: String,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`, decoded.
    pub headers: Vec<(String, String)>,
    /// `OTEL_SERVICE_NAME`, else `OTEL_RESOURCE_ATTRIBUTES`'s `service.name`, else `vramfork`.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES` (less `service.name`).
    pub resource: BTreeMap<String, String>,
    pub sampler: Sampler,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT`, in milliseconds (default 10,000).
    pub timeout_ms: u64,
    /// `Some` for an `https://` endpoint.
    pub tls: Option<OtelTls>,
}

/// A PEM file and what named it (a variable, or the system's bundle).
pub type PemFile = (&'static str, PathBuf);

/// How an `https://` endpoint is reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OtelTls {
    /// The endpoint's host (without brackets): the name sent (SNI) and verified.
    pub host: String,
    /// The certificates trusted for the collector's: `OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE`
    /// alone, else `SSL_CERT_FILE` and `SSL_CERT_DIR` (either or both; one named
    /// [`CERT_DIR`] is a directory), else the system's bundle.
    #[serde(with = "pem_names")]
    pub roots: Vec<PemFile>,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)CLIENT_CERTIFICATE` and `_CLIENT_KEY` (mutual TLS).
    #[serde(with = "pem_names::pair")]
    pub client: Option<(PemFile, PemFile)>,
}

/// The variables naming the collector's CA (the signal's, else the base one).
const CA_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
];
/// The variables naming the client certificate.
const CLIENT_CERT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
];
/// The variables naming the client certificate's key.
const CLIENT_KEY_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
];
/// OpenSSL's variable naming a bundle of trusted certificates.
const CERT_FILE: &str = "SSL_CERT_FILE";
/// What names the system's bundle, found at one of [`SYSTEM_BUNDLES`].
const SYSTEM_BUNDLE: &str = "the system's CA bundle";

/// The variable naming a directory of trusted certificates (OpenSSL's: files named
/// `HASH.N` as `openssl rehash` makes them, or `*.pem`, `*.crt`).
pub const CERT_DIR: &str = "SSL_CERT_DIR";

/// Where distributions keep the system's CA bundle (PEM), looked at in this order when
/// none of `OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE`, `SSL_CERT_FILE` and `SSL_CERT_DIR` is
/// set.
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Arch, Alpine (ca-certificates)
    "/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL, CentOS
    "/etc/ssl/ca-bundle.pem",             // openSUSE
    "/etc/ssl/cert.pem",                  // Alpine's default, macOS
];

/// The configuration the variables give: `Ok((None, warnings))` when export is off.
pub fn from_env(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<OtelConfig>, Vec<String>), String> {
    let mut warnings = Vec::new();
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    if let Some(v) = set("OTEL_SDK_DISABLED") {
        if v.trim().eq_ignore_ascii_case("true") {
            return Ok((None, warnings));
        }
        if !v.trim().eq_ignore_ascii_case("false") {
            warnings.push(format!(
                "OTEL_SDK_DISABLED={v}: expected true or false; taken as false"
            ));
        }
    }
    let asked = match set("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None => false,
        Some("none") => return Ok((None, warnings)),
        Some("otlp") => true,
        Some(v) => {
            warnings.push(format!(
                "OTEL_TRACES_EXPORTER={v}: only otlp (over HTTP) or none are supported; taken as otlp"
            ));
            true
        }
    };
    let Some((var, endpoint)) = endpoint(&set, asked) else {
        return Ok((None, warnings));
    };
    protocol(&set)?;
    // The value is quoted escaped: it may hold the line break it is refused for.
    let url = endpoint::parse(&endpoint)
        .map_err(|e| format!("{var}={}: {e}", endpoint.escape_debug()))?;
    let tls = tls(&set, &url, &mut warnings)?;
    let (host_port, path) = (url.host_port, url.path);
    let headers = match set("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
        .map(|h| ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", h))
        .or_else(|| set("OTEL_EXPORTER_OTLP_HEADERS").map(|h| ("OTEL_EXPORTER_OTLP_HEADERS", h)))
    {
        None => Vec::new(),
        Some((var, h)) => pairs::headers(&h).map_err(|e| format!("{var}: {e}"))?,
    };
    let timeout_ms = match set("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| set("OTEL_EXPORTER_OTLP_TIMEOUT"))
    {
        None => 10_000,
        Some(t) => match t.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => ms,
            _ => {
                warnings.push(format!(
                    "OTEL_EXPORTER_OTLP_TIMEOUT={t}: expected milliseconds > 0; 10000 taken"
                ));
                10_000
            }
        },
    };
    let mut resource = match set("OTEL_RESOURCE_ATTRIBUTES") {
        None => BTreeMap::new(),
        Some(r) => match pairs::pairs(&r) {
            Ok(p) => p.into_iter().collect(),
            Err(e) => {
                warnings.push(format!("OTEL_RESOURCE_ATTRIBUTES: {e}; ignored"));
                BTreeMap::new()
            }
        },
    };
    let service_name = set("OTEL_SERVICE_NAME")
        .map(|s| s.trim().to_string())
        .or_else(|| resource.remove("service.name"))
        .unwrap_or_else(|| "vramfork".to_string());
    resource.remove("service.name");
    let sampler = sampler(
        set("OTEL_TRACES_SAMPLER").as_deref(),
        set("OTEL_TRACES_SAMPLER_ARG").as_deref(),
        &mut warnings,
    );
    Ok((
        Some(OtelConfig {
            endpoint,
            host_port,
            path,
            headers,
            service_name,
            resource,
            sampler,
            timeout_ms,
            tls,
        }),
        warnings,
    ))
}

/// The traces endpoint and the variable it came from; `None` when none is set and the
/// exporter was not asked for.
fn endpoint(set: &dyn Fn(&str) -> Option<String>, asked: bool) -> Option<(&'static str, String)> {
    match (
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        set("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        // The signal's own variable is the URL as it is.
        (Some(e), _) => Some(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", e.trim().to_string())),
        // The base variable gets the signal's path appended.
        (None, Some(e)) => Some((
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("{}/v1/traces", e.trim().trim_end_matches('/')),
        )),
        (None, None) if asked => Some(("OTEL_TRACES_EXPORTER", DEFAULT_ENDPOINT.to_string())),
        (None, None) => None,
    }
}

/// The protocol, when set, must be the one vramfork speaks.
fn protocol(set: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = set(var) {
            if p.trim() != "http/protobuf" {
                return Err(format!(
                    "{var}={p}: vramfork exports traces over OTLP/HTTP with protobuf only: set http/protobuf (or unset it) and point the endpoint at the collector's HTTP port (4318)"
                ));
            }
            return Ok(());
        }
    }
    Ok(())
}

/// `OTEL_TRACES_SAMPLER` and its argument; the default is parent-based always-on.
fn sampler(name: Option<&str>, arg: Option<&str>, warnings: &mut Vec<String>) -> Sampler {
    let ratio = |warnings: &mut Vec<String>| match arg.map(|a| a.trim().parse::<f64>()) {
        None => 1.0,
        Some(Ok(r)) if (0.0..=1.0).contains(&r) => r,
        Some(_) => {
            warnings.push(format!(
                "OTEL_TRACES_SAMPLER_ARG={}: expected a ratio from 0 to 1; 1.0 taken",
                arg.unwrap_or_default()
            ));
            1.0
        }
    };
    let parent = |s: Sampler| Sampler::ParentBased(Box::new(s));
    match name.map(str::trim) {
        None | Some("parentbased_always_on") => parent(Sampler::AlwaysOn),
        Some("always_on") => Sampler::AlwaysOn,
        Some("always_off") => Sampler::AlwaysOff,
        Some("traceidratio") => Sampler::Ratio(ratio(warnings)),
        Some("parentbased_always_off") => parent(Sampler::AlwaysOff),
        Some("parentbased_traceidratio") => parent(Sampler::Ratio(ratio(warnings))),
        Some(other) => {
            warnings.push(format!(
                "OTEL_TRACES_SAMPLER={other}: not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio; parentbased_always_on taken"
            ));
            parent(Sampler::AlwaysOn)
        }
    }
}

/// The signal's variable, else the base one: (the variable, its value as a path).
fn either(set: &dyn Fn(&str) -> Option<String>, vars: [&'static str; 2]) -> Option<PemFile> {
    vars.into_iter()
        .find_map(|v| set(v).map(|p| (v, PathBuf::from(p.trim()))))
}

/// The TLS settings of an `https://` endpoint (the files are read by `crate::otel_tls`);
/// for an `http://` one, a warning for each certificate variable set (they are not used).
fn tls(
    set: &dyn Fn(&str) -> Option<String>,
    url: &Url,
    warnings: &mut Vec<String>,
) -> Result<Option<OtelTls>, String> {
    let (ca, cert, key) = (
        either(set, CA_VARS),
        either(set, CLIENT_CERT_VARS),
        either(set, CLIENT_KEY_VARS),
    );
    if !url.https {
        for (var, _) in [&ca, &cert, &key].into_iter().flatten() {
            warnings.push(format!(
                "{var} is set but the endpoint is http://: it is used for https:// endpoints only"
            ));
        }
        return Ok(None);
    }
    // The explicit OTLP certificate alone; else OpenSSL's variables, both when both are set
    // (as OpenSSL and rustls-native-certs read them); else the system's bundle. SSL_CERT_DIR
    // may list several directories separated by `:`, as OpenSSL's X509_LOOKUP_add_dir reads
    // it on Unix (empty entries passed over).
    let mut openssl: Vec<PemFile> = Vec::new();
    if let Some(f) = set(CERT_FILE) {
        openssl.push((CERT_FILE, PathBuf::from(f.trim())));
    }
    if let Some(dirs) = set(CERT_DIR) {
        let dirs = dirs.split(':').map(str::trim).filter(|d| !d.is_empty());
        openssl.extend(dirs.map(|d| (CERT_DIR, PathBuf::from(d))));
    }
    let roots = match ca {
        Some(ca) => vec![ca],
        None if !openssl.is_empty() => openssl,
        None => vec![SYSTEM_BUNDLES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .map(|p| (SYSTEM_BUNDLE, p))
            .ok_or_else(|| {
                format!(
                    "an https:// endpoint needs the certificates to trust for the collector's: set OTEL_EXPORTER_OTLP_CERTIFICATE to a PEM file of its CA (no system CA bundle was found at {}: install ca-certificates, or set SSL_CERT_FILE or SSL_CERT_DIR)",
                    SYSTEM_BUNDLES.join(", ")
                )
            })?],
    };
    let client = match (cert, key) {
        (None, None) => None,
        (Some(c), Some(k)) => Some((c, k)),
        (Some((var, _)), None) => {
            return Err(format!(
                "{var} is set without OTEL_EXPORTER_OTLP_CLIENT_KEY (the client certificate's private key, PEM)"
            ))
        }
        (None, Some((var, _))) => {
            return Err(format!(
                "{var} is set without OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE (the client certificate the key belongs to, PEM)"
            ))
        }
    };
    Ok(Some(OtelTls {
        host: url.host.clone(),
        roots,
        client,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<(Option<OtelConfig>, Vec<String>), String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_env(&|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn off_unless_an_endpoint_or_the_exporter_is_set() {
        assert_eq!(read(&[]).unwrap().0, None);
        assert_eq!(read(&[("OTEL_SERVICE_NAME", "x")]).unwrap().0, None);
        let c = read(&[("OTEL_TRACES_EXPORTER", "otlp")])
            .unwrap()
            .0
            .unwrap();
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(
            (c.host_port.as_str(), c.path.as_str()),
            ("localhost:4318", "/v1/traces")
        );
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            let c = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off]).unwrap();
            assert_eq!(c.0, None, "{off:?}");
        }
    }

    #[test]
    fn the_signal_endpoint_is_taken_as_is_the_base_one_gets_the_path() {
        let c = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .0
            .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/v1/traces");
        let c = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b/custom"),
        ])
        .unwrap()
        .0
        .unwrap();
        assert_eq!((c.host_port.as_str(), c.path.as_str()), ("b:80", "/custom"));
    }

    #[test]
    fn what_cannot_be_exported_to_is_an_error_naming_the_variable() {
        for (vars, want) in [
            (&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "c:4318")][..], "expected an http:// or https:// URL"),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c"), ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem")][..],
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE is set without OTEL_EXPORTER_OTLP_CLIENT_KEY",
            ),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:port")][..], "'port' is not a port"),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")][..],
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: vramfork exports traces over OTLP/HTTP with protobuf only",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")][..],
                "OTEL_EXPORTER_OTLP_HEADERS: entry 1 is not key=value (not shown",
            ),
        ] {
            let e = read(vars).unwrap_err();
            assert!(e.contains(want), "{vars:?}: {e}");
        }
    }

    #[test]
    fn headers_resource_and_service_name() {
        let c = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20abc, x-tenant=t1",
            ),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=from-resource,deployment.environment=prod",
            ),
        ])
        .unwrap()
        .0
        .unwrap();
        assert_eq!(
            c.headers,
            vec![
                ("authorization".to_string(), "Bearer abc".to_string()),
                ("x-tenant".to_string(), "t1".to_string())
            ]
        );
        assert_eq!(c.service_name, "from-resource");
        assert_eq!(
            c.resource.get("deployment.environment").map(String::as_str),
            Some("prod")
        );
        let c = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SERVICE_NAME", "embedder"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=other"),
        ])
        .unwrap()
        .0
        .unwrap();
        assert_eq!(c.service_name, "embedder");
        assert!(c.resource.is_empty());
    }

    #[test]
    fn samplers_default_to_parent_based_and_a_bad_one_is_a_warning() {
        let on = |vars: &[(&str, &str)]| {
            let mut v = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
            v.extend_from_slice(vars);
            read(&v).unwrap()
        };
        let (c, w) = on(&[]);
        let s = c.unwrap().sampler;
        assert!(w.is_empty());
        assert_eq!(s, Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let t = "0af7651916cd43dd8448eb211c80319c";
        assert!(s.sampled(t, None) && s.sampled(t, Some(true)) && !s.sampled(t, Some(false)));
        let (c, w) = on(&[("OTEL_TRACES_SAMPLER", "sometimes")]);
        assert_eq!(
            c.unwrap().sampler,
            Sampler::ParentBased(Box::new(Sampler::AlwaysOn))
        );
        assert!(w[0].contains("OTEL_TRACES_SAMPLER=sometimes"), "{w:?}");
        let (c, w) = on(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ]);
        assert_eq!(c.unwrap().sampler, Sampler::Ratio(1.0));
        assert!(w[0].contains("OTEL_TRACES_SAMPLER_ARG=2"), "{w:?}");
        let s = Sampler::Ratio(0.5);
        assert!(s.sampled("00000000000000000000000000000001", None));
        assert!(!s.sampled("0000000000000000ffffffffffffffff", None));
        assert!(!Sampler::AlwaysOff.sampled(t, Some(true)));
    }

    #[test]
    fn an_https_endpoint_names_its_host_its_roots_and_its_client_certificate() {
        let c = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/base-ca.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces-ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/client.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/client.key"),
        ])
        .unwrap()
        .0
        .unwrap();
        assert_eq!(
            (c.host_port.as_str(), c.path.as_str()),
            ("collector.example:443", "/v1/traces")
        );
        let tls = c.tls.unwrap();
        assert_eq!(tls.host, "collector.example");
        assert_eq!(
            tls.roots,
            vec![(
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "/traces-ca.pem".into()
            )]
        );
        assert_eq!(
            tls.client,
            Some((
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    "/client.pem".into()
                ),
                ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/client.key".into())
            ))
        );
        let c = read(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://[::1]:4318/v1/traces",
            ),
            ("SSL_CERT_FILE", "/bundle.pem"),
        ])
        .unwrap()
        .0
        .unwrap();
        let tls = c.tls.unwrap();
        assert_eq!(
            (c.host_port.as_str(), tls.host.as_str()),
            ("[::1]:4318", "::1")
        );
        assert_eq!(tls.roots, vec![("SSL_CERT_FILE", "/bundle.pem".into())]);
        let (c, w) = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem"),
        ])
        .unwrap();
        assert_eq!(c.unwrap().tls, None);
        assert!(
            w[0].contains("OTEL_EXPORTER_OTLP_CERTIFICATE is set but the endpoint is http://"),
            "{w:?}"
        );
    }

    #[test]
    fn openssl_s_file_and_directory_are_read_together_and_the_otlp_certificate_alone() {
        let roots = |vars: &[(&str, &str)]| {
            let mut v = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c")];
            v.extend_from_slice(vars);
            read(&v).unwrap().0.unwrap().tls.unwrap().roots
        };
        assert_eq!(
            roots(&[("SSL_CERT_DIR", "/certs")]),
            vec![("SSL_CERT_DIR", "/certs".into())]
        );
        assert_eq!(
            roots(&[("SSL_CERT_DIR", "/certs"), ("SSL_CERT_FILE", "/b.pem")]),
            vec![
                ("SSL_CERT_FILE", "/b.pem".into()),
                ("SSL_CERT_DIR", "/certs".into())
            ]
        );
        assert_eq!(
            roots(&[
                ("SSL_CERT_DIR", "/certs"),
                ("SSL_CERT_FILE", "/b.pem"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem")
            ]),
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem".into())]
        );
        // OpenSSL's list of directories.
        assert_eq!(
            roots(&[("SSL_CERT_DIR", "/certs:/more/certs::")]),
            vec![
                ("SSL_CERT_DIR", "/certs".into()),
                ("SSL_CERT_DIR", "/more/certs".into())
            ]
        );
    }
}
