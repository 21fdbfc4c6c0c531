//! [`TestCa`]: a throwaway certificate authority and a server certificate for 127.0.0.1 and
//! `localhost`, made with the `openssl` command line tool, for tests of TLS connections.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, ensure};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA and a server certificate it signed (EC P-256, valid two days), as PEM files in one
/// directory.
#[derive(Debug, Clone)]
pub struct TestCa {
    /// The CA's certificate: what a client trusts (`sslrootcert`, `ca_file`).
    pub ca_cert: PathBuf,
    /// The server's certificate, for `localhost` and `127.0.0.1`.
    pub server_cert: PathBuf,
    /// The server certificate's private key (unencrypted).
    pub server_key: PathBuf,
    /// A client certificate (CN `outbox-relay`), for servers that verify clients.
    pub client_cert: PathBuf,
    /// The client certificate's private key (unencrypted).
    pub client_key: PathBuf,
}

/// Chooses rustls' crypto provider for the test process (its dependencies enable two, so
/// rustls cannot pick one by itself). Call before a test's own TLS client connects.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl TestCa {
    /// Creates `dir` and writes `ca.pem`, `ca.key`, `server.pem`, `server.key`, `client.pem`
    /// and `client.key` into it.
    pub fn generate(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = |name: &str| dir.join(name);
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            Command::new("openssl")
                .args(["req", "-x509"])
                .args(ec)
                .args(["-days", "2", "-subj", "/CN=outbox test CA"])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
                .arg("-keyout")
                .arg(path("ca.key"))
                .arg("-out")
                .arg(path("ca.pem")),
        )?;
        for (name, subject, extensions) in [
            (
                "server",
                "/CN=localhost",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "client",
                "/CN=outbox-relay",
                "extendedKeyUsage=clientAuth\n",
            ),
        ] {
            let file = |ext: &str| path(&format!("{name}.{ext}"));
            openssl(
                Command::new("openssl")
                    .arg("req")
                    .args(ec)
                    .args(["-subj", subject])
                    .arg("-keyout")
                    .arg(file("key"))
                    .arg("-out")
                    .arg(file("csr")),
            )?;
            std::fs::write(
                file("ext"),
                format!(
                    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"
                ),
            )?;
            openssl(
                Command::new("openssl")
                    .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
                    .arg("-in")
                    .arg(file("csr"))
                    .arg("-CA")
                    .arg(path("ca.pem"))
                    .arg("-CAkey")
                    .arg(path("ca.key"))
                    .arg("-extfile")
                    .arg(file("ext"))
                    .arg("-out")
                    .arg(file("pem")),
            )?;
        }
        Ok(Self {
            ca_cert: path("ca.pem"),
            server_cert: path("server.pem"),
            server_key: path("server.key"),
            client_cert: path("client.pem"),
            client_key: path("client.key"),
        })
    }
}

fn openssl(command: &mut Command) -> anyhow::Result<()> {
    let out = command
        .output()
        .context("running `openssl` (Debian package openssl)")?;
    ensure!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A TLS terminator on a free port of 127.0.0.1 in front of a plain TCP server (e.g. an
/// [`HttpReceiver`](crate::services::HttpReceiver)): it presents the server certificate of a
/// [`TestCa`], requires a client certificate that CA signed, and relays the bytes. Stops on
/// drop.
#[derive(Debug)]
pub struct TlsFront {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    /// Starts terminating TLS for `target`.
    pub async fn start(ca: &TestCa, target: SocketAddr) -> anyhow::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_file_iter(&ca.server_cert)?
            .collect::<Result<Vec<_>, _>>()
            .context("reading the server certificate")?;
        let key = PrivateKeyDer::from_pem_file(&ca.server_key).context("reading the server key")?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(&ca.ca_cert).context("reading the CA")?)?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&provider),
        )
        .build()?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)?;
        Self::relay(config, target).await
    }

    /// `https://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Like [`TlsFront::start`], but asks for no client certificate: TLS as most brokers use
    /// it, with the client authenticating otherwise (SASL) or not at all. Relays the raw bytes,
    /// so it fronts any TCP protocol (a Kafka broker, for one).
    pub async fn start_without_client_auth(
        ca: &TestCa,
        target: SocketAddr,
    ) -> anyhow::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_file_iter(&ca.server_cert)?
            .collect::<Result<Vec<_>, _>>()
            .context("reading the server certificate")?;
        let key = PrivateKeyDer::from_pem_file(&ca.server_key).context("reading the server key")?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        Self::relay(config, target).await
    }

    /// Accepts TLS on a free port of 127.0.0.1 with `config` and relays the plain bytes to
    /// `target`. A refused handshake (no, or a foreign, client certificate; a client that does
    /// not trust the CA) just ends its connection.
    async fn relay(config: rustls::ServerConfig, target: SocketAddr) -> anyhow::Result<Self> {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The address the front listens on (127.0.0.1 and a free port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
