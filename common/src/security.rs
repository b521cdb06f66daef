//! How a client proves who it is to the broker and checks the broker:
//! credentials (username, and a password from a file or the environment,
//! never from the command line where `ps` shows it) and TLS with optional
//! client certificates (mutual TLS), through rustls with the ring provider
//! (no C toolchain needed to cross-compile).
//!
//! The agent and the coordinator take the same flags ([`SecurityArgs`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::BrokerUrl;

/// Environment variable holding the broker password.
pub const PASSWORD_ENV: &str = "TUNEFLEET_PASSWORD";
/// Where an agent may be given its join token.
pub const JOIN_ENV: &str = "TUNEFLEET_JOIN";
/// The agent's and the coordinator's secrets that may sit in their
/// environment: never passed on to a trial's workload.
pub const SECRET_ENV: &[&str] = &[PASSWORD_ENV, JOIN_ENV];

/// Why the security settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("cannot read {what} {path}: {source}")]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{path}: no {what} found in the PEM file")]
    Empty { what: &'static str, path: PathBuf },
    #[error("{path}: {what} does not parse: {reason}")]
    Pem { what: &'static str, path: PathBuf, reason: String },
    #[error("--cert and --key go together")]
    CertWithoutKey,
    #[error("{0} given, but the broker URL is not mqtts://")]
    TlsWithoutMqtts(&'static str),
    #[error("mqtts:// needs --ca FILE: the certificate authority that signed the broker's certificate")]
    NoCa,
    #[error("a password (--password-file or {PASSWORD_ENV}) needs --username")]
    PasswordWithoutUser,
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Certificate files for a TLS client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA that signed the broker's certificate.
    pub ca: PathBuf,
    /// Client certificate and key, for brokers that require one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// Everything a client needs beyond the broker address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSecurity {
    pub credentials: Option<(String, String)>,
    pub tls: Option<TlsFiles>,
}

/// Broker security flags, shared by `tunefleet` and `tunefleet-agent`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SecurityArgs {
    /// Username for the broker
    #[arg(long, env = "TUNEFLEET_USERNAME", value_name = "NAME")]
    pub username: Option<String>,
    /// File whose first line is the broker password (or set TUNEFLEET_PASSWORD)
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the broker's certificate (mqtts://)
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM), for brokers that require one (mutual TLS)
    #[arg(long, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

impl SecurityArgs {
    /// Checks the flags against the broker URL; `password_env` is the value of
    /// [`PASSWORD_ENV`] (passed in so tests need not touch the environment).
    pub fn resolve(&self, url: &BrokerUrl, password_env: Option<String>) -> Result<ClientSecurity, SecurityError> {
        let password = match &self.password_file {
            Some(path) => Some(read_password(path)?),
            None => password_env.filter(|p| !p.is_empty()),
        };
        let credentials = match (&self.username, password) {
            (Some(u), p) => Some((u.clone(), p.unwrap_or_default())),
            (None, Some(_)) => return Err(SecurityError::PasswordWithoutUser),
            (None, None) => None,
        };
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            _ => return Err(SecurityError::CertWithoutKey),
        };
        let tls = if url.tls {
            let ca = self.ca.clone().ok_or(SecurityError::NoCa)?;
            let files = TlsFiles { ca, identity };
            // Load once now so a bad file is refused before anything starts.
            client_config(&files)?;
            Some(files)
        } else {
            if self.ca.is_some() {
                return Err(SecurityError::TlsWithoutMqtts("--ca"));
            }
            if identity.is_some() {
                return Err(SecurityError::TlsWithoutMqtts("--cert"));
            }
            None
        };
        Ok(ClientSecurity { credentials, tls })
    }
}

fn read_password(path: &Path) -> Result<String, SecurityError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecurityError::Read {
        what: "password file",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let bytes = std::fs::read(path).map_err(|source| SecurityError::Read { what, path: path.to_path_buf(), source })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SecurityError::Pem { what, path: path.to_path_buf(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(SecurityError::Empty { what, path: path.to_path_buf() });
    }
    Ok(certs)
}

/// A rustls client configuration (ring provider) for these files.
pub fn client_config(files: &TlsFiles) -> Result<Arc<rustls::ClientConfig>, SecurityError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs("CA certificate", &files.ca)? {
        roots.add(cert)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match &files.identity {
        Some((cert, key)) => {
            let chain = certs("client certificate", cert)?;
            let bytes = std::fs::read(key).map_err(|source| SecurityError::Read {
                what: "client key",
                path: key.clone(),
                source,
            })?;
            let key_der = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| SecurityError::Pem {
                what: "client key",
                path: key.clone(),
                reason: e.to_string(),
            })?;
            builder.with_client_auth_cert(chain, key_der)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> BrokerUrl {
        s.parse().expect("url")
    }

    #[test]
    fn flags_are_checked_against_the_url() {
        let dir = std::env::temp_dir().join(format!("tf-sec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let pw = dir.join("pw");
        std::fs::write(&pw, "s3cret\nignored\n").expect("write");
        let args = SecurityArgs { username: Some("agent".into()), password_file: Some(pw), ..Default::default() };
        let sec = args.resolve(&url("mqtt://h:1"), Some("from-env".into())).expect("ok");
        assert_eq!(sec.credentials, Some(("agent".into(), "s3cret".into())), "the file wins over the env");
        let env_only = SecurityArgs { username: Some("a".into()), ..Default::default() };
        let sec = env_only.resolve(&url("mqtt://h:1"), Some("e".into())).expect("ok");
        assert_eq!(sec.credentials, Some(("a".into(), "e".into())));
        let no_user = SecurityArgs::default().resolve(&url("mqtt://h:1"), Some("e".into()));
        assert!(matches!(no_user, Err(SecurityError::PasswordWithoutUser)));
        let no_ca = SecurityArgs::default().resolve(&url("mqtts://h:1"), None);
        assert!(matches!(no_ca, Err(SecurityError::NoCa)));
        let ca_plain = SecurityArgs { ca: Some(dir.join("x")), ..Default::default() }.resolve(&url("mqtt://h:1"), None);
        assert!(matches!(ca_plain, Err(SecurityError::TlsWithoutMqtts("--ca"))));
        let half = SecurityArgs { cert: Some(dir.join("c")), ..Default::default() }.resolve(&url("mqtt://h:1"), None);
        assert!(matches!(half, Err(SecurityError::CertWithoutKey)));
        let missing = SecurityArgs { ca: Some(dir.join("nope.pem")), ..Default::default() };
        let e = missing.resolve(&url("mqtts://h:1"), None).expect_err("missing CA file");
        assert!(e.to_string().contains("nope.pem"), "{e}");
        std::fs::write(dir.join("empty.pem"), "not a pem").expect("write");
        let empty = SecurityArgs { ca: Some(dir.join("empty.pem")), ..Default::default() };
        assert!(matches!(empty.resolve(&url("mqtts://h:1"), None), Err(SecurityError::Empty { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
