//! The listener's TLS: certificates read from `[proxy.tls]`, chosen by the name the
//! client asks for (SNI), TLS 1.2 and 1.3 only, ALPN `h2` and `http/1.1`. Loaded with
//! the config's other secrets, so that a bad certificate is a refused reload and the
//! old one stays in force.

use std::{collections::HashMap, fmt, path::Path, sync::Arc};

use rustls::{
    ServerConfig,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio_rustls::TlsAcceptor;

use crate::config::proxy::TlsConfig;

/// What ALPN offers, in the server's order of preference.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A certificate or key of `[proxy.tls]` that cannot serve, with the key naming it.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct TlsError {
    /// The dotted config key, e.g. `proxy.tls.sni[1].cert`.
    pub key: String,
    pub message: String,
}

/// The listener's TLS settings, ready to accept handshakes.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    /// Reads every certificate and key of `config` and checks that each key belongs
    /// to its certificate.
    pub fn load(config: &TlsConfig) -> Result<Self, TlsError> {
        let default = certified_key("proxy.tls", &config.cert, &config.key)?;
        let mut by_name = HashMap::new();
        for (i, sni) in config.sni.iter().enumerate() {
            let key = certified_key(&format!("proxy.tls.sni[{i}]"), &sni.cert, &sni.key)?;
            by_name.insert(sni.name.to_ascii_lowercase(), key);
        }
        let protocols = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|error| TlsError { key: "proxy.tls".to_owned(), message: error.to_string() })?;
        let mut server = protocols.with_no_client_auth().with_cert_resolver(Arc::new(ByName { default, by_name }));
        server.alpn_protocols = ALPN.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(Self { acceptor: TlsAcceptor::from(Arc::new(server)) })
    }

    #[must_use]
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}

fn certified_key(key: &str, cert: &Path, private_key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let at = |field: &str, message: String| TlsError { key: format!("{key}.{field}"), message };
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|error| at("cert", format!("{}: {error}", cert.display())))?;
    if chain.is_empty() {
        return Err(at("cert", format!("{} holds no PEM certificate", cert.display())));
    }
    let secret = PrivateKeyDer::from_pem_file(private_key)
        .map_err(|error| at("key", format!("{}: {error}", private_key.display())))?;
    let signer = ring::sign::any_supported_type(&secret)
        .map_err(|error| at("key", format!("{}: {error}", private_key.display())))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|error| {
        at("key", format!("{} does not belong to {}: {error}", private_key.display(), cert.display()))
    })?;
    Ok(Arc::new(certified))
}

/// The certificate for the name a client asks for, or the default one: a client that
/// names no host, or another, still gets an answer it can check.
#[derive(Debug)]
struct ByName {
    default: Arc<CertifiedKey>,
    by_name: HashMap<String, Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ByName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let named = hello.server_name().and_then(|name| self.by_name.get(&name.to_ascii_lowercase()));
        Some(Arc::clone(named.unwrap_or(&self.default)))
    }
}
