//! `[tls]`: certificates for TCP listeners with TLS, and the TLS modes of
//! listeners. The target builds its rustls configuration from these
//! (`server::tls`); this crate only parses and bounds them.

use serde::{Deserialize, Serialize};

/// `[tls]`: the server's certificate and how clients are verified.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's own certificate first.
    pub cert: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
    /// PEM CA certificates that sign client certificates.
    #[serde(default)]
    pub ca: Option<String>,
    /// Client certificates: "none", "optional" or "require" (default:
    /// "require" when `ca` is given, else "none").
    #[serde(default)]
    pub client_certs: Option<ClientCerts>,
    /// Removed: TLS connections are served in the reactors and hold no
    /// thread, so there is nothing to bound. Still parsed only to say so
    /// (file, line and field) instead of "unknown field".
    #[serde(default, skip_serializing)]
    pub max_sessions: Option<toml::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientCerts {
    None,
    Optional,
    Require,
}

/// A listener's TLS mode, as nbdkit's `--tls`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    #[default]
    Off,
    On,
    Require,
}

impl TlsMode {
    /// How the handshake treats STARTTLS on such a listener.
    pub fn handshake_tls(self) -> proto::Tls {
        match self {
            TlsMode::Off => proto::Tls::Off,
            TlsMode::On => proto::Tls::Offered,
            TlsMode::Require => proto::Tls::Required,
        }
    }
}
