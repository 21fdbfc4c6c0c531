//! TLS set-up shared by the sinks.

/// Chooses rustls' crypto provider (ring) for the process unless one is chosen already. This
/// build links both of rustls' providers (its dependencies enable both), and rustls then
/// refuses to guess: a client built on the process default (NATS, Redis) would panic.
pub(crate) fn choose_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
