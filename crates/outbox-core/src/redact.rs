//! The one redaction function for every URL and connection string the workspace prints:
//! database URLs, broker URLs, webhook URLs, libpq keyword strings.
//!
//! Rules, security first (a mangled message is better than a printed password):
//! - `scheme://user:password@host...`: the password becomes `***`, the user stays. The user
//!   info ends at the **last** `@` of the string, so a password holding a raw `@`, `:`, `/`,
//!   `?` or `=` (`postgres://app:p@ss@db/app`) is masked whole, and percent-encoded ones too.
//!   (A URL with an `@` in its query then shows less than it could; a password never leaks.)
//! - Secret query parameters (`?password=`, `&sslpassword=`, tokens, keys: see
//!   [`is_secret_key`]) have their values replaced by `***`, in URLs and in
//!   `key=value key=value` strings.
//! - Anything else, including text that is not a URL at all, is returned unchanged.

/// Serde `serialize_with` helpers for config fields, so the effective config printed by
/// `outbox check-config` shows `***` wherever a secret was.
pub mod serde_redacted {
    use std::collections::BTreeMap;

    use serde::Serializer;

    /// A URL or connection string, through [`super::redact_url`].
    pub fn url<S: Serializer>(value: &str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::redact_url(value))
    }

    /// An optional URL, through [`super::redact_url`] when set.
    pub fn optional_url<S: Serializer>(value: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_some(&super::redact_url(v)),
            None => s.serialize_none(),
        }
    }

    /// A list of URLs (broker lists), each through [`super::redact_url`].
    pub fn urls<S: Serializer>(values: &[String], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(values.iter().map(|v| super::redact_url(v)))
    }

    /// A value that is secret whatever it holds.
    pub fn secret<S: Serializer, T>(_: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }

    /// A map whose every value may be secret (HTTP headers: `Authorization`, API keys).
    pub fn values<S: Serializer, V>(map: &BTreeMap<String, V>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(map.keys().map(|k| (k, "***")))
    }

    /// A map of settings whose secret keys ([`super::is_secret_key`]) are masked.
    pub fn settings<S: Serializer>(
        map: &BTreeMap<String, String>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(map.iter().map(|(k, v)| {
            (
                k,
                if super::is_secret_key(k) {
                    "***".to_owned()
                } else {
                    super::redact_url(v)
                },
            )
        }))
    }
}

/// A database URL whose password never appears in logs or `Debug` output.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }
    /// The URL with its password, for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

/// Serialized redacted: the effective config `outbox check-config` prints shows `***`.
impl serde::Serialize for DatabaseUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Replaces every secret in `text` (a URL or a `key=value` connection string) with `***`.
pub fn redact_url(text: &str) -> String {
    let (head, rest) = match text.find("://") {
        Some(i) => text.split_at(i + 3),
        None => ("", text),
    };
    let mut out = String::with_capacity(text.len());
    out.push_str(head);
    let rest = if head.is_empty() {
        rest
    } else {
        match rest.rfind('@') {
            Some(at) => {
                let userinfo = &rest[..at];
                match userinfo.split_once(':') {
                    Some((user, _password)) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                &rest[at..]
            }
            None => rest,
        }
    };
    out.push_str(&redact_pairs(rest));
    out
}

/// Whether a query parameter or connection keyword names a secret (case-insensitive):
/// anything containing `password`, `passwd`, `secret`, `token`, `apikey`, `api_key`,
/// `access_key`, `private_key` or `credential`, and exactly `pwd`, `pass`, `auth`, `key`,
/// `sig` and `signature`.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    const CONTAINS: [&str; 9] = [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "access_key",
        "private_key",
        "credential",
    ];
    const EXACT: [&str; 6] = ["pwd", "pass", "auth", "key", "sig", "signature"];
    CONTAINS.iter().any(|c| key.contains(c)) || EXACT.contains(&key.as_str())
}

/// Masks the values of secret `key=value` pairs separated by `?`, `&`, `;` or white space.
fn redact_pairs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut key_start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '?' | '&' | ';' | ' ' | '\t' | '\n' => {
                out.push_str(&text[key_start..i]);
                out.push(c);
                key_start = i + c.len_utf8();
            }
            '=' => {
                let key = &text[key_start..i];
                out.push_str(key);
                out.push('=');
                // The value runs to the next separator.
                let value_start = i + 1;
                let mut value_end = text.len();
                while let Some(&(j, d)) = chars.peek() {
                    if matches!(d, '&' | ';' | ' ' | '\t' | '\n' | '#') {
                        value_end = j;
                        break;
                    }
                    chars.next();
                }
                let value = &text[value_start..value_end];
                if is_secret_key(key.rsplit(['/', '?']).next().unwrap_or(key)) && !value.is_empty()
                {
                    out.push_str("***");
                } else {
                    out.push_str(value);
                }
                key_start = value_end;
            }
            _ => {}
        }
    }
    out.push_str(&text[key_start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_password_of_a_url_is_masked_and_the_user_and_host_kept() {
        assert_eq!(
            redact_url("postgres://app:secret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redact_url("nats://u:p@h:4222"), "nats://u:***@h:4222");
        assert_eq!(redact_url("redis://:tok@h/2"), "redis://:***@h/2");
        assert_eq!(redact_url("amqp://guest@h"), "amqp://guest@h");
        assert_eq!(redact_url("http://h/hook"), "http://h/hook");
    }

    #[test]
    fn a_password_holding_at_colon_or_slash_is_masked_whole() {
        assert_eq!(
            redact_url("postgres://app:p@ss@db/app"),
            "postgres://app:***@db/app"
        );
        assert_eq!(
            redact_url("postgres://app:Pw51@xYz@127.0.0.1:5432/app"),
            "postgres://app:***@127.0.0.1:5432/app"
        );
        assert_eq!(redact_url("mysql://a:b:c/d@h/x"), "mysql://a:***@h/x");
        assert_eq!(redact_url("amqp://u:p?w@h/v"), "amqp://u:***@h/v");
        // An `@` in the query is read as the end of the user info: the message loses the
        // host, but a password holding `@`, `?` and `=` can never leak.
        assert_eq!(redact_url("amqp://u:p@ss@h/v?x=a@b"), "amqp://u:***@b");
        assert_eq!(
            redact_url("postgres://app:p%40ss%3Aw@db/app"),
            "postgres://app:***@db/app"
        );
    }

    #[test]
    fn secret_query_parameters_are_masked() {
        assert_eq!(
            redact_url("postgres://app@db/app?password=hunter2&sslmode=require"),
            "postgres://app@db/app?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://db/app?sslmode=require&sslpassword=k3y"),
            "postgres://db/app?sslmode=require&sslpassword=***"
        );
        assert_eq!(
            redact_url("https://h/hook?api_key=abc&x=1&Token=t"),
            "https://h/hook?api_key=***&x=1&Token=***"
        );
        assert_eq!(
            redact_url("host=db user=app password=hunter2 dbname=app"),
            "host=db user=app password=*** dbname=app"
        );
    }

    #[test]
    fn text_that_is_not_a_url_is_left_alone() {
        assert_eq!(redact_url("outbox.db"), "outbox.db");
        assert_eq!(redact_url("sqlite:outbox.db"), "sqlite:outbox.db");
        assert_eq!(redact_url(""), "");
        assert_eq!(redact_url("@@::://"), "@@::://");
    }

    fn percent_encode(s: &str) -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    proptest! {
        #[test]
        fn no_generated_password_survives_redaction(
            scheme in "(postgres|postgresql|mysql|nats|redis|amqp|https?)",
            user in "[a-z][a-z0-9_]{0,8}",
            password in "[ -~]{4,24}",
            encode in any::<bool>(),
            host in "[a-z]{1,10}(\\.[a-z]{2,5})?",
            port in proptest::option::of(1u16..),
            path in "(/[a-z0-9_]{0,8}){0,2}",
            secret_param in "(password|sslpassword|token|api_key|client_secret)",
            secret in "[A-Za-z0-9]{6,20}",
        ) {
            let shown = if encode { percent_encode(&password) } else { password.clone() };
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let url = format!(
                "{scheme}://{user}:{shown}@{host}{port}{path}?sslmode=require&{secret_param}={secret}"
            );
            let out = redact_url(&url);
            // The masked parts are gone, the host stays.
            prop_assert!(out.contains(&format!("@{host}{port}")), "{out}");
            prop_assert!(out.contains(&format!("{secret_param}=***")), "{out}");
            prop_assert!(!out.contains(&secret), "{out}");
            // No 4-character piece of the password remains that the rest of the URL does
            // not itself contain.
            let rest = format!("{scheme}://{user}:***@{host}{port}{path}?sslmode=require&{secret_param}=***");
            let chars: Vec<char> = shown.chars().collect();
            for w in chars.windows(4) {
                let piece: String = w.iter().collect();
                prop_assert!(!out.contains(&piece) || rest.contains(&piece), "{piece:?} of the password in {out}");
            }
        }
    }
}
