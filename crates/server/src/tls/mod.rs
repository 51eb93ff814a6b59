//! TLS (NBD_OPT_STARTTLS) for TCP listeners with `tls = "on"` or `"require"`.
//!
//! A TLS listener's connection goes to a reactor like any other, with a
//! handshake that offers STARTTLS. When the client takes it, the engine
//! asks its driver to start TLS (`Action::StartTls`), and the reactor runs
//! a [`session::TlsSession`] on that connection from then on: it receives
//! ciphertext into the session's buffer, decrypts into the engine's receive
//! buffers, and encrypts the engine's replies into the session's output,
//! all on the reactor's thread (`reactor::tls`). No thread or socketpair
//! per connection; see docs/evidence.md#tls-reactor.
//!
//! This module builds the rustls configuration from `[tls]`; the session
//! knows no protocol, so NVMe/TCP TLS (TP 8011, with PSKs) can use it with
//! a configuration of its own.

mod records;
pub mod session;

use std::path::Path;
use std::sync::Arc;

use config::tls::{ClientCerts, TlsConfig};
use config::{ConfigError, LoadedConfig};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;

fn read_pem(path: &str) -> Result<Vec<u8>, (&'static str, String)> {
    std::fs::read(Path::new(path)).map_err(|e| ("", format!("{path}: {e}")))
}

/// The rustls configuration of `[tls]`, with its files read and checked.
pub fn config_of(loaded: &LoadedConfig) -> Result<Option<Arc<ServerConfig>>, ConfigError> {
    let Some(t) = &loaded.config.tls else {
        return Ok(None);
    };
    server_config(t)
        .map(Some)
        .map_err(|(field, m)| loaded.error_at("tls", 0, field, m))
}

/// Builds the rustls server configuration; an error names the `[tls]` field.
pub fn server_config(c: &TlsConfig) -> Result<Arc<ServerConfig>, (&'static str, String)> {
    let mut provider = rustls::crypto::ring::default_provider();
    // AES-128-GCM first, and our order over the client's: it is as safe as
    // AES-256 for TLS and a quarter cheaper for both ends, which share this
    // machine's cores in loopback setups (issue 13's TLS cost goal).
    provider.cipher_suites.sort_by_key(|s| {
        let name = format!("{:?}", s.suite());
        (!name.contains("AES_128_GCM"), !name.contains("AES_256_GCM"))
    });
    let provider = Arc::new(provider);
    let pem = read_pem(&c.cert).map_err(|(_, m)| ("cert", m))?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| ("cert", format!("{}: {e}", c.cert)))?;
    if certs.is_empty() {
        return Err(("cert", format!("{}: no PEM certificate in it", c.cert)));
    }
    let pem = read_pem(&c.key).map_err(|(_, m)| ("key", m))?;
    let key = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| ("key", format!("{}: {e}", c.key)))?
        .ok_or_else(|| ("key", format!("{}: no PEM private key in it", c.key)))?;
    let mode = c.client_certs.unwrap_or(if c.ca.is_some() {
        ClientCerts::Require
    } else {
        ClientCerts::None
    });
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ("cert", e.to_string()))?;
    let builder = match (mode, &c.ca) {
        (ClientCerts::None, _) => builder.with_no_client_auth(),
        (_, None) => return Err(("ca", "client certificates need a ca".into())),
        (_, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            let pem = read_pem(ca).map_err(|(_, m)| ("ca", m))?;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                let cert = cert.map_err(|e| ("ca", format!("{ca}: {e}")))?;
                roots.add(cert).map_err(|e| ("ca", format!("{ca}: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match mode {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| ("ca", e.to_string()))?)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ("key", format!("{}: {e}", c.key)))?;
    config.ignore_client_order = true;
    // A TLS 1.3 session's records are sealed and opened in place by
    // `records` over the secrets rustls extracts after the handshake.
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

/// The common name of a client certificate, for `cn:NAME` access rules.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}
