//! NATS authentication set-ups for tests: a user NKey ([`nkey_user`]) for a server that lists
//! users by public key, and operator (decentralised JWT) mode ([`Operator`]): an operator, a
//! system account and JetStream-enabled accounts, their JWTs signed here, and `.creds` files
//! for users of those accounts.
//!
//! The JWTs follow the NATS JWT v2 schema (`nats-io/jwt`): the header
//! `{"typ":"JWT","alg":"ed25519-nkey"}`, claims `jti`, `iat`, `iss`, `sub`, `name` and `nats`
//! (with `type` and `version: 2`), and the issuer's ed25519 signature over
//! `base64url(header).base64url(claims)`, all base64url without padding. A server started with
//! [`Operator::server_config`] (`resolver: MEMORY` with the accounts preloaded) trusts them.
//!
//! ```no_run
//! # fn example() -> anyhow::Result<()> {
//! use outbox_testkit::nats_auth::Operator;
//!
//! let mut operator = Operator::new("test-operator")?;
//! let account = operator.add_account("OUTBOX")?;
//! let creds = account.user_creds("relay")?;            // the text of a `.creds` file
//! let config = operator.server_config();               // for `nats-server -js -c`
//! # Ok(()) }
//! ```

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde_json::{Value, json};

/// A user key pair: its public key (`U...`, what the server lists) and its seed (`SU...`, the
/// secret the client signs with).
#[derive(Clone)]
pub struct NkeyUser {
    /// The public key, `U...`.
    pub public_key: String,
    /// The seed, `SU...`: a secret.
    pub seed: String,
}

impl std::fmt::Debug for NkeyUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NkeyUser")
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

/// A fresh user key pair.
pub fn nkey_user() -> anyhow::Result<NkeyUser> {
    let pair = KeyPair::new_user();
    Ok(NkeyUser {
        public_key: pair.public_key(),
        seed: pair.seed().context("the user key's seed")?,
    })
}

/// The `authorization` block of a server config that admits exactly `users` (by public key).
pub fn nkey_authorization(users: &[&NkeyUser]) -> String {
    let list = users
        .iter()
        .map(|u| format!("{{ nkey: \"{}\" }}", u.public_key))
        .collect::<Vec<_>>()
        .join(", ");
    format!("authorization {{\n  users = [ {list} ]\n}}\n")
}

/// An account of an [`Operator`] (or one no server knows: [`Account::untrusted`]).
pub struct Account {
    key: KeyPair,
    jwt: String,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("public_key", &self.key.public_key())
            .finish_non_exhaustive()
    }
}

impl Account {
    /// The account's public key, `A...`.
    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// The text of a `.creds` file for a new user `name` of this account (no limits, every
    /// subject allowed).
    pub fn user_creds(&self, name: &str) -> anyhow::Result<String> {
        user_creds(self, name)
    }

    /// A JetStream-enabled account signed by an operator of its own, which no server set up
    /// by another [`Operator`] trusts: its users' `.creds` are refused there.
    pub fn untrusted(name: &str) -> anyhow::Result<Account> {
        let mut stranger = Operator::new("stranger")?;
        stranger.add_account(name)
    }
}

/// An operator with a system account, and the accounts it signed; see the module
/// documentation.
pub struct Operator {
    key: KeyPair,
    jwt: String,
    system: Account,
    accounts: Vec<(String, String)>,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("public_key", &self.key.public_key())
            .field("system_account", &self.system.public_key())
            .finish_non_exhaustive()
    }
}

impl Operator {
    /// A new operator and its system account (no JetStream: the server refuses JetStream in
    /// the system account).
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::new_operator();
        let jwt = sign(
            &key,
            &key.public_key(),
            name,
            json!({ "type": "operator", "version": 2 }),
        )?;
        let system_key = KeyPair::new_account();
        let system_jwt = sign(&key, &system_key.public_key(), "SYS", account_claims(false))?;
        let system = Account {
            key: system_key,
            jwt: system_jwt,
        };
        let accounts = vec![(system.public_key(), system.jwt.clone())];
        Ok(Self {
            key,
            jwt,
            system,
            accounts,
        })
    }

    /// A new account with JetStream (no limits), signed by this operator and preloaded into
    /// the server [`server_config`](Self::server_config) describes.
    pub fn add_account(&mut self, name: &str) -> anyhow::Result<Account> {
        let key = KeyPair::new_account();
        let jwt = sign(&self.key, &key.public_key(), name, account_claims(true))?;
        self.accounts.push((key.public_key(), jwt.clone()));
        Ok(Account { key, jwt })
    }

    /// A server config (for `nats-server -c`) in operator mode: this operator trusted, its
    /// accounts preloaded into a memory resolver, the system account named. Pass `-a`/`-p`
    /// and JetStream's `-js -sd DIR` on the command line (a `store_dir` in the file too would
    /// be a duplicate the server refuses).
    pub fn server_config(&self) -> String {
        let preload = self
            .accounts
            .iter()
            .map(|(key, jwt)| format!("  {key}: \"{jwt}\"\n"))
            .collect::<String>();
        format!(
            "operator: \"{}\"\nsystem_account: \"{}\"\nresolver: MEMORY\nresolver_preload: {{\n{preload}}}\n",
            self.jwt,
            self.system.public_key(),
        )
    }
}

/// The text of a `.creds` file for a new user `name` of `account`.
fn user_creds(account: &Account, name: &str) -> anyhow::Result<String> {
    let user = KeyPair::new_user();
    let jwt = sign(
        &account.key,
        &user.public_key(),
        name,
        json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2,
        }),
    )?;
    let seed = user.seed().context("the user key's seed")?;
    Ok(format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    ))
}

/// The `nats` claims of an account: no limits, and JetStream without limits when `jetstream`
/// (an account's JetStream is on when its storage limits are not 0).
fn account_claims(jetstream: bool) -> Value {
    let js = if jetstream { -1 } else { 0 };
    json!({
        "limits": {
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": js, "disk_storage": js, "streams": js, "consumer": js,
        },
        "default_permissions": { "pub": {}, "sub": {} },
        "type": "account",
        "version": 2,
    })
}

/// A JWT for `subject` issued (and signed) by `issuer`.
fn sign(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> anyhow::Result<String> {
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let claims = json!({
        // nats-io/jwt derives it from a hash of the claims; the server only needs it unique.
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": iat,
        "iss": issuer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?);
    let signing_input = format!("{header}.{body}");
    let signature = issuer
        .sign(signing_input.as_bytes())
        .context("signing a JWT")?;
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwt_verifies_with_its_issuers_public_key() -> anyhow::Result<()> {
        let mut operator = Operator::new("op")?;
        let account = operator.add_account("A")?;
        let parts: Vec<&str> = account.jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1])?)?;
        assert_eq!(claims["iss"], operator.key.public_key());
        assert_eq!(claims["sub"], account.public_key());
        assert_eq!(claims["nats"]["type"], "account");
        let verifier = KeyPair::from_public_key(&operator.key.public_key())?;
        verifier.verify(
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
            &URL_SAFE_NO_PAD.decode(parts[2])?,
        )?;
        let creds = account.user_creds("u")?;
        assert!(creds.starts_with("-----BEGIN NATS USER JWT-----\neyJ"));
        assert!(creds.contains("-----BEGIN USER NKEY SEED-----\nSU"));
        Ok(())
    }
}
