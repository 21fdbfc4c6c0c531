//! TLS set-up shared by the sinks.

/// Chooses rustls' crypto provider (ring) for the process unless one is chosen already. This
/// build links both of rustls' providers (its dependencies enable both), and rustls then
/// refuses to guess: a client built on the process default (NATS, Redis) would panic.
pub(crate) fn choose_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The `tls_ca`, `tls_cert` and `tls_key` keys a sink shares: whether any is set, after
/// checking that the certificate and its key come together and that the URL's scheme is the
/// TLS one (`scheme`, e.g. `rediss://`): files set for a plain URL would be silently unused.
pub(crate) fn files_in_use(
    ca: Option<&std::path::Path>,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
    tls_url: bool,
    scheme: &str,
) -> Result<bool, crate::ConfigError> {
    if cert.is_some() != key.is_some() {
        return Err(crate::ConfigError::new(
            "tls_cert",
            "set `tls_cert` and `tls_key` together (a client certificate and its key)",
        ));
    }
    if ca.is_none() && cert.is_none() {
        return Ok(false);
    }
    if !tls_url {
        return Err(crate::ConfigError::new(
            "tls_ca",
            format!("TLS files are set but `url` is not {scheme}"),
        ));
    }
    Ok(true)
}

/// The contents of the file named by config key `key`; the error names the key and the path.
pub(crate) fn read(key: &str, path: &std::path::Path) -> Result<Vec<u8>, crate::ConfigError> {
    std::fs::read(path)
        .map_err(|e| crate::ConfigError::new(key, format!("cannot read `{}`: {e}", path.display())))
}
